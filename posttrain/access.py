"""Who is calling a server: one shared token, or a tokens file of named people.

A tokens file (``--tokens FILE`` on ``posttrain ui`` and ``posttrain serve``) is a JSON
object from a person's name to their token::

    {"alice": "tok-7f3a...", "bob": "tok-c2e1..."}

A request carrying one of those tokens is that person's: what it creates (a run, a
training client) records the name, every run can be read, and only one's own can be
deleted. The single ``--token`` keeps working beside it, for an administrator: a request
with it (or to a server with no credentials at all) may delete anything, as before.
"""

from __future__ import annotations

import hmac
import json
import re
from collections.abc import Mapping
from pathlib import Path

from posttrain.errors import PosttrainError

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")
MIN_TOKEN_CHARS = 16


def load_tokens(path: str | Path, admin_token: str | None = None) -> dict[str, str]:
    """The tokens file at ``path`` as ``{token: name}``; ``PosttrainError`` naming the file
    and the entry for anything else (not JSON, a bad name, a short or repeated token, or
    the administrator's ``--token``: whoever holds a person's token would otherwise
    silently be the administrator)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise PosttrainError(f"--tokens {path}: cannot read it ({error.strerror or error})"
                             ) from None
    except ValueError as error:
        raise PosttrainError(f"--tokens {path}: not a JSON object of name -> token ({error})"
                             ) from None
    if not isinstance(data, dict) or not data:
        raise PosttrainError(f'--tokens {path}: expected a JSON object of name -> token, '
                             f'e.g. {{"alice": "<a long random token>"}}')
    by_token: dict[str, str] = {}
    for name, token in data.items():
        if not NAME.fullmatch(name):
            raise PosttrainError(f"--tokens {path}: name {name!r}: use letters, digits and "
                                 f"_ . @ - (at most 64 characters)")
        if not isinstance(token, str) or len(token) < MIN_TOKEN_CHARS \
                or any(ch.isspace() for ch in token):
            raise PosttrainError(f"--tokens {path}: {name}'s token must be a string of at "
                                 f"least {MIN_TOKEN_CHARS} characters without spaces")
        if token in by_token:
            raise PosttrainError(f"--tokens {path}: {name} and {by_token[token]} share a "
                                 f"token; give each their own")
        if admin_token is not None and hmac.compare_digest(token.encode(),
                                                           admin_token.encode()):
            raise PosttrainError(f"--tokens {path}: {name}'s token is also the administrator's "
                                 "--token, which may delete any run; give the administrator "
                                 "a token of their own")
        by_token[token] = name
    return by_token


def presented_token(headers: Mapping[str, str]) -> str | None:
    """The token a request carries: ``Authorization: Bearer <t>`` or ``X-API-Key: <t>``."""
    bearer = headers.get("authorization", "")
    if bearer.startswith("Bearer "):
        return bearer[len("Bearer "):]
    key = headers.get("x-api-key", "")
    return key or None


class Caller:
    """Who sent a request: ``name`` (from the tokens file), or None for the administrator
    (the single ``--token``) and for a server without credentials."""

    def __init__(self, name: str | None) -> None:
        self.name = name

    @property
    def restricted(self) -> bool:
        """Does this caller delete only what it created?"""
        return self.name is not None

    def may_delete(self, owner: str | None) -> bool:
        """May this caller delete something ``owner`` created?"""
        return self.may_change(owner)

    def may_change(self, owner: str | None) -> bool:
        """May this caller write to, replace or delete something ``owner`` created? Only
        the administrator, or the name that created it."""
        return not self.restricted or owner == self.name


def made_by(owner: str | None) -> str:
    """Who made something, for a refusal: ``created by <name>``, or that no tokens-file
    name did (the administrator, or a server without named tokens)."""
    return f"created by {owner}" if owner else "not created with a token of the tokens file"


ADMIN = Caller(None)
#: a request without a valid token where credentials exist (a read left open): it may
#: delete nothing
NOBODY = Caller("")


def identify(headers: Mapping[str, str], token: str | None,
             tokens: Mapping[str, str] | None) -> Caller | None:
    """The caller a request's headers prove, or None when they prove none (a wrong or
    missing token). With no credentials configured everyone is the administrator."""
    if token is None and not tokens:
        return ADMIN
    presented = presented_token(headers)
    if presented is None:
        return None
    if token is not None and hmac.compare_digest(presented.encode(), token.encode()):
        return ADMIN
    for candidate, name in (tokens or {}).items():
        if hmac.compare_digest(presented.encode(), candidate.encode()):
            return Caller(name)
    return None
