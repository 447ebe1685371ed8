"""A running `posttrain ui` is announced in the runs folder, so recipes print the run page."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from posttrain.runs.dashboard_link import ANNOUNCE_FILENAME, announce_dashboard, local_dashboard_url


def test_announced_url_is_found_while_the_block_runs_and_removed_after(tmp_path):
    assert local_dashboard_url(tmp_path) is None
    with announce_dashboard(tmp_path, "http://127.0.0.1:8765") as path:
        assert local_dashboard_url(tmp_path) == "http://127.0.0.1:8765/"
        assert json.loads(path.read_text())["pid"] == os.getpid()
    assert not (tmp_path / ANNOUNCE_FILENAME).exists()
    assert local_dashboard_url(tmp_path) is None


def test_a_file_left_by_a_dead_dashboard_is_ignored(tmp_path):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    (tmp_path / ANNOUNCE_FILENAME).write_text(
        json.dumps({"url": "http://127.0.0.1:1/", "pid": int(dead.stdout)})
    )
    assert local_dashboard_url(tmp_path) is None
    (tmp_path / ANNOUNCE_FILENAME).write_text("not json")
    assert local_dashboard_url(tmp_path) is None


def test_posttrain_ui_announces_itself_in_its_runs_folder(tmp_path):
    ui = subprocess.Popen(
        [sys.executable, "-m", "posttrain.cli", "ui", "--runs-dir", str(tmp_path), "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = ui.stdout.readline()
        assert "serving" in line, line
        served = line.split(" at ")[1].split()[0]
        deadline = time.monotonic() + 60  # a bound for a loaded machine
        while local_dashboard_url(tmp_path) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert local_dashboard_url(tmp_path) == served
    finally:
        ui.terminate()
        ui.wait(timeout=60)
    assert local_dashboard_url(Path(tmp_path)) is None
