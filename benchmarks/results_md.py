"""RESULTS.md, one ``## Section`` per benchmark: each script replaces its own section only."""

from __future__ import annotations

import re
from pathlib import Path

RESULTS = Path(__file__).with_name("RESULTS.md")


def write_section(title: str, section: str, results: Path = RESULTS) -> None:
    """Replace (or append) the section headed ``## title``, leaving the rest alone.

    ``section`` is the whole section text, heading included. Written to a temp file,
    then renamed, so an interrupted write never leaves half a file.
    """
    text = results.read_text() if results.exists() else "# Benchmark results\n"
    pattern = re.compile(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", re.DOTALL | re.MULTILINE)
    if pattern.search(text):
        text = pattern.sub(lambda _: section.rstrip("\n") + "\n\n", text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + section
    staging = results.with_suffix(".md.tmp")
    staging.write_text(text.rstrip("\n") + "\n")
    staging.replace(results)
