"""Errors that mean "the user's input is wrong", as opposed to a bug.

The CLI prints these as one line (no traceback) and exits with status 2.
Each message says what was wrong, where, and what to do.
"""

from __future__ import annotations


class PosttrainError(Exception):
    """A problem with the user's input or set-up, explained in the message.

    ``http_status``: what an HTTP server answers when a handler raises one and nothing
    nearer maps it (a damaged run store: 503; None: not an answer, a bug: 500).
    """

    http_status: int | None = None


class InputFileError(PosttrainError, ValueError):
    """A bad line or field in an input file.

    ``str(error)`` reads ``path:line: field: what was expected``.
    """

    def __init__(self, path: str, line: int | None, field: str | None, problem: str):
        self.path, self.line, self.field, self.problem = str(path), line, field, problem
        where = self.path if line is None else f"{self.path}:{line}"
        what = problem if field is None else f"field {field!r}: {problem}"
        super().__init__(f"{where}: {what}")
