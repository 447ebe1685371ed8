"""Run store write throughput: points per second into SQLite and PostgreSQL, with one
writer and with eight writer processes at once (eight runs training side by side, as a
team's shared store sees them).

Each writer is its own process and writes one run the way a recipe does: a
``RunHandle`` from ``open_run``, one ``log`` per step with ``--metrics`` values (a point
is one value of one metric at one step), its ``metrics.jsonl`` copy included, every step
committed before the next. The PostgreSQL server is started here (initdb in a temp
folder, as the test suite does; ``fsync`` on, the server's defaults otherwise). The time
is from the writers' start until the last one finished; median of ``--repeats``.

    .venv/bin/python benchmarks/store_writes.py            # 3 repeats
    .venv/bin/python benchmarks/store_writes.py --write    # also update RESULTS.md
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path

from results_md import cpu_description, write_section  # benchmarks/ is the script's folder

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from posttrain.runs.postgres_store import PostgresRunStore
from posttrain.runs.sqlite_store import SqliteRunStore
from posttrain.runs.store import open_run
from tests.postgres_server import start_server  # the suite's own server

SECTION = "Run store writes"


def write_one_run(store_spec: str, runs_root: str, name: str, steps: int, metrics: int,
                  start: multiprocessing.synchronize.Event) -> None:
    names = [f"metric_{index}" for index in range(metrics)]
    start.wait()
    run = open_run(name, {"recipe": "bench"}, run_dir=Path(runs_root) / name,
                   runs_root=runs_root, store_url=store_spec, heartbeat_seconds=None)
    for step in range(steps):
        run.log(step, {metric: step * 0.001 + index for index, metric in enumerate(names)})
    run.finish({"steps": steps})


def one_measurement(store_spec: str, runs_root: str, writers: int, steps: int,
                    metrics: int) -> float:
    """Points per second of ``writers`` processes writing at once into ``store_spec``."""
    context = multiprocessing.get_context("spawn")
    start = context.Event()
    processes = [context.Process(target=write_one_run, args=(
        store_spec, runs_root, f"run-{index}", steps, metrics, start)) for index in range(writers)]
    for process in processes:
        process.start()
    time.sleep(3.0)  # every process imported posttrain and waits on the event
    began = time.perf_counter()
    start.set()
    for process in processes:
        process.join()
        if process.exitcode != 0:
            raise SystemExit(f"a writer failed (exit {process.exitcode})")
    elapsed = time.perf_counter() - began
    return writers * steps * metrics / elapsed


def check_complete(store, writers: int, steps: int) -> None:
    runs = store.list_runs()
    assert len(runs) == writers, runs
    for run in runs:
        assert store.metric_series(run["name"], "metric_0")["count"] == steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="measurements per cell (median)")
    parser.add_argument("--steps", type=int, default=400, help="steps each writer logs")
    parser.add_argument("--metrics", type=int, default=8, help="values logged per step")
    parser.add_argument("--write", action="store_true", help="update benchmarks/RESULTS.md")
    args = parser.parse_args()
    server = start_server(durable=True)
    cells: dict[tuple[str, int], list[float]] = {}
    try:
        for repeat in range(args.repeats):
            for writers in (1, 8):
                with tempfile.TemporaryDirectory() as scratch:
                    sqlite_file = str(Path(scratch) / "posttrain.db")
                    rate = one_measurement(sqlite_file, scratch, writers, args.steps,
                                           args.metrics)
                    with SqliteRunStore(sqlite_file) as store:
                        check_complete(store, writers, args.steps)
                    cells.setdefault(("SQLite", writers), []).append(rate)
                    url = server.new_database()
                    rate = one_measurement(url, scratch, writers, args.steps, args.metrics)
                    with PostgresRunStore(url) as store:
                        check_complete(store, writers, args.steps)
                    cells.setdefault(("PostgreSQL", writers), []).append(rate)
            print(f"repeat {repeat + 1}: " + ", ".join(
                f"{backend} x{count}: {rates[-1]:,.0f} points/s"
                for (backend, count), rates in cells.items()), flush=True)
    finally:
        server.stop("fast")
    command = (f".venv/bin/python benchmarks/store_writes.py --repeats {args.repeats} "
               f"--steps {args.steps} --metrics {args.metrics}")
    lines = [f"## {SECTION}", "",
             f"Points per second written through `open_run(...).log` (one commit per step, "
             f"{args.metrics} values per step, {args.steps} steps per run), median of "
             f"{args.repeats}; {cpu_description()}; PostgreSQL 15 on the same machine over "
             f"127.0.0.1. `{command}`", "",
             "| store | 1 writer | 8 writers at once | 8 writers vs 1 "
             "| vs SQLite (1 / 8 writers) |",
             "|---|---|---|---|---|"]
    baseline = {count: statistics.median(cells[("SQLite", count)]) for count in (1, 8)}
    for backend in ("SQLite", "PostgreSQL"):
        one = statistics.median(cells[(backend, 1)])
        eight = statistics.median(cells[(backend, 8)])
        lines.append(f"| {backend} | {one:,.0f} | {eight:,.0f} | {eight / one:.2f}x | "
                     f"{one / baseline[1]:.2f}x / {eight / baseline[8]:.2f}x |")
    section = "\n".join(lines) + "\n"
    print(section)
    if args.write:
        write_section(SECTION, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
