"""Printed text is data: control characters from environments, servers, files and models
are shown escaped, never sent raw to a terminal or a log.

An environment's category, a server's error, a prompt or a model's reply can hold escape
sequences: ``ESC ] 0 ; title BEL`` sets the terminal's title, ``ESC [ 2 J`` clears the
screen, ``ESC [ 31 m`` paints what follows red (a fake verdict), a carriage return in the
middle of a line writes over its start, and the bidirectional overrides (U+202E...)
show text in another order than it is stored. ``printable(text)`` writes each such
character as its escape (``\\x1b``, ``\\u202e``), so it is seen and does nothing.

``escaped_output()`` applies it to everything a command prints: ``posttrain.cli.main``
runs every command inside it, so no printer can forget it (its own messages, a library's
warnings, an argparse error quoting a flag's value). Two things pass: a newline and a
tab, and a carriage return that begins a write (a progress line redrawing itself, as
tqdm's do). posttrain's own terminal drawing (rich's bars and tables) writes to the
stream underneath (``raw_stream``); rich itself strips control characters from the text
it is given.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

#: every C0 control but tab and newline, DEL, every C1 control, and the bidirectional
#: embeddings, overrides and isolates
_CONTROLS = ([code for code in range(0x20) if code not in (0x09, 0x0A)] + [0x7F]
             + list(range(0x80, 0xA0)) + list(range(0x202A, 0x202F))
             + list(range(0x2066, 0x206A)))
_ESCAPES = {code: (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
            for code in _CONTROLS}


def printable(text: str) -> str:
    """``text`` with every control character written as its escape (module docstring)."""
    return text.translate(_ESCAPES)


class EscapingStream:
    """A text stream that writes ``printable`` text to ``stream`` (a carriage return that
    begins a write passes: a progress line redrawing itself)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        if text.startswith("\r"):
            self.stream.write("\r" + printable(text[1:]))
        else:
            self.stream.write(printable(text))
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:  # flush, isatty, fileno, encoding, ...
        return getattr(self.stream, name)


def raw_stream(stream: Any) -> Any:
    """The stream under ``stream``'s escaping, for posttrain's own terminal drawing."""
    return stream.stream if isinstance(stream, EscapingStream) else stream


@contextmanager
def escaped_output() -> Iterator[None]:
    """Run the body with ``sys.stdout`` and ``sys.stderr`` escaping control characters
    (nested uses, a command calling another, wrap once); the streams are put back after."""
    saved = sys.stdout, sys.stderr
    if not isinstance(sys.stdout, EscapingStream):
        sys.stdout = EscapingStream(sys.stdout)  # type: ignore[assignment]
    if not isinstance(sys.stderr, EscapingStream):
        sys.stderr = EscapingStream(sys.stderr)  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
