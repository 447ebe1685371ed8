"""A damaged run store is a message, not a traceback (#32, class 3).

Real SQLite files damaged the ways files get damaged (overwritten with random bytes,
truncated, a page of garbage), the real `posttrain runs` CLI, a recipe started on the
damaged store, and a real dashboard server on 127.0.0.1 that starts anyway.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import shutil
import sqlite3

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from posttrain.cli import main
from posttrain.runs.ops import DamagedStore, RunStoreError
from posttrain.runs.server import serve, start_in_thread
from posttrain.runs.sqlite_store import SCHEMA_VERSION, SqliteRunStore
from posttrain.runs.store import open_run


def healthy_store(folder, runs: int = 6) -> bytes:
    """A store with finished runs, its bytes (checkpointed into the main file)."""
    folder.mkdir(parents=True, exist_ok=True)
    store = SqliteRunStore(folder / "posttrain.db")
    for index in range(runs):
        run = open_run(f"r{index}", {"recipe": "grpo"}, store=store, heartbeat_seconds=None)
        for step in range(60):
            run.log(step, {"loss": step / 10, "reward": 0.5})
        run.finish({"status": "done"}, status="done")
    store.close()  # the last connection's close checkpoints the WAL into the file
    return (folder / "posttrain.db").read_bytes()


DAMAGES = {
    "random bytes": lambda data: random.Random(0).randbytes(len(data)),
    "truncated": lambda data: data[: len(data) // 3],
    "garbage after the header": lambda data: data[:100] + b"\x5a" * 4000 + data[4100:],
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_runs_commands_say_the_store_is_damaged_and_how_to_recover(tmp_path, capsys, damage):
    data = healthy_store(tmp_path)
    (tmp_path / "posttrain.db").write_bytes(DAMAGES[damage](data))
    for command in (["runs", "list"], ["runs", "export", "r1"], ["runs", "delete", "r1"]):
        assert main([*command, "--runs-dir", str(tmp_path)]) == 2
        error = capsys.readouterr().err
        assert "is damaged" in error and "mv " in error and "Traceback" not in error, error
        assert error.count("\n") == 1


def test_a_recipe_on_a_damaged_store_stops_before_its_model_loads(tmp_path, capsys):
    (tmp_path / "posttrain.db").write_bytes(os.urandom(8192))
    # no-such-model would fail the load: the store's damage must be said first
    assert main(["grpo", "--runs-dir", str(tmp_path), "--run-name", "r",
                 "--base-model", "no-such-model"]) == 2
    error = capsys.readouterr().err
    assert "is damaged" in error and "no-such-model" not in error
    assert not (tmp_path / "r").exists()  # nothing left to block a rerun under that name


def test_a_store_damaged_under_a_running_run_warns_once_and_the_folder_keeps_it(tmp_path,
                                                                               capsys):
    store = SqliteRunStore(tmp_path / "posttrain.db")
    run = open_run("r", {"recipe": "grpo"}, store=store, run_dir=tmp_path / "r",
                   heartbeat_seconds=None)
    run.log(0, {"loss": 1.0})
    for file in tmp_path.glob("posttrain.db*"):  # the file, its WAL and index, under it
        file.write_bytes(os.urandom(16384))
    for step in range(1, 6):
        run.log(step, {"loss": 1.0 / step})
    run.finish({"status": "done"}, status="done")
    error = capsys.readouterr().err
    assert error.count("run store could not") == 1 and "is damaged" in error, error
    lines = (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == list(range(6))


def test_a_store_that_cannot_be_opened_stops_a_recipe_before_its_model_loads(tmp_path,
                                                                            capsys):
    (tmp_path / "posttrain.db").mkdir()  # what SQLite cannot open, like a read-only folder
    assert main(["grpo", "--runs-dir", str(tmp_path), "--run-name", "r",
                 "--base-model", "no-such-model"]) == 2
    error = capsys.readouterr().err
    assert "cannot open the run store" in error and "no-such-model" not in error
    assert not (tmp_path / "r").exists()


def get(server, path: str) -> tuple[int, dict]:
    connection = http.client.HTTPConnection(*server.server_address[:2], timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def test_the_dashboard_starts_on_a_damaged_store_and_recovers_when_it_is_moved(tmp_path):
    data = healthy_store(tmp_path)
    (tmp_path / "posttrain.db").write_bytes(data[: len(data) // 3])
    server = serve(tmp_path / "posttrain.db", port=0)
    start_in_thread(server)
    try:
        assert server.store.damage is not None
        for path in ("/api/runs", "/api/runs/r1", "/api/runs/r1/metrics?names=loss"):
            status, body = get(server, path)
            assert status == 503, (path, status, body)
            assert "is damaged" in json.dumps(body)
        # the user moves the file aside, as the message says: the store opens again
        aside = tmp_path / "damaged"
        aside.mkdir()
        for file in tmp_path.glob("posttrain.db*"):
            shutil.move(file, aside / file.name)
        status, body = get(server, "/api/runs")
        assert (status, body["runs"]) == (200, [])
        assert server.store.damage is None
    finally:
        server.shutdown()
        server.server_close()


def test_a_store_is_copied_aside_before_it_is_migrated(tmp_path):
    healthy_store(tmp_path, runs=2)
    path = tmp_path / "posttrain.db"
    with sqlite3.connect(path) as old:  # back to schema 1: no tiles yet
        old.execute("DROP TABLE metric_tiles")
        old.execute("PRAGMA user_version=1")
    old.close()
    SqliteRunStore(path).close()
    backup = tmp_path / "posttrain.db.v1.bak"
    assert backup.is_file()
    with sqlite3.connect(backup) as copy:
        assert copy.execute("PRAGMA user_version").fetchone()[0] == 1
        assert copy.execute("SELECT count(*) FROM runs").fetchone()[0] == 2
    copy.close()
    with SqliteRunStore(path) as store:
        assert len(store.list_runs()) == 2
    with sqlite3.connect(path) as upgraded:
        assert upgraded.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    upgraded.close()
    # a damaged store's message points at the copy
    path.write_bytes(b"\0" * 4096)
    with pytest.raises(DamagedStore, match=r"posttrain\.db\.v1\.bak"):
        SqliteRunStore(path)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(cuts=st.lists(st.tuples(st.integers(0, 2**20), st.binary(min_size=1, max_size=600)),
                     min_size=1, max_size=4),
       length=st.one_of(st.none(), st.integers(0, 2**20)))
def test_any_damage_is_a_store_error_or_a_readable_store(tmp_path_factory, cuts, length):
    """Whatever bytes land where (or however much of the file is left), opening and
    reading the store either works or raises a RunStoreError that names the file."""
    global _HEALTHY
    folder = tmp_path_factory.mktemp("store")
    if _HEALTHY is None:
        _HEALTHY = healthy_store(tmp_path_factory.mktemp("healthy"))
    data = bytearray(_HEALTHY)
    for offset, chunk in cuts:
        offset %= len(data)
        data[offset:offset + len(chunk)] = chunk
    if length is not None:
        data = data[: length % (len(data) + 1)]
    (folder / "posttrain.db").write_bytes(bytes(data))
    try:
        with SqliteRunStore(folder / "posttrain.db") as store:
            for run in store.list_runs():
                store.get_run(run["name"])
                for metric in store.metric_names(run["name"]):
                    store.metric_series(run["name"], metric)
    except DamagedStore as error:
        assert str(folder / "posttrain.db") in str(error)
    except RunStoreError:
        pass  # a garbage run name read back is refused by name, like any bad name


_HEALTHY: bytes | None = None


@pytest.mark.parametrize("config, summary", [
    ("[1, 2, 3]", '"done"'), ("null", "42"), ("{not json", "[]")])
def test_one_hostile_row_in_a_shared_store_breaks_no_list_and_no_page(tmp_path, capsys,
                                                                      config, summary):
    # a shared store (PostgreSQL, the same SQL code) may hold anything another program wrote
    healthy_store(tmp_path, runs=2)
    with sqlite3.connect(tmp_path / "posttrain.db") as db:
        db.execute("UPDATE runs SET config = ?, summary = ? WHERE name = 'r1'",
                   (config, summary))
        db.execute("UPDATE alarms SET details = ?", (config,))
    db.close()
    with SqliteRunStore(tmp_path / "posttrain.db") as store:
        listed = {run["name"]: run for run in store.list_runs()}
        assert set(listed) == {"r0", "r1"} and listed["r1"]["base_model"] is None
        page = store.get_run("r1")
        assert page["config"] == {} and page["summary"] == {}
    assert main(["runs", "list", "--runs-dir", str(tmp_path)]) == 0
    assert "r1" in capsys.readouterr().out
    server = serve(tmp_path / "posttrain.db", port=0)
    start_in_thread(server)
    try:
        assert get(server, "/api/runs")[0] == 200
        status, body = get(server, "/api/runs/r1")
        assert status == 200 and body["config"] == {}
    finally:
        server.shutdown()
        server.server_close()
