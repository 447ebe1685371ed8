"""Dashboard speed: how long the run page takes to draw a run of 100,000 points per curve,
and how long the JSON API takes to answer what the page asks for.

The run (``posttrain.ui.demo_runs.write_long_run``) has 100,000 steps of the seven
training curves and the monitor's three curves every 10 steps, an alarm and a summary.
The dashboard server runs in its own process, as ``posttrain ui`` does. The page is
loaded ``--runs`` times in headless Chromium (Debian's /usr/bin/chromium, driven by
Playwright), each time in a fresh tab; the draw time is the page's own mark: from the
start of navigation until every chart has drawn its curves (``data-draw-ms``). The API
calls are timed from Python, median of ``--runs``.

    .venv/bin/python benchmarks/dashboard.py            # 5 runs
    .venv/bin/python benchmarks/dashboard.py --write    # also update RESULTS.md
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from results_md import write_section  # benchmarks/ is the script's folder

from posttrain.runs.sqlite_store import SqliteRunStore
from posttrain.ui.demo_runs import write_long_run

SECTION = "Dashboard"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
RUN = "long-run"
# what the run page asks for on its first load (the charts this run has, 1,000 points each)
PAGE_CURVES = ("reward,reward_std,kl,completion_length,loss,monitor/proxy_reward,"
               "monitor/length,monitor/pass_at_1")
SERVER_MAIN = (
    "import sys\n"
    "from posttrain.ui.app import dashboard_server\n"
    "server = dashboard_server(sys.argv[1], '127.0.0.1', 0)\n"
    "print(server.server_address[1], flush=True)\n"
    "server.serve_forever()\n"
)


def start_server(database: Path) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen([sys.executable, "-c", SERVER_MAIN, str(database)],
                               stdout=subprocess.PIPE, text=True)
    port = int(process.stdout.readline())
    return process, f"http://127.0.0.1:{port}"


def time_get(url: str, runs: int) -> tuple[float, int]:
    """(median seconds, bytes) of ``runs`` GETs of ``url``."""
    seconds = []
    size = 0
    for _ in range(runs):
        started = time.perf_counter()
        with urllib.request.urlopen(url, timeout=60) as response:
            size = len(response.read())
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds), size


def python_thinned(database: Path, metric: str, max_points: int) -> int:
    """The read path before curves were thinned inside SQLite, kept here as the baseline:
    every row of the curve into Python, then each bucket's min and max with numpy."""
    import sqlite3

    import numpy as np

    connection = sqlite3.connect(database)
    try:
        rows = connection.execute(
            "SELECT step, value, time FROM metrics WHERE run = ? AND name = ? ORDER BY step",
            (RUN, metric)).fetchall()
    finally:
        connection.close()
    values = np.asarray([row[1] for row in rows], dtype=float)
    buckets = (max_points - 2) // 2
    edges = np.linspace(1, len(values) - 1, buckets + 1).astype(int)
    keep = [0]
    for start, stop in itertools.pairwise(edges):
        if stop > start:
            chunk = values[start:stop]
            keep += sorted({start + int(np.argmin(chunk)), start + int(np.argmax(chunk))})
    keep.append(len(values) - 1)
    return len([rows[index] for index in keep])


def time_read_paths(database: Path, runs: int) -> dict[str, float]:
    """Median seconds to read the page's 8 curves thinned to 1,000 points, in-process:
    the old path (every row into Python) and the store's (its tiles)."""
    curves = PAGE_CURVES.split(",")
    store = SqliteRunStore(database)
    timings: dict[str, list[float]] = {"python": [], "sql": []}
    try:
        for _ in range(runs):
            started = time.perf_counter()
            for metric in curves:
                python_thinned(database, metric, 1000)
            timings["python"].append(time.perf_counter() - started)
            started = time.perf_counter()
            for metric in curves:
                store.metric_series(RUN, metric, max_points=1000)
            timings["sql"].append(time.perf_counter() - started)
    finally:
        store.close()
    return {key: statistics.median(values) for key, values in timings.items()}


def time_page(base: str, runs: int) -> dict[str, list[float]]:
    """Per load: total draw time and the time spent waiting for the curves, in ms."""
    from playwright.sync_api import sync_playwright

    timings: dict[str, list[float]] = {"draw": [], "curves": []}
    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        for _ in range(runs):
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(f"{base}/runs/{RUN}")
            page.wait_for_selector("html[data-ready]", timeout=60_000)
            timings["draw"].append(float(page.get_attribute("html", "data-draw-ms")))
            timings["curves"].append(page.evaluate(
                "() => { const r = performance.getEntriesByType('resource')"
                ".filter((e) => e.name.includes('/metrics'));"
                " return Math.max(...r.map((e) => e.responseEnd - e.startTime)); }"))
            page.close()
        browser.close()
    return timings


def markdown(api: dict[str, tuple[float, int]], page: dict[str, list[float]], command: str,
             load: str, runs: int, reads: dict[str, float]) -> str:
    draw = statistics.median(page["draw"])
    curves = statistics.median(page["curves"])
    lines = [
        f"## {SECTION}",
        "",
        f"Command: `{command}`. Machine: {platform.machine()}, {os.cpu_count()} CPU cores "
        f"(load average {load} at the start), no GPU; "
        f"Python {platform.python_version()}, Debian's Chromium headless. Median of {runs}.",
        "",
        "A run with 100,000 steps of 7 training curves and the monitor's 3 curves every 10 "
        "steps. The server thins each curve to at most 1,000 points (each bucket's min "
        "and max, read from the curve's tiles), so the page draws the same amount whatever "
        "the run's length.",
        "",
        "| what | median | per load |",
        "|---|---|---|",
        f"| run page, navigation to every chart drawn (target 0.5 s) | **{draw / 1000:.2f} s** | "
        f"{', '.join(f'{value / 1000:.2f}' for value in page['draw'])} s |",
        f"| of which waiting for the curves (one request) | {curves / 1000:.2f} s | "
        f"{', '.join(f'{value / 1000:.2f}' for value in page['curves'])} s |",
        "",
        "| API call | median | answer |",
        "|---|---|---|",
    ]
    for label, (seconds, size) in api.items():
        lines.append(f"| {label} | {seconds * 1000:.0f} ms | {size / 1024:.1f} KiB |")
    lines += [
        "",
        "The read path, in-process, the page's 8 curves of 100,000 points thinned to 1,000 "
        "(same database, same run of the benchmark):",
        "",
        "| read path | median | ratio |",
        "|---|---|---|",
        f"| before: every row into Python, min/max per bucket in numpy | "
        f"{reads['python'] * 1000:.0f} ms | 1.00 |",
        f"| now: from the curve's tiles (min and max point per 64 steps, kept on write) | "
        f"{reads['sql'] * 1000:.0f} ms | {reads['sql'] / reads['python']:.2f} |",
        "",
        "Polling while a run trains asks only for points after the last step drawn "
        "(`after=`), a few rows per curve.",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="loads / calls to take the median of")
    parser.add_argument("--points", type=int, default=100_000, help="steps in the run")
    parser.add_argument("--write", action="store_true", help="update benchmarks/RESULTS.md")
    args = parser.parse_args()
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    with tempfile.TemporaryDirectory(prefix="posttrain-dashboard-bench-") as folder:
        database = Path(folder) / "posttrain.db"
        started = time.perf_counter()
        store = SqliteRunStore(database)
        write_long_run(store, RUN, args.points)
        store.close()
        print(f"wrote {args.points:,} steps in {time.perf_counter() - started:.1f} s",
              file=sys.stderr)
        server, base = start_server(database)
        try:
            api = {
                "`GET /api/runs` (run list)": time_get(f"{base}/api/runs", args.runs),
                f"`GET /api/runs/{RUN}` (config, summary, alarms)":
                    time_get(f"{base}/api/runs/{RUN}", args.runs),
                "one curve, 100,000 points thinned to 1,000": time_get(
                    f"{base}/api/runs/{RUN}/metrics?names=reward&max_points=1000", args.runs),
                "the page's first request: 8 curves, 1,000 points each": time_get(
                    f"{base}/api/runs/{RUN}/metrics?names={PAGE_CURVES}&max_points=1000",
                    args.runs),
                "one curve, all 100,000 points (no thinning)": time_get(
                    f"{base}/api/runs/{RUN}/metrics?names=reward&max_points=100000", args.runs),
                "a live poll: 8 curves after the last step": time_get(
                    f"{base}/api/runs/{RUN}/metrics?names={PAGE_CURVES}&after={args.points - 1}",
                    args.runs),
            }
            page = time_page(base, args.runs)
            reads = time_read_paths(database, args.runs)
        finally:
            server.terminate()
            server.wait(10)
    command = "python benchmarks/dashboard.py" + (f" --runs {args.runs}" if args.runs != 5 else "")
    section = markdown(api, page, command, load, args.runs, reads)
    print(section)
    if args.write:
        write_section(SECTION, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
