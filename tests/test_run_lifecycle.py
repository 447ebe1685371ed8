"""A run's life after its process: heartbeats, the `lost` state, and deleting a run.

Real components throughout: a real SQLite file, a real training-like process killed with
SIGKILL, the real `posttrain runs` CLI and a real run server on 127.0.0.1.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from posttrain.cli import main
from posttrain.errors import PosttrainError
from posttrain.runs.ops import LOST_AFTER_SECONDS, RunStillAlive
from posttrain.runs.server import serve, start_in_thread
from posttrain.runs.sqlite_store import SqliteRunStore
from posttrain.runs.store import open_run


def status_of(store: SqliteRunStore, name: str) -> str:
    statuses = {run["name"]: run["status"] for run in store.list_runs()}
    single = store.get_run(name)
    assert single is not None and single["status"] == statuses[name]  # both reads agree
    return statuses[name]


def test_a_live_handle_heartbeats_and_a_silent_run_reads_lost_until_it_speaks(tmp_path):
    store = SqliteRunStore(tmp_path / "posttrain.db", lost_after_seconds=0.6)
    beating = open_run("beating", {}, store=store, heartbeat_seconds=0.1)
    silent = open_run("silent", {}, store=store, heartbeat_seconds=None)
    time.sleep(1.2)
    assert status_of(store, "beating") == "running"
    assert status_of(store, "silent") == "lost"
    store.heartbeat("silent")  # a process that wakes up (SIGCONT) is running again
    assert status_of(store, "silent") == "running"
    beating.finish({"delta": 0.1})
    silent.finish(status="stopped")
    time.sleep(0.8)  # finished runs never turn lost
    assert status_of(store, "beating") == "done" and status_of(store, "silent") == "stopped"
    store.close()


def test_a_heartbeat_never_resurrects_a_finished_or_deleted_run(tmp_path):
    store = SqliteRunStore(tmp_path / "posttrain.db")
    store.create_run("finished", {})
    store.finish_run("finished", {}, "done")
    store.heartbeat("finished")
    store.heartbeat("never-created")
    assert [(run["name"], run["status"]) for run in store.list_runs()] == [("finished", "done")]
    store.close()


KILLED_WRITER = """
import sys, time
from posttrain.runs.store import open_run
run = open_run("killed", {"recipe": "grpo"}, runs_root=sys.argv[1], heartbeat_seconds=0.2)
run.log(1, {"loss": 1.0})
print("ready", flush=True)
time.sleep(600)
"""


def test_a_sigkilled_training_process_leaves_a_run_that_reads_lost(tmp_path):
    runs_dir = tmp_path / "runs"
    environment = {key: value for key, value in os.environ.items()
                   if key not in ("POSTTRAIN_SERVER", "POSTTRAIN_TOKEN")}
    writer = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(runs_dir)],
                              stdout=subprocess.PIPE, text=True, env=environment)
    try:
        assert writer.stdout.readline().strip() == "ready"
        store = SqliteRunStore(runs_dir / "posttrain.db", lost_after_seconds=1.5)
        time.sleep(2.0)  # longer than lost_after: only the heartbeats keep it running
        assert status_of(store, "killed") == "running"
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait(10)
    time.sleep(2.0)
    assert status_of(store, "killed") == "lost"
    assert store.get_run("killed")["progress"]["step"] == 1  # what it logged is still there
    store.close()


RUN_CONFIG = '{"recipe": "grpo", "settings": {}}'


def run_folder(path):
    """A folder as a run makes it: its config.json names a recipe (what makes it deletable)."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(RUN_CONFIG)
    return path


def stale_run(store: SqliteRunStore, name: str) -> None:
    """A run created long ago that never wrote again: lost under the default threshold."""
    # the config its folder holds (run_folder): the record a run's own process wrote
    store.create_run(name, json.loads(RUN_CONFIG),
                     started=time.time() - 10 * LOST_AFTER_SECONDS)


def test_runs_list_shows_lost_runs_and_prints_json(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # one table row per line
    runs_dir = tmp_path / "runs"
    with SqliteRunStore(runs_dir / "posttrain.db") as store:
        stale_run(store, "old")
        store.create_run("live", {})
    assert main(["runs", "list", "--runs-dir", str(runs_dir)]) == 0
    table = capsys.readouterr().out
    assert "lost (silent 15 min)" in table and "running" in table
    assert main(["runs", "list", "--runs-dir", str(runs_dir), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {run["name"]: run["status"] for run in listed["runs"]} == {
        "old": "lost", "live": "running"}


def test_runs_list_on_an_empty_folder_creates_nothing(tmp_path, capsys):
    assert main(["runs", "list", "--runs-dir", str(tmp_path / "none")]) == 0
    assert "no runs recorded" in capsys.readouterr().out
    assert not (tmp_path / "none").exists()


def test_runs_delete_removes_the_record_and_the_folder_and_refuses_a_live_run(tmp_path, capsys):
    runs_dir = tmp_path / "runs"
    with SqliteRunStore(runs_dir / "posttrain.db") as store:
        for name in ("done-run", "live-run"):
            store.create_run(name, json.loads(RUN_CONFIG))
            store.log_metrics(name, 1, {"loss": 0.5})
            run_folder(runs_dir / name)
            (runs_dir / name / "report.md").write_text("# report\n")
        store.finish_run("done-run", {}, "done")

    assert main(["runs", "delete", "done-run", "--runs-dir", str(runs_dir)]) == 0
    assert "deleted run 'done-run'" in capsys.readouterr().out
    assert not (runs_dir / "done-run").exists()

    assert main(["runs", "delete", "live-run", "--runs-dir", str(runs_dir)]) == 2
    error = capsys.readouterr().err
    assert "still running" in error and "force" in error
    assert (runs_dir / "live-run" / "report.md").exists()  # nothing removed
    with SqliteRunStore(runs_dir / "posttrain.db") as store:
        assert store.get_run("live-run")["metric_names"] == ["loss"]
        assert store.get_run("done-run") is None
        assert store.metric_series("done-run", "loss")["count"] == 0  # curves went too

    assert main(["runs", "delete", "live-run", "--force", "--runs-dir", str(runs_dir)]) == 0
    assert main(["runs", "delete", "nosuch", "--runs-dir", str(runs_dir)]) == 2
    assert "no run named 'nosuch'" in capsys.readouterr().err
    assert main(["runs", "delete", "../escape", "--runs-dir", str(runs_dir)]) == 2
    assert "not allowed" in capsys.readouterr().err


def test_deleting_a_symlinked_run_folder_removes_the_link_not_its_target(tmp_path):
    runs_dir = tmp_path / "runs"
    elsewhere = run_folder(tmp_path / "keep-me")  # a run kept on another disk, say
    (elsewhere / "precious.txt").write_text("x")
    with SqliteRunStore(runs_dir / "posttrain.db") as store:
        stale_run(store, "linked")
    (runs_dir / "linked").symlink_to(elsewhere, target_is_directory=True)
    assert main(["runs", "delete", "linked", "--runs-dir", str(runs_dir)]) == 0
    assert not (runs_dir / "linked").exists() and (elsewhere / "precious.txt").exists()


def test_the_store_refuses_to_delete_a_run_that_still_beats(tmp_path):
    with SqliteRunStore(tmp_path / "posttrain.db") as store:
        store.create_run("alive", {})
        with pytest.raises(RunStillAlive, match="still running"):
            store.delete_run("alive")
        assert store.delete_run("alive", force=True) is True
        assert store.delete_run("alive") is False


def post(server, path: str, body: object, token: str | None = "tok",
         content_type: str = "application/json") -> tuple[int, dict]:
    connection = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
    headers = {"Content-Type": content_type}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    connection.request("POST", path, json.dumps(body).encode(), headers)
    response = connection.getresponse()
    answer = json.loads(response.read() or b"{}")
    connection.close()
    return response.status, answer


def test_the_delete_endpoint_checks_token_content_type_and_liveness(tmp_path):
    runs_dir = tmp_path / "runs"
    with SqliteRunStore(runs_dir / "posttrain.db") as store:
        stale_run(store, "old")
        store.create_run("live", {})
    run_folder(runs_dir / "old")
    server = serve(runs_dir / "posttrain.db", port=0, token="tok")
    thread = start_in_thread(server)
    try:
        assert post(server, "/api/runs/old/delete", {}, token=None)[0] == 401
        assert post(server, "/api/runs/old/delete", {}, content_type="text/plain")[0] == 415
        assert post(server, "/api/runs/old/delete", {"force": "yes"})[0] == 400
        status, answer = post(server, "/api/runs/live/delete", {})
        assert status == 409 and "still running" in answer["error"]["message"]
        assert post(server, "/api/runs/nosuch/delete", {})[0] == 404
        status, answer = post(server, "/api/runs/old/delete", {})
        assert status == 200 and answer == {"ok": True, "deleted": "old", "record": True,
                                            "folder": True}
        assert not (runs_dir / "old").exists()
        assert [run["name"] for run in server.store.list_runs()] == ["live"]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_runs_export_writes_the_whole_record_as_one_json_file(tmp_path, capsys):
    from posttrain.envs import get_env
    from posttrain.score.rows import grade, save_rows
    from posttrain.ui.demo_runs import write_finished_run

    runs_dir = tmp_path / "runs"
    with SqliteRunStore(runs_dir / "posttrain.db") as store:
        summary = write_finished_run(store, "finished")
        series = store.metric_series("finished", "loss")
    env = get_env("refund")
    rows = grade(env, env.write_prompts(6, seed=0), env.scripted_agent(0), k=2)
    (runs_dir / "finished").mkdir()
    save_rows(runs_dir / "finished" / "holdout_before.jsonl", rows)

    out = tmp_path / "export.json"
    assert main(["runs", "export", "finished", "--out", str(out), "--runs-dir",
                 str(runs_dir)]) == 0
    record = json.loads(out.read_text())
    assert record["run"]["status"] == "done"
    assert record["run"]["summary"]["delta"] == summary["delta"]
    assert record["metrics"]["loss"]["steps"] == series["steps"]  # full resolution
    assert len(record["metrics"]["loss"]["values"]) == series["count"]
    assert record["rows"]["holdout_before.jsonl"] == json.loads(json.dumps(rows))
    assert main(["runs", "export", "nosuch", "--runs-dir", str(runs_dir)]) == 2
    assert "no run named 'nosuch'" in capsys.readouterr().err


def test_a_folder_that_is_no_run_is_never_deleted(tmp_path, capsys):
    """The second hostile probe: `runs delete src --runs-dir proj` (and the dashboard's
    delete route) removed a source folder that was never a run."""
    project = tmp_path / "proj"
    (project / "src").mkdir(parents=True)
    (project / "src" / "main.py").write_text("print('mine')\n")
    with SqliteRunStore(project / "posttrain.db") as store:  # `posttrain ui` made one
        stale_run(store, "other")
    assert main(["runs", "delete", "src", "--runs-dir", str(project)]) == 2
    assert "is not a posttrain run" in capsys.readouterr().err
    assert (project / "src" / "main.py").exists()
    server = serve(project / "posttrain.db", port=0, token="tok")
    thread = start_in_thread(server)
    try:
        status, answer = post(server, "/api/runs/src/delete", {})
        assert status == 404 and "is not a posttrain run" in answer["error"]["message"]
        # a remote caller learns nothing of this machine's folders
        assert str(tmp_path) not in answer["error"]["message"]
        status, answer = post(server, "/api/runs/nosuch/delete", {})
        assert status == 404 and answer["error"]["message"] == "no run named 'nosuch'"
    finally:
        server.shutdown()
        thread.join(timeout=10)
    assert (project / "src" / "main.py").exists()
    # a run's own folder (its config.json names a recipe) goes, with or without a record
    (project / "orphan").mkdir()
    (project / "orphan" / "config.json").write_text('{"recipe": "grpo", "settings": {}}')
    assert main(["runs", "delete", "orphan", "--runs-dir", str(project)]) == 0
    assert not (project / "orphan").exists()


def test_a_delete_that_fails_part_way_keeps_the_record_to_retry(tmp_path, capsys, monkeypatch):
    runs_dir = tmp_path / "runs"
    with SqliteRunStore(runs_dir / "posttrain.db") as store:
        stale_run(store, "stuck")
    run_folder(runs_dir / "stuck")
    (runs_dir / "stuck" / "holdout_after.jsonl").write_text("{}\n")

    def refuse(path, *args, **kwargs):  # what an immutable file (chattr +i) makes rmtree do
        raise PermissionError(1, "Operation not permitted", str(path))

    monkeypatch.setattr("posttrain.runs.removal.shutil.rmtree", refuse)
    assert main(["runs", "delete", "stuck", "--runs-dir", str(runs_dir)]) == 2
    error = capsys.readouterr().err
    assert "could not remove" in error and "deleting 'stuck' again retries" in error
    with SqliteRunStore(runs_dir / "posttrain.db") as store:
        assert store.get_run("stuck") is not None  # the record waits for the retry
    monkeypatch.undo()
    assert main(["runs", "delete", "stuck", "--runs-dir", str(runs_dir)]) == 0
    assert not (runs_dir / "stuck").exists()


def test_overwrite_removes_only_a_run_folder(tmp_path, capsys):
    from posttrain.runs.folder import check_new_run, create_run_folder

    mine = tmp_path / "notes"
    mine.mkdir()
    (mine / "todo.txt").write_text("keep\n")
    with pytest.raises(PosttrainError, match="is not a posttrain run"):
        check_new_run(tmp_path, "notes", overwrite=True)
    # the recipe says so before anything loads
    assert main(["grpo", "--run-name", "notes", "--overwrite", "--runs-dir", str(tmp_path),
                 "--base-model", "no-such-model"]) == 2
    assert "--overwrite: " in capsys.readouterr().err
    assert (mine / "todo.txt").exists()
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text('{"recipe": "grpo", "settings": {}}')
    new = check_new_run(tmp_path, "run", overwrite=True)
    assert (run / "config.json").exists()  # kept until the model has loaded
    create_run_folder(new)
    assert run.is_dir() and not (run / "config.json").exists()
    new.finish()


# --- liveness: a run another process writes is never shared, replaced or deleted ----------

def live_run_folder(root, name: str, *, with_config: bool = True):
    """A run folder whose lock is held, as a recipe's process holds it while it runs
    (flock locks belong to an open file: held here, they refuse this process too)."""
    from posttrain.runs.claim import try_claim

    folder = root / name
    folder.mkdir(parents=True)
    if with_config:
        (folder / "config.json").write_text('{"recipe": "grpo", "settings": {}}')
    claim = try_claim(folder)
    assert claim is not None
    return claim


def test_a_second_start_under_a_live_name_is_refused_before_any_model_loads(tmp_path, capsys):
    claim = live_run_folder(tmp_path, "busy", with_config=False)  # loading its model now
    try:
        for extra in ([], ["--overwrite"]):
            assert main(["grpo", "--run-name", "busy", "--runs-dir", str(tmp_path),
                         "--base-model", "no-such-model", *extra]) == 2
            error = capsys.readouterr().err
            assert "being written by another process" in error, error
            assert "no-such-model" not in error  # refused before the load
    finally:
        claim.release()
    # the process that held it is gone: its empty folder no longer blocks the name, and a
    # start that fails to load its model gives the name back
    assert main(["grpo", "--run-name", "busy", "--runs-dir", str(tmp_path),
                 "--base-model", "no-such-model"]) == 2
    assert "no-such-model" in capsys.readouterr().err
    assert not (tmp_path / "busy").exists()


def test_overwrite_and_delete_refuse_a_live_run_even_when_forced(tmp_path, capsys):
    claim = live_run_folder(tmp_path, "ow")
    try:
        assert main(["grpo", "--run-name", "ow", "--overwrite", "--runs-dir", str(tmp_path),
                     "--base-model", "no-such-model"]) == 2
        assert "being written by another process" in capsys.readouterr().err
        SqliteRunStore(tmp_path / "posttrain.db").close()
        assert main(["runs", "delete", "ow", "--force", "--runs-dir", str(tmp_path)]) == 2
        assert "stop it first" in capsys.readouterr().err
        assert (tmp_path / "ow" / "config.json").exists()
    finally:
        claim.release()
    assert main(["runs", "delete", "ow", "--runs-dir", str(tmp_path)]) == 0
    assert not (tmp_path / "ow").exists()


def test_two_processes_starting_one_name_at_once_get_one_run(tmp_path):
    """Two real `posttrain grpo` processes race for one run name: one takes it, the other
    is refused with one line before it loads a model (no FileExistsError traceback)."""
    command = [sys.executable, "-m", "posttrain", "grpo", "--run-name", "race",
               "--runs-dir", str(tmp_path), "--base-model", "starter-2m"]  # killed below
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (tmp_path / "race" / "run.lock").exists():  # the first has taken the name
        assert time.monotonic() < deadline and first.poll() is None, first.communicate()
        time.sleep(0.05)
    second = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert second.returncode == 2, second.stderr
    assert "being written by another process" in second.stderr
    assert "Traceback" not in second.stderr
    first.kill()
    first.communicate()
