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


def cpu_description() -> str:
    """The CPU a result was measured on: model name, vector extensions, cores, e.g.
    ``AMD EPYC (AVX-512, no AMX), 2 cores``; float rounding, and so a starter build,
    depends on it."""
    import os
    import platform

    model, flags = platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    vector = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    amx = "AMX" if "amx_tile" in flags else "no AMX"
    return f"{model} ({vector}, {amx}), {os.cpu_count()} cores"
