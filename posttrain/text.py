"""Text helpers every floor may use: folding and word-set similarity of prompts, and
the short form of a value that an error message may echo.

They sit below the environments because a rule's own prompt writer dedupes and
filters with the same measures the data layer uses on any prompt file.
"""

from __future__ import annotations

import re
import reprlib
from typing import Any

_WORD = re.compile(r"[a-z0-9]+")


def slug(text: str, limit: int = 40) -> str:
    """``text`` as a folder-safe name: lower case, runs of anything but letters and digits
    as one ``-`` (``"My rule/v2"`` -> ``"my-rule-v2"``); "" when nothing is left."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:limit].strip("-")


def folded(text: str) -> str:
    """A text with case and whitespace folded: two prompts that differ only so are one."""
    return " ".join(text.lower().split())


def word_set(text: str) -> frozenset[str]:
    """Lower-case alphanumeric word tokens of a text."""
    return frozenset(_WORD.findall(text.lower()))


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    """Jaccard similarity of two word sets (1.0 for two empty sets)."""
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


def _short_repr() -> reprlib.Repr:
    short = reprlib.Repr()  # Python 3.11's takes no keyword arguments
    short.maxlevel, short.maxlist, short.maxdict = 2, 4, 4
    short.maxstring = short.maxother = 60
    return short


_SHORT = _short_repr()


def echo(value: Any) -> str:
    """``repr(value)`` cut short: what an error may quote of input it refuses. A query
    parameter, a config value or a YAML alias bomb can be huge; the message stays a line."""
    return _SHORT.repr(value)


def error_line(error: BaseException) -> str:
    """An exception's first line of text (its type's name when it has none): a driver's
    multi-line message, cut to what fits in one line of an error."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def short_line(error: BaseException, limit: int = 200) -> str:
    """``error_line`` cut to ``limit`` characters: what a message may quote of an error
    raised by someone else's code (a user's hook can raise with a page of text)."""
    line = error_line(error)
    return line if len(line) <= limit else line[:limit - 3] + "..."


def json_kind(value: Any) -> str:
    """What a JSON value is, in words, for a message refusing it ("an object", "a list",
    "a string", "a number", "a boolean", "null")."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return {dict: "an object", list: "a list", str: "a string"}.get(type(value),
                                                                     type(value).__name__)
