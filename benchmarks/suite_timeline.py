"""Where the test suite's time goes: a pytest plugin that writes every test's start and end,
one file per worker, and a summary of those files.

    PYTHONPATH=benchmarks SUITE_TIMELINE=/tmp/timeline bash scripts/test.sh -p suite_timeline
    .venv/bin/python benchmarks/suite_timeline.py /tmp/timeline

The summary gives each worker's span (first test's start to last test's end) and busy time
(the sum of its tests), and the files by their seconds: the figures behind
``tests/file_order.py`` and the suite rows of benchmarks/RESULTS.md. Then the files by the
CPU seconds their tests used (``<worker>.cpu``: the worker's own and its children's user +
system time; a child counts when it is waited for, so a server a fixture starts counts
for the test that stops it): on 2 cores the suite cannot end before its CPU seconds / 2.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any


class Timeline:
    """Appends ``start end nodeid`` for every test this process runs to ``folder/<worker>.txt``
    (``main`` without pytest-xdist)."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        self.started: dict[str, tuple[float, float]] = {}

    def pytest_runtest_logstart(self, nodeid: str, location: object) -> None:
        self.started[nodeid] = (time.time(), cpu_seconds())

    def pytest_runtest_logfinish(self, nodeid: str, location: object) -> None:
        start, cpu_start = self.started.pop(nodeid, (time.time(), cpu_seconds()))
        with open(self.folder / f"{self.worker}.txt", "a") as timeline:
            timeline.write(f"{start:.2f} {time.time():.2f} {nodeid}\n")
        with open(self.folder / f"{self.worker}.cpu", "a") as cpu:
            cpu.write(f"{cpu_seconds() - cpu_start:.2f} {nodeid}\n")


def cpu_seconds() -> float:
    """User + system seconds of this process and of its children waited for so far."""
    own, children = (resource.getrusage(resource.RUSAGE_SELF),
                     resource.getrusage(resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def pytest_sessionstart(session: Any) -> None:
    # pytest-xdist's controller ("dsession", registered by then) hears of every worker's
    # tests too: only the processes that run tests record them
    config = session.config
    if config.pluginmanager.hasplugin("dsession"):
        return
    folder = Path(os.environ.get("SUITE_TIMELINE", "suite-timeline"))
    folder.mkdir(parents=True, exist_ok=True)
    config.pluginmanager.register(Timeline(folder), "suite_timeline_recorder")


def summarize(folder: Path, top: int = 30) -> str:
    """Each worker's span and busy seconds, then the ``top`` files by seconds."""
    lines, per_file = [], defaultdict(float)
    for path in sorted(folder.glob("*.txt")):
        spans = [line.split(" ", 2) for line in path.read_text().splitlines() if line]
        if not spans:
            continue
        starts, ends = [float(s) for s, _, _ in spans], [float(e) for _, e, _ in spans]
        busy = sum(end - start for start, end in zip(starts, ends, strict=True))
        lines.append(f"{path.stem}: span {max(ends) - min(starts):.0f} s, busy {busy:.0f} s, "
                     f"{len(spans)} tests")
        for start, end, (_, _, nodeid) in zip(starts, ends, spans, strict=True):
            per_file[nodeid.split("::", 1)[0]] += end - start
    lines += _longest(per_file, top, "s ")
    cpu_per_file = defaultdict(float)
    for path in sorted(folder.glob("*.cpu")):
        for line in path.read_text().splitlines():
            seconds, nodeid = line.split(" ", 1)
            cpu_per_file[nodeid.split("::", 1)[0]] += float(seconds)
    if cpu_per_file:
        lines.append(f"CPU seconds of the tests: {sum(cpu_per_file.values()):.0f}")
        lines += _longest(cpu_per_file, top, "s CPU ")
    return "\n".join(lines)


def _longest(per_file: dict[str, float], top: int, unit: str) -> list[str]:
    """The ``top`` files by seconds, a line each: ``seconds unit file``."""
    ranked = sorted(per_file.items(), key=lambda item: -item[1])[:top]
    return [f"{seconds:7.1f} {unit} {name}" for name, seconds in ranked]


if __name__ == "__main__":
    print(summarize(Path(sys.argv[1] if len(sys.argv) > 1 else "suite-timeline")))
