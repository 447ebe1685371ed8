"""The dashboard: its routes on a real server, and its pages in a real headless Chromium.

The browser tests drive Debian's Chromium (/usr/bin/chromium) through Playwright; no
browser is ever downloaded. Without Chromium or the playwright package they skip with a
message saying what to install; the server tests below them need neither.

Screenshots land in test-artifacts/ at the repository root (gitignored).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from posttrain.errors import PosttrainError
from posttrain.runs.server import start_in_thread
from posttrain.runs.sqlite_store import SqliteRunStore
from posttrain.ui.app import dashboard_server
from posttrain.ui.demo_runs import write_finished_run, write_long_run

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "test-artifacts"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
TOKEN = "s3cret"
# the budget for drawing a run page with 100,000 points per curve
DRAW_BUDGET_MS = 2000


@pytest.fixture
def runs_dir(tmp_path):
    return tmp_path / "runs"


@pytest.fixture
def server(runs_dir):
    running = dashboard_server(runs_dir / "posttrain.db", "127.0.0.1", 0, TOKEN)
    thread = start_in_thread(running)
    yield running
    running.shutdown()
    running.server_close()
    thread.join(5)


def raw_get(server, path: str, method: str = "GET", body: bytes | None = None,
            headers: dict | None = None) -> tuple[int, Any, bytes]:
    """One request with the path sent exactly as given (urllib would normalise '..')."""
    host, port = server.server_address[:2]
    connection = http.client.HTTPConnection(host, port, timeout=10)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, response.headers, response.read()  # names in any case
    finally:
        connection.close()


# --- server: pages, static files, what cannot escape ----------------------------------------


def test_pages_are_html_with_a_strict_content_security_policy(server):
    for path in ("/", "/runs/grpo-starter-1", "/runs/not-started-yet"):
        status, headers, body = raw_get(server, path)
        assert status == 200, path
        assert headers["Content-Type"].startswith("text/html")
        assert "script-src 'self'" in headers["Content-Security-Policy"]
        assert b"/static/dashboard.css" in body


def test_static_files_are_served_with_their_types(server):
    status, headers, body = raw_get(server, "/static/dashboard.css")
    assert status == 200 and headers["Content-Type"].startswith("text/css") and body
    status, headers, _ = raw_get(server, "/static/chart.js")
    assert status == 200 and headers["Content-Type"].startswith("text/javascript")


@pytest.mark.parametrize("path", [
    "/runs/..%2F..",            # decodes to a path with a slash: no route matches
    "/runs/..%2F..%2Fetc%2Fpasswd",
    "/runs/a/b",
    "/static/../../etc/passwd",  # sent as is, not normalised by the client
    "/static/..%2F..%2Fetc%2Fpasswd",
    "/static/%2e%2e",
    "/static/.hidden",
    "/static/app.py",           # a file of the package, but not of static/
    "/static/missing.js",
    "/templates/run.html",
])
def test_paths_cannot_escape_the_static_folder_or_the_run_names(server, path):
    status, _, body = raw_get(server, path)
    assert status in (400, 404), (path, status)
    assert b"root:" not in body and b"import" not in body
    assert "error" in json.loads(body)


@pytest.mark.parametrize("name", ["..", "%2e%2e", ".hidden", "a%20b", "x" * 129])
def test_a_run_page_for_an_unsafe_run_name_is_refused(server, name):
    status, _, body = raw_get(server, f"/runs/{name}")
    assert status == 400, name
    assert "run name" in json.loads(body)["error"]["message"]


def test_ingest_with_a_wrong_token_is_refused_on_the_dashboard_server(server):
    ops = json.dumps({"batch": "b1", "ops": [{"op": "create", "run": "r1", "config": {}}]})
    for headers in ({}, {"Authorization": "Bearer guess"}):
        status, _, _ = raw_get(server, "/api/ingest", "POST", ops.encode(),
                               {"Content-Type": "application/json", **headers})
        assert status == 401
    assert json.loads(raw_get(server, "/api/runs")[2])["runs"] == []
    status, _, _ = raw_get(server, "/api/ingest", "POST", ops.encode(),
                           {"Content-Type": "application/json",
                            "Authorization": f"Bearer {TOKEN}"})
    assert status == 200


# --- the `posttrain ui` command ----------------------------------------------------------------


def ui_args(*argv: str) -> argparse.Namespace:
    from posttrain.commands import ui

    parser = argparse.ArgumentParser()
    ui.register(parser.add_subparsers())
    return parser.parse_args(["ui", *argv])


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.5", "example.org"])
def test_ui_refuses_a_reachable_host_without_a_token(host, monkeypatch, runs_dir):
    monkeypatch.delenv("POSTTRAIN_TOKEN", raising=False)
    args = ui_args("--runs-dir", str(runs_dir), "--host", host)
    with pytest.raises(PosttrainError, match="--token"):
        args.func(args)
    assert not runs_dir.exists()  # refused before anything was created


def test_loopback_hosts_need_no_token():
    from posttrain.commands.ui import is_loopback

    assert all(is_loopback(host) for host in ("127.0.0.1", "127.0.1.1", "localhost", "::1"))
    assert not any(is_loopback(host) for host in ("0.0.0.0", "10.0.0.1", "example.org", ""))


UI_MAIN = (
    "import argparse, sys\n"
    "from posttrain.commands import ui\n"
    "parser = argparse.ArgumentParser()\n"
    "ui.register(parser.add_subparsers())\n"
    "args = parser.parse_args(sys.argv[1:])\n"
    "sys.exit(args.func(args))\n"
)


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # what `posttrain ui &` in a script gets


@pytest.mark.parametrize("started_ignoring_sigint", [False, True])
def test_ui_command_prints_its_url_serves_the_run_list_and_stops_on_ctrl_c(
        runs_dir, started_ignoring_sigint):
    environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
    environment.pop("POSTTRAIN_TOKEN", None)
    process = subprocess.Popen(
        [sys.executable, "-c", UI_MAIN, "ui", "--runs-dir", str(runs_dir), "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment,
        preexec_fn=_ignore_sigint if started_ignoring_sigint else None,
    )
    try:
        line = process.stdout.readline()
        match = re.search(r"serving (\S+) at (http://127\.0\.0\.1:(\d+)/)", line)
        assert match, line
        assert Path(match[1]) == runs_dir / "posttrain.db"
        connection = http.client.HTTPConnection("127.0.0.1", int(match[3]), timeout=10)
        connection.request("GET", "/")
        response = connection.getresponse()
        assert response.status == 200 and b"runs-body" in response.read()
        connection.close()
    finally:
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=120)  # a bound for a loaded machine
    assert process.returncode == 0, err
    assert "stopped" in out


# --- the browser -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.skip("Debian's Chromium is not installed (apt-get install -y chromium); "
                    "the browser tests drive /usr/bin/chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("the playwright package is not installed (pip install playwright; "
                    "never `playwright install`: the tests use /usr/bin/chromium)")
    with sync_playwright() as driver:
        launched = driver.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    opened = context.new_page()
    opened.set_default_timeout(60_000)  # generous: CI machines share their cores
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    yield opened
    context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


def screenshot(page, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000  # a real picture, not a blank page
    return path


# The live writer: a separate process that opens a run through the real run store (the
# default SQLite file under --runs-dir) and logs a step every 0.1 s until it is killed.
LIVE_WRITER = """
import random, sys, time
from posttrain.runs.store import open_run
from posttrain.ui.demo_runs import monitor_metrics, training_metrics
runs_root, name = sys.argv[1], sys.argv[2]
total = 3000
rng = random.Random(0)
run = open_run(name, {"recipe": "grpo", "base_model": "starter"}, runs_root=runs_root)
for step in range(1, total + 1):
    run.log(step, training_metrics(step, 200, rng))
    if step % 10 == 0:
        run.log(step, monitor_metrics(step, 200, rng))
    if step == 15:
        run.alarm("hack", step, "no_id: the policy is exploiting 'length'", {"feature": "length"})
    run.progress(step, total, 0.1 * (total - step))
    time.sleep(0.1)
"""


@pytest.fixture
def live_writer(runs_dir):
    environment = {key: value for key, value in os.environ.items()
                   if key not in ("POSTTRAIN_SERVER", "POSTTRAIN_TOKEN")}
    process = subprocess.Popen([sys.executable, "-c", LIVE_WRITER, str(runs_dir), "live-run"],
                               env=environment, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    database = runs_dir / "posttrain.db"
    while time.monotonic() < deadline:  # wait for the first points
        if database.exists():
            store = SqliteRunStore(database)
            try:
                if store.metric_names("live-run"):
                    break
            finally:
                store.close()
        assert process.poll() is None, process.stderr.read()
        time.sleep(0.2)
    yield process
    process.kill()
    process.wait(10)


def last_step(page, metric: str) -> int:
    return int(page.get_attribute(f'.chart[data-metric="{metric}"]', "data-last-step"))


def test_live_run_shows_in_the_list_and_its_page_grows_without_a_reload(
        server, page, live_writer, runs_dir):
    store = SqliteRunStore(runs_dir / "posttrain.db")
    write_finished_run(store, "grpo-finished")
    store.close()

    page.goto(server.url + "/")
    row = page.locator('tr[data-run="live-run"]')
    row.wait_for()
    assert row.locator(".pill").inner_text() == "running"
    assert "moved" in page.locator('tr[data-run="grpo-finished"]').inner_text()
    steps_before = row.locator("td").nth(5).inner_text()
    page.wait_for_function(
        "(before) => document.querySelector('tr[data-run=\"live-run\"] td:nth-child(6)')"
        ".innerText !== before", arg=steps_before)  # the list updates itself
    screenshot(page, "dashboard-run-list.png")

    page.click('a[href="/runs/live-run"]')
    page.wait_for_selector("html[data-ready]")
    page.evaluate("window.sameDocument = true")  # a reload would drop this
    first = last_step(page, "reward")
    page.wait_for_function(
        "(first) => +document.querySelector('.chart[data-metric=\"reward\"]')"
        ".dataset.lastStep >= first + 10", arg=first)
    assert page.evaluate("window.sameDocument") is True
    assert last_step(page, "reward") >= first + 10
    assert "training" in page.locator("#verdict").inner_text()
    assert "ETA" in page.locator("#progress-text").inner_text()
    page.locator('#alarms li[data-kind="hack"]').wait_for()  # alarms arrive live too
    page.locator('.chart[data-metric="monitor/proxy_reward"]').wait_for()
    page.hover('.chart[data-metric="reward"] canvas.overlay')
    assert "step" in page.locator('.chart[data-metric="reward"] .tooltip').inner_text()
    screenshot(page, "dashboard-live-run.png")


def test_finished_run_shows_verdict_intervals_and_down_categories(server, page, runs_dir):
    store = SqliteRunStore(runs_dir / "posttrain.db")
    summary = write_finished_run(store, "grpo-done")
    write_finished_run(store, "dpo-done", recipe="dpo", steps=60, seed=1)
    store.close()
    delta = summary["delta"]
    down = [group["name"] for group in delta["groups"] if group["down"]]
    assert delta["verdict"] == "moved" and down == ["no_id"]  # what the page must show

    page.goto(server.url + "/runs/grpo-done?compare=dpo-done")
    page.wait_for_selector("html[data-ready]")
    assert page.locator("#verdict .word").inner_text() == "moved"
    low, high = delta["ci95"]
    assert page.locator("#headline-delta").inner_text() == f"+{delta['delta']:.2f}"
    assert f"[+{low:.2f}, +{high:.2f}]" in page.locator("#headline").inner_text()
    for group in delta["groups"]:
        row = page.locator(f'#categories tr[data-group="{group["name"]}"]')
        assert ("down" in (row.get_attribute("class") or "")) == group["down"]
        assert group["verdict"] in row.inner_text()
    assert "DOWN: no_id" in page.locator("#flags").inner_text()
    assert "guard well_formed" in page.locator("#stats").inner_text()
    # compared run: both runs on the charts and in the legend, settings that differ marked
    assert "dpo-done" in page.locator("#legend").inner_text()
    assert page.locator('.chart[data-metric="loss"] .chart-latest .cmp').count() == 1
    assert page.locator("#config tr.diff-changed").count() >= 2
    screenshot(page, "dashboard-finished-run.png")

    page.select_option("#compare-select", "")  # the selector drops the comparison in place
    page.wait_for_function("!window.location.search.includes('compare')")
    page.goto(server.url + "/runs/dpo-done")
    page.wait_for_selector("html[data-ready]")
    assert "prompts with contrast" in page.locator("#pair-report").inner_text()
    assert page.locator('.chart[data-metric="rewards/margins"]').count() == 1


def test_smoothing_matches_tensorboards_debiased_ema(server, page):
    page.goto(server.url + "/")
    smoothed = page.evaluate(
        "async () => { const math = await import('/static/curve_math.js');"
        " return [math.smoothEMA([1, 0, 1, 0, 1], 0.6), math.smoothEMA([2, 4, 6], 0.9),"
        " math.smoothEMA([3, 1], 0)]; }")
    # pins from shared/reference/dashboards-stats-style.md A.7
    assert smoothed[0] == pytest.approx([1.0, 0.375, 0.693878, 0.375, 0.646079], abs=1e-6)
    assert smoothed[1] == pytest.approx([2.0, 3.052632, 4.140221], abs=1e-6)
    assert smoothed[2] == [3, 1]  # weight 0: the values themselves


def test_axis_ticks_are_round_and_hover_finds_the_nearest_step(server, page):
    page.goto(server.url + "/")
    ticks, nearest = page.evaluate(
        "async () => { const math = await import('/static/curve_math.js');"
        " return [math.niceTicks(0.13, 0.71, 5),"
        " [6, 7.5, 8, 100].map((step) => math.nearestIndex([1, 5, 10], step))]; }")
    # about 5 ticks over 0.13..0.71: a raw spacing of 0.116 rounds up to 0.2
    assert ticks == pytest.approx([0.2, 0.4, 0.6])
    assert nearest == [1, 1, 2, 2]  # 7.5 is as far from 5 as from 10: the earlier point


def test_missing_run_page_waits_for_the_run_to_start(server, page, runs_dir):
    page.goto(server.url + "/runs/later")
    page.wait_for_selector("html[data-missing]")
    assert "No run named" in page.locator("#missing").inner_text()
    store = SqliteRunStore(runs_dir / "posttrain.db")
    store.create_run("later", {"base_model": "starter"})
    store.log_metrics("later", 1, {"reward": 0.5})
    store.close()
    page.wait_for_selector("html[data-ready]")
    assert page.locator('.chart[data-metric="reward"]').count() == 1


@pytest.mark.slow
def test_a_run_of_100000_points_per_curve_draws_in_under_2_seconds(server, page, runs_dir):
    store = SqliteRunStore(runs_dir / "posttrain.db")
    write_long_run(store, "long-run", 100_000)
    store.close()
    timings = []
    # a shared CI machine can stall one load; the page must make the budget in one of three
    for _ in range(3):
        page.goto(server.url + "/runs/long-run")
        page.wait_for_selector("html[data-ready]")
        timings.append(int(page.get_attribute("html", "data-draw-ms")))
        if timings[-1] < DRAW_BUDGET_MS:
            break
    assert min(timings) < DRAW_BUDGET_MS, f"draw times (ms): {timings}"
    assert last_step(page, "reward") == 100_000  # the last point survives thinning
    assert int(page.get_attribute('.chart[data-metric="reward"]', "data-points")) <= 1000
    screenshot(page, "dashboard-100k-points.png")


# --- a foreign page in the same browser ---------------------------------------------------------

FOREIGN_PAGE = """<!doctype html><title>loading</title><script>
const ops = [{op: "create", run: "victim", config: {hijacked: true}, time: 2.0}];
fetch("http://127.0.0.1:%d/api/ingest", {method: "POST", mode: "no-cors",
      body: JSON.stringify({batch: "evil", ops: ops})})
  .then(() => { document.title = "sent"; }, (error) => { document.title = "failed " + error; });
</script>"""


def test_a_page_from_another_site_cannot_write_to_the_dashboard(browser, tmp_path):
    """The probe's attack, in real Chromium: a page served from another port posts a
    no-cors text/plain write to a token-less dashboard on loopback; the finished run it
    targets must come through untouched."""
    import http.server
    import threading
    import urllib.request

    server = dashboard_server(tmp_path / "posttrain.db", "127.0.0.1", 0)
    thread = start_in_thread(server)
    port = server.server_address[1]

    def ingest(ops):
        call = urllib.request.Request(f"{server.url}/api/ingest", method="POST",
                                      data=json.dumps({"batch": ops[0]["op"], "ops": ops}).encode())
        call.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(call, timeout=10) as answer:
            assert answer.status == 200

    ingest([{"op": "create", "run": "victim", "config": {"base_model": "starter"}, "time": 1.0}])
    ingest([{"op": "finish", "run": "victim", "status": "done", "summary": {"verdict": "moved"}}])
    page_body = (FOREIGN_PAGE % port).encode()

    class Foreign(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page_body)))
            self.end_headers()
            self.wfile.write(page_body)

        def log_message(self, *args):
            pass

    foreign = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Foreign)
    threading.Thread(target=foreign.serve_forever, daemon=True).start()
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(f"http://127.0.0.1:{foreign.server_address[1]}/")
        page.wait_for_function("document.title !== 'loading'", timeout=30_000)
        with urllib.request.urlopen(f"{server.url}/api/runs/victim", timeout=10) as answer:
            run = json.loads(answer.read())
    finally:
        context.close()
        foreign.shutdown()
        server.shutdown()
        server.server_close()
        thread.join(5)
    assert run["status"] == "done"
    assert run["summary"] == {"verdict": "moved"}
    assert "hijacked" not in json.dumps(run["config"])


# --- what the policy said -----------------------------------------------------------------------

EPISODE_ROW = {
    "prompt": "Refund ORD-1002 now.", "scenario_id": "mt-1", "category": "ineligible",
    "sample": 0, "score": 1.0, "reward": 1, "eval_run": 0,
    "reply": ('<tool_call>\n{"name": "lookup_order", "arguments": {"order_id": "ORD-1002"}}\n'
              "</tool_call>\n<|im_end|>\nIt has not arrived yet, so I cannot refund it."),
    "transcript": [
        {"role": "assistant", "content": '<tool_call>\n{"name": "lookup_order", "arguments": '
                                         '{"order_id": "ORD-1002"}}\n</tool_call>'},
        {"role": "tool", "name": "lookup_order",
         "content": '{"order_id": "ORD-1002", "status": "in_transit", "refundable": false}'},
        {"role": "assistant", "content": "It has not arrived yet, so I cannot refund it."},
    ],
    "episode": {"turns": 2, "tool_calls": 1, "failed_calls": 0, "ended": "reply"},
}
PLAIN_ROW = {"prompt": "Tell me a joke. <script>alert(1)</script>", "scenario_id": "s-2",
             "category": "off_topic", "sample": 0, "score": 0.0, "reward": 0, "eval_run": 0,
             "reply": "<b>no</b>"}


def write_samples(runs_dir: Path, name: str) -> None:
    folder = runs_dir / name
    folder.mkdir(parents=True, exist_ok=True)
    rows = [EPISODE_ROW, PLAIN_ROW, {**PLAIN_ROW, "eval_run": 1}]
    (folder / "holdout_after.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def finished_run_with_samples(runs_dir: Path, name: str) -> None:
    """A finished run in the store with graded rows in its folder."""
    store = SqliteRunStore(runs_dir / "posttrain.db")
    write_finished_run(store, name)
    store.close()
    write_samples(runs_dir, name)


def test_samples_api_reads_the_run_folder(server, runs_dir):
    write_samples(runs_dir, "mt-run")
    status, _, body = raw_get(server, "/api/runs/mt-run/samples")
    answer = json.loads(body)
    assert status == 200 and answer["available"] and answer["which"] == "after"
    assert [row["category"] for row in answer["rows"]] == ["ineligible", "off_topic"]  # run 0
    assert answer["rows"][0]["transcript"][1]["role"] == "tool"
    status, _, body = raw_get(server, "/api/runs/mt-run/samples?which=before")
    assert status == 200 and json.loads(body) == {"run": "mt-run", "which": "before",
                                                  "available": False, "rows": [],
                                                  "checks": []}
    assert len(json.loads(raw_get(server, "/api/runs/mt-run/samples?limit=1")[2])["rows"]) == 1
    for query, fragment in (("which=middle", "'which' must be"), ("limit=0", "between 1"),
                            ("which=monitor", "needs step="),
                            ("limit=x", "whole number"), ("limit=201", "between 1")):
        status, _, body = raw_get(server, f"/api/runs/mt-run/samples?{query}")
        assert status == 400 and fragment in json.loads(body)["error"]["message"]
    assert raw_get(server, "/api/runs/..hidden/samples")[0] == 400


def test_an_episode_reads_as_a_conversation(server, runs_dir, page):
    finished_run_with_samples(runs_dir, "mt-run")
    page.goto(server.url + "/runs/mt-run")
    page.wait_for_selector("html[data-ready]")
    page.wait_for_selector("#samples-box .sample")
    first = page.locator("#samples-box .sample").first
    roles = [bubble.get_attribute("data-role")
             for bubble in first.locator(".bubble").all()]
    assert roles == ["user", "assistant", "tool", "assistant"]
    assert 'lookup_order({"order_id":"ORD-1002"})' in first.locator(".tool-call").inner_text()
    assert "in_transit" in first.locator(".bubble.tool").inner_text()
    assert "2 turns, 1 tool calls, ended by reply" in first.inner_text()
    # text from a policy or a customer never becomes markup
    second = page.locator("#samples-box .sample").nth(1)
    assert "<script>alert(1)</script>" in second.inner_text()
    assert "<b>no</b>" in second.inner_text() and second.locator("b").count() == 0
    screenshot(page, "dashboard-episode.png")
    page.select_option("#samples-which", "before")
    page.wait_for_selector("html[data-samples='before']")
    assert "no before-training samples" in page.locator("#samples-box").inner_text()


def test_a_lost_run_reads_lost_and_the_delete_button_removes_it(browser, runs_dir, tmp_path):
    # a token-less dashboard, as `posttrain ui` starts by default on 127.0.0.1
    open_server = dashboard_server(runs_dir / "posttrain.db", "127.0.0.1", 0, None)
    thread = start_in_thread(open_server)
    store = SqliteRunStore(runs_dir / "posttrain.db")
    store.create_run("killed", {"recipe": "grpo", "settings": {}},  # its folder's run
                     started=time.time() - 3600)
    store.log_metrics("killed", 3, {"loss": 1.0}, timestamp=time.time() - 3500)
    store.create_run("alive", {})
    (runs_dir / "killed").mkdir()
    (runs_dir / "killed" / "config.json").write_text('{"recipe": "grpo", "settings": {}}')
    store.close()
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.set_default_timeout(60_000)
    try:
        page.goto(open_server.url + "/")
        page.wait_for_selector('tr[data-run="killed"]')
        assert page.locator('tr[data-run="killed"] .pill').first.inner_text() == "lost"
        page.goto(open_server.url + "/runs/killed")
        page.wait_for_selector("html[data-ready]")
        assert page.locator("#status").inner_text() == "lost"
        assert "training process was killed" in page.locator("#progress-text").inner_text()
        page.on("dialog", lambda dialog: dialog.accept())
        page.click("#delete-run")
        page.wait_for_url(open_server.url + "/")
        page.wait_for_selector('tr[data-run="alive"]')
        assert page.locator('tr[data-run="killed"]').count() == 0
        assert not (runs_dir / "killed").exists()
        page.goto(open_server.url + "/runs/alive")  # a live run offers no delete button
        page.wait_for_selector("html[data-ready]")
        assert page.locator("#delete-run").is_hidden()
    finally:
        context.close()
        open_server.shutdown()
        open_server.server_close()
        thread.join(5)


def test_the_learning_signal_panel_shows_dead_groups_and_the_remedy(server, page, runs_dir):
    store = SqliteRunStore(runs_dir / "posttrain.db")
    write_finished_run(store, "flat-groups")
    store.log_metrics("flat-groups", 3, {"frac_reward_zero_std": 0.9})
    # a summary merges into the finished one: the signal of a run whose groups were dead
    store.finish_run("flat-groups", {"signal": {"steps": 10, "dead_group_share": 0.85,
                                                "reward_spread": 0.02, "alarm": True}}, "done")
    write_finished_run(store, "dpo-contrast", recipe="dpo", steps=60, seed=1)
    store.close()
    page.goto(server.url + "/runs/flat-groups")
    page.wait_for_selector("html[data-ready]")
    signal = page.locator("#signal").inner_text()
    assert "85% on average over 10 steps" in signal and "0.020" in signal
    assert "posttrain sft" in page.locator("#signal-advice").inner_text()
    assert page.locator('.chart[data-metric="frac_reward_zero_std"]').count() == 1
    page.goto(server.url + "/runs/dpo-contrast")
    page.wait_for_selector("html[data-ready]")
    assert "prompts with contrast" in page.locator("#signal").inner_text()


def write_seed_run(store, name: str, seed: int, delta: float, learning_rate: float) -> None:
    """A small finished GRPO run whose config differs from its siblings in seed and rate."""
    from posttrain.ui.demo_runs import demo_config

    config = demo_config("grpo", 20)
    config["settings"] = {**config["settings"], "seed": seed, "run_name": name}
    config["resolved"] = {**config["resolved"], "learning_rate": learning_rate}
    store.create_run(name, config, started=time.time() - 100 + seed)
    for step in range(1, 21):
        store.log_metrics(name, step, {"reward": 0.3 + 0.01 * step * (1 + seed),
                                       "loss": 1.0 / step})
    store.finish_run(name, {"before": {"pass_at_1": 0.5}, "after": {"pass_at_1": 0.5 + delta},
                            "delta": {"delta": delta, "ci95": [delta - 0.1, delta + 0.1],
                                      "verdict": "moved" if delta > 0.1 else "flat"}}, "done")


def test_three_runs_compare_with_curves_verdicts_config_diff_and_groups(server, page, runs_dir):
    store = SqliteRunStore(runs_dir / "posttrain.db")
    write_seed_run(store, "grid-a", 0, 0.20, 3e-4)
    write_seed_run(store, "grid-b", 1, 0.04, 3e-4)
    write_seed_run(store, "grid-c", 2, 0.15, 1e-4)
    store.close()
    page.goto(server.url + "/")
    page.wait_for_selector('tr[data-run="grid-c"]')
    for name in ("grid-a", "grid-b", "grid-c"):
        page.check(f'tr[data-run="{name}"] input[type=checkbox]')
    assert page.locator("#compare").inner_text() == "Compare the 3 selected runs"
    page.click("#compare")
    page.wait_for_url(re.compile(r".*/compare\?runs=.*"))
    page.wait_for_selector("html[data-ready]")
    assert page.locator("#verdicts tbody tr").count() == 3
    assert "+0.20 [+0.10, +0.30]" in page.locator('#verdicts tr[data-run="grid-a"]').inner_text()
    legend = page.locator("#legend").inner_text()
    assert all(name in legend for name in ("grid-a", "grid-b", "grid-c"))
    # every run has its own line on the reward chart
    page.hover('.chart[data-metric="reward"] canvas.overlay')
    assert page.locator('.chart[data-metric="reward"]').count() == 1
    diff = page.locator("#config-diff").inner_text()
    assert "settings.seed" in diff and "resolved.learning_rate" in diff
    assert "settings.steps" not in diff  # the same in every run
    assert page.locator("#group-by").input_value() == "settings.seed"
    page.select_option("#group-by", "resolved.learning_rate")
    rows = page.locator("#groups tbody tr")
    assert rows.count() == 2  # two rates
    assert "+0.12" in page.locator('#groups tr[data-value="3.00e-4"]').inner_text()  # mean
    screenshot(page, "dashboard-compare.png")
    page.goto(server.url + "/compare?runs=grid-a")
    page.wait_for_selector("html[data-ready]")
    assert "at least two runs" in page.locator("#problem-text").inner_text()


def test_curves_and_rows_export_as_csv_and_json(server, runs_dir):
    import csv
    import io

    store = SqliteRunStore(runs_dir / "posttrain.db")
    write_finished_run(store, "mt-run")
    loss = store.metric_series("mt-run", "loss")
    store.close()
    write_samples(runs_dir, "mt-run")
    status, headers, body = raw_get(server, "/api/runs/mt-run/metrics.csv?names=loss")
    assert status == 200 and headers["Content-Type"].startswith("text/csv")
    assert 'filename="mt-run-metrics.csv"' in headers["Content-Disposition"]
    table = list(csv.DictReader(io.StringIO(body.decode())))
    assert [int(row["step"]) for row in table] == loss["steps"]  # every point, not thinned
    assert float(table[0]["value"]) == loss["values"][0]
    every = list(csv.DictReader(io.StringIO(raw_get(server, "/api/runs/mt-run/metrics.csv")[2]
                                            .decode())))
    assert {row["metric"] for row in every} >= {"loss", "reward"}

    status, headers, body = raw_get(server, "/api/runs/mt-run/rows.json?which=after")
    rows = json.loads(body)["rows"]
    assert status == 200 and len(rows) == 3  # every evaluation run, not only the first
    assert 'filename="mt-run-holdout-after.json"' in headers["Content-Disposition"]
    status, _, body = raw_get(server, "/api/runs/mt-run/rows.csv?which=after")
    table = list(csv.DictReader(io.StringIO(body.decode())))
    assert status == 200 and [row["category"] for row in table] == [r["category"] for r in rows]
    assert json.loads(table[0]["transcript"])[1]["role"] == "tool"  # nested fields as JSON
    assert raw_get(server, "/api/runs/mt-run/rows.csv?which=before")[0] == 404
    assert raw_get(server, "/api/runs/mt-run/rows.xml")[0] == 404


def test_csv_exports_never_hand_a_spreadsheet_a_formula(server, runs_dir):
    """A reply or metric name that a spreadsheet would run (=, +, -, @ first) is
    exported as text (a leading quote); numbers stay numbers, negative ones too."""
    import csv
    import io

    store = SqliteRunStore(runs_dir / "posttrain.db")
    write_finished_run(store, "csv-run")
    store.log_metrics("csv-run", 1, {"=HYPERLINK(\"http://x\")": -0.5})
    store.close()
    (runs_dir / "csv-run").mkdir(exist_ok=True)
    (runs_dir / "csv-run" / "holdout_after.jsonl").write_text(json.dumps(
        {"prompt": "@SUM(A1:A9)", "reply": "=cmd|' /C calc'!A0", "score": -1.0,
         "category": "+x", "scenario_id": "-s", "eval_run": 0}) + "\n")
    _, _, body = raw_get(server, "/api/runs/csv-run/metrics.csv")
    cells = [cell for row in csv.reader(io.StringIO(body.decode())) for cell in row]
    assert "'=HYPERLINK(\"http://x\")" in cells and "-0.5" in cells
    _, _, body = raw_get(server, "/api/runs/csv-run/rows.csv?which=after")
    (row,) = list(csv.DictReader(io.StringIO(body.decode())))
    assert (row["reply"], row["prompt"], row["category"]) == (
        "'=cmd|' /C calc'!A0", "'@SUM(A1:A9)", "'+x")
    assert row["score"] == "-1.0"


def test_the_page_downloads_a_curve_and_the_rows(server, runs_dir, page):
    finished_run_with_samples(runs_dir, "mt-run")
    page.goto(server.url + "/runs/mt-run")
    page.wait_for_selector("html[data-ready]")
    with page.expect_download() as download:
        page.click('.chart[data-metric="loss"] a.chart-data:text("csv")')
    text = Path(download.value.path()).read_text()
    assert text.startswith("metric,step,value,time\nloss,1,")
    page.wait_for_selector("#rows-csv[href]")
    with page.expect_download() as download:
        page.click("#rows-csv")
    assert download.value.suggested_filename == "mt-run-holdout-after.csv"
    assert "ineligible" in Path(download.value.path()).read_text()


def test_the_charts_switch_to_a_wall_clock_axis_and_the_key_settings_lead(server, page,
                                                                          runs_dir):
    store = SqliteRunStore(runs_dir / "posttrain.db")
    write_finished_run(store, "clock-run")  # one step a second, from its start
    store.close()
    page.goto(server.url + "/runs/clock-run")
    page.wait_for_selector("html[data-ready]")
    key = page.locator("#key-settings-table").inner_text()
    assert "base model" in key and "starter" in key and "learning rate" in key
    assert not page.locator("#config-details").get_attribute("open")  # the rest is folded
    page.select_option("#x-axis", "time")
    page.wait_for_selector("html[data-x-axis=time]")
    page.hover('.chart[data-metric="loss"] canvas.overlay')
    assert "min since start" in page.locator('.chart[data-metric="loss"] .tooltip').inner_text()
    page.reload()  # the choice is remembered
    page.wait_for_selector("html[data-x-axis=time]")
    page.select_option("#x-axis", "step")
    page.wait_for_selector("html[data-x-axis=step]")


def graded_row(prompt: str, reply: str, category: str, reward: int, sample: int = 0) -> dict:
    return {"prompt": prompt, "scenario_id": prompt[:8], "category": category,
            "sample": sample, "reply": reply, "score": float(reward), "reward": reward,
            "eval_run": 0, "markers": {"well_formed": 1.0}}


def test_samples_filter_compare_before_after_and_open_from_an_alarm(server, page, runs_dir):
    from playwright.sync_api import expect

    store = SqliteRunStore(runs_dir / "posttrain.db")
    write_finished_run(store, "read-me")  # a hack alarm at step 30 on no_id
    store.log_samples("read-me", 30, [
        graded_row("Where is my refund?", 'lookup_order {"order_id": "ORD-0000"}', "no_id", 1),
        graded_row("Refund ORD-1234", "lookup ORD-1234", "with_id", 1),
    ], "rollouts")
    store.log_samples("read-me", 30, [graded_row("Hi there", "Hello!", "off_topic", 1)],
                      "monitor")
    store.close()
    folder = runs_dir / "read-me"
    folder.mkdir(parents=True, exist_ok=True)
    before = [graded_row("Refund ORD-1234", "No idea.", "with_id", 0),
              graded_row("Where is my refund?", "Which order?", "no_id", 1),
              graded_row("Tell me a joke", "A joke.", "off_topic", 1)]
    after = [graded_row("Refund ORD-1234", "lookup ORD-1234", "with_id", 1),
             graded_row("Where is my refund?", "lookup ORD-9999", "no_id", 0),
             graded_row("Tell me a joke", "A joke.", "off_topic", 1)]
    for name, rows in (("holdout_before.jsonl", before), ("holdout_after.jsonl", after)):
        (folder / name).write_text("".join(json.dumps(row) + "\n" for row in rows))

    page.goto(server.url + "/runs/read-me")
    page.wait_for_selector("html[data-samples=after]")
    assert page.locator("#samples-box article.sample").count() == 3
    page.select_option("#samples-outcome", "fail")
    expect(page.locator("#samples-box article")).to_have_count(1)
    assert page.locator("#samples-box article").get_attribute("data-category") == "no_id"
    page.select_option("#samples-outcome", "")
    page.select_option("#samples-category", "with_id")
    expect(page.locator("#samples-box article")).to_have_count(1)
    page.select_option("#samples-category", "")
    page.fill("#samples-text", "joke")
    expect(page.locator("#samples-box article")).to_have_count(1)
    page.fill("#samples-text", "")

    page.select_option("#samples-which", "compare")
    page.wait_for_selector("#side-by-side")
    rows = page.locator("#side-by-side tbody tr")
    assert rows.count() == 3
    changed = page.locator('#side-by-side tr[data-change="0->1"]')
    assert "No idea." in changed.inner_text() and "lookup ORD-1234" in changed.inner_text()

    page.click('#alarms li[data-kind="hack"] a.alarm-replies')
    page.wait_for_selector("html[data-samples='rollouts:30']")
    expect(page.locator("#samples-category")).to_have_value("no_id")
    expect(page.locator("#samples-box article")).to_have_count(1)
    assert "ORD-0000" in page.locator("#samples-box article").inner_text()
    options = page.locator("#samples-which option").all_inner_texts()
    assert any("monitor check at step 30" in text for text in options)
    screenshot(page, "dashboard-samples.png")
