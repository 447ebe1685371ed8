"""Screenshots of the dashboard's views for docs/img, taken from real runs.

    .venv/bin/python scripts/screenshots.py --runs-dir RUNS --run NAME [--compare A,B,...]

Starts the dashboard over RUNS (a runs folder with posttrain.db), opens Debian's Chromium
headless and writes, under docs/img: the run list (dashboard-list.png), the run page
(dashboard-run.png), its samples view
with the holdout before and after side by side (dashboard-samples.png), what the monitor
saw at its last check (dashboard-monitor.png), and, with --compare, the compare page
(dashboard-compare.png). Nothing is made up: the pages show what the runs recorded.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from posttrain.runs.server import start_in_thread
from posttrain.ui.app import dashboard_server

ROOT = Path(__file__).resolve().parents[1]
IMG = ROOT / "docs" / "img"
CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]


def panel_shot(page, selector: str, path: Path, height: int = 900) -> None:
    """The samples panel with its list of replies cut at ``height`` pixels."""
    page.locator("#samples-box").evaluate(
        f"(box) => {{ box.style.maxHeight = '{height}px'; box.style.overflow = 'hidden'; }}")
    page.locator(selector).screenshot(path=str(path))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs-dir", required=True, help="runs folder holding posttrain.db")
    parser.add_argument("--run", required=True, help="the run whose page is shown")
    parser.add_argument("--compare", default=None, help="comma-separated runs to compare")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    server = dashboard_server(Path(args.runs_dir) / "posttrain.db", "127.0.0.1", 0, None)
    thread = start_in_thread(server)
    IMG.mkdir(parents=True, exist_ok=True)
    try:
        with sync_playwright() as driver:
            browser = driver.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(f"{server.url}/")
            page.wait_for_selector("html[data-loaded]")
            page.screenshot(path=str(IMG / "dashboard-list.png"),
                            clip={"x": 0, "y": 0, "width": 1400, "height": 320})
            page.goto(f"{server.url}/runs/{args.run}")
            page.wait_for_selector("html[data-ready]")
            page.wait_for_selector("html[data-samples]")
            page.screenshot(path=str(IMG / "dashboard-run.png"), full_page=False)
            shots = ["dashboard-list.png", "dashboard-run.png"]
            page.select_option("#samples-which", "compare")
            page.wait_for_selector("#side-by-side")
            panel_shot(page, "#samples-panel", IMG / "dashboard-samples.png")
            shots.append("dashboard-samples.png")
            monitor = [value for value in page.locator("#samples-which option")
                       .evaluate_all("(options) => options.map((o) => o.value)")
                       if value.startswith("monitor:")]
            if monitor:
                page.select_option("#samples-which", monitor[-1])
                page.wait_for_selector(f"html[data-samples='{monitor[-1]}']")
                panel_shot(page, "#samples-panel", IMG / "dashboard-monitor.png")
                shots.append("dashboard-monitor.png")
            if args.compare:
                page.goto(f"{server.url}/compare?runs={args.compare}")
                page.wait_for_selector("html[data-ready]")
                page.screenshot(path=str(IMG / "dashboard-compare.png"), full_page=True)
                shots.append("dashboard-compare.png")
            browser.close()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    print("wrote " + ", ".join(f"docs/img/{name}" for name in shots))
    return 0


if __name__ == "__main__":
    sys.exit(main())
