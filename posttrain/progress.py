"""Progress bars for long work, on stderr so stdout stays clean for results.

``progress_bar(label, total)`` is a context manager yielding ``update(done)``.
It draws a rich bar (with rate and ETA) on a terminal and prints a few plain
milestone lines otherwise (CI logs, pipes) once the work has taken a second,
so long work is never silent and quick work is not noisy. Each update is also a checkpoint
for a Ctrl-C that Python could not raise where it landed (``posttrain.interrupts``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from posttrain.interrupts import raise_if_interrupted
from posttrain.terminal import printable, raw_stream

Update = Callable[[int], None]


@contextmanager
def progress_bar(label: str, total: int, *, enabled: bool = True) -> Iterator[Update]:
    """Show progress of ``total`` units of work; yields ``update(done_so_far)``."""
    if not enabled or total <= 0:
        yield lambda done: raise_if_interrupted()
        return
    if sys.stderr.isatty():
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
        )
        from rich.console import Console
        from rich.markup import escape

        # drawn on the terminal itself: the bar's own codes are not data to escape
        # (rich strips control characters from the label)
        console = Console(file=raw_stream(sys.stderr))
        with Progress(*columns, console=console, transient=False) as bar:
            task = bar.add_task(escape(printable(label)), total=total)

            def draw(done: int) -> None:
                raise_if_interrupted()
                bar.update(task, completed=done)

            yield draw
        return
    started = time.monotonic()
    next_mark = [0.25]

    def update(done: int) -> None:
        raise_if_interrupted()
        fraction = done / total
        elapsed = time.monotonic() - started
        if elapsed >= 1.0 and fraction >= next_mark[0]:  # quick work stays quiet
            eta = elapsed / fraction - elapsed if fraction > 0 else 0.0
            print(
                f"{label}: {done}/{total} ({fraction:.0%}), {elapsed:.0f}s elapsed, "
                f"eta {eta:.0f}s",
                file=sys.stderr,
                flush=True,
            )
            while next_mark[0] <= fraction:
                next_mark[0] += 0.25

    yield update
