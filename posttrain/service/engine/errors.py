"""Errors the primitives service answers with: an HTTP status and a message that says what to do.

Raised anywhere in the engine or the request parsing; the HTTP layer turns them into
``{"error": {"status": ..., "message": ...}}`` with that status. Anything else that escapes
is a bug and is answered 500 (the server keeps serving).
"""

from __future__ import annotations


class ServiceError(Exception):
    """A refused request: ``status`` is the HTTP status, ``message`` says what was wrong."""

    status = 400

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status


class BadRequest(ServiceError):
    """The body is malformed or a value is out of range (400)."""

    status = 400


class Unauthorized(ServiceError):
    """Missing or wrong bearer token (401)."""

    status = 401


class Forbidden(ServiceError):
    """The caller's token did not create the session or run it wants to change (403)."""

    status = 403


class NotFound(ServiceError):
    """No such session, run, operation or state (404)."""

    status = 404


class Conflict(ServiceError):
    """The request clashes with what happened before: a reused sequence number with another
    payload, a run that is no longer active, a closed session (409)."""

    status = 409


class Damaged(ServiceError):
    """A run's record on disk cannot be read (409): the run exists, and is served again
    once its file is fixed or removed and the server restarted."""

    status = 409


class TooLarge(ServiceError):
    """The body or one of its lists is over a published limit (413)."""

    status = 413


class TooManyRequests(ServiceError):
    """A run's queue or the server's run table is full (429); retry later."""

    status = 429


def hide_folders(text: str, folders: dict[str, str]) -> str:
    """``text`` with every absolute folder in ``folders`` replaced by its public name
    (longest folder first, so a folder inside another is named by the nearer one).

    What an exception says (``No such file or directory: /home/.../runs/x/...``) reaches
    clients in failed operations and 500s; the server's layout must not (docs/security.md)."""
    for folder in sorted(folders, key=len, reverse=True):
        if folder:
            text = text.replace(folder, folders[folder])
    return text
