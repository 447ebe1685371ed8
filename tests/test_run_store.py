"""The run store: SQLite back end, run handles, the metrics copy, crash safety, downsampling."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from posttrain.runs.store import (
    HttpRunStore,
    NullRun,
    RunStoreError,
    SqliteRunStore,
    check_run_name,
    default_store,
    open_run,
)

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def store(tmp_path):
    with SqliteRunStore(tmp_path / "posttrain.db") as opened:
        yield opened


def test_a_run_records_config_metrics_progress_notes_alarms_and_summary(store):
    run = open_run("grpo-1", {"base_model": "starter", "learning_rate": 2e-3}, store=store)
    run.log(1, {"reward": 0.25, "kl": 0.01})
    run.log(2, {"reward": 0.5})
    run.progress(2, 40, 19.5)
    run.note("holdout evaluated", step=2)
    run.alarm("length", 2, "holdout length grew 30% while the proxy did not", {"growth": 0.3})
    run.finish({"delta": {"delta": 0.12, "verdict": "moved"}}, status="done")

    (listed,) = store.list_runs()
    assert listed["name"] == "grpo-1" and listed["status"] == "done"
    assert listed["base_model"] == "starter"
    assert listed["last_step"] == 2 and listed["total_steps"] == 40
    assert listed["headline_delta"] == 0.12 and listed["verdict"] == "moved"

    detail = store.get_run("grpo-1")
    assert detail["config"]["learning_rate"] == 2e-3  # not rounded on the way in
    assert detail["progress"] == {"step": 2, "total": 40, "eta": None}  # eta cleared on finish
    assert detail["notes"][0]["text"] == "holdout evaluated"
    assert detail["alarms"][0]["kind"] == "length"
    assert detail["alarms"][0]["details"] == {"growth": 0.3}
    assert detail["metric_names"] == ["kl", "reward"]
    series = store.metric_series("grpo-1", "reward")
    assert series["steps"] == [1, 2] and series["values"] == [0.25, 0.5]


def test_the_run_list_finds_the_base_model_in_the_recipes_config_layout(store):
    open_run("nested", {"recipe": "grpo", "settings": {"base_model": "smollm2"}}, store=store)
    assert store.list_runs()[0]["base_model"] == "smollm2"


def test_non_finite_boolean_and_text_values_are_dropped(store):
    run = open_run("clean", {}, store=store)
    run.log(0, {"loss": 1.5, "nan": float("nan"), "inf": float("inf"), "flag": True, "s": "x"})
    assert store.metric_names("clean") == ["loss"]


def test_a_value_logged_twice_at_one_step_keeps_the_later_one(store):
    run = open_run("twice", {}, store=store)
    run.log(3, {"loss": 1.0})
    run.log(3, {"loss": 0.5})
    assert store.metric_series("twice", "loss")["values"] == [0.5]


def test_reopening_a_run_name_replaces_the_old_run(store):
    open_run("again", {"attempt": 1}, store=store).log(5, {"loss": 9.0})
    open_run("again", {"attempt": 2}, store=store)
    detail = store.get_run("again")
    assert detail["config"] == {"attempt": 2}
    assert detail["metric_names"] == [] and detail["status"] == "running"


def test_a_second_finish_is_ignored_and_a_bad_status_is_refused(store, capsys):
    run = open_run("fin", {}, store=store)
    with pytest.raises(ValueError, match="status"):
        run.finish(status="crashed")
    run.finish({"a": 1}, status="stopped")
    run.finish({"b": 2}, status="done")
    assert "already finished" in capsys.readouterr().err
    detail = store.get_run("fin")
    assert detail["status"] == "stopped" and detail["summary"] == {"a": 1}


def test_the_store_merges_summaries_of_successive_finish_ops(store):
    store.create_run("merge", {})
    store.finish_run("merge", {"before": 0.2}, "stopped")
    store.finish_run("merge", {"after": 0.4}, "done")
    detail = store.get_run("merge")
    assert detail["summary"] == {"before": 0.2, "after": 0.4} and detail["status"] == "done"


@pytest.mark.parametrize("name", ["../x", "a/b", ".hidden", "", "a\\b", "x" * 129, "a b"])
def test_run_names_that_could_escape_the_runs_folder_are_refused(store, tmp_path, name):
    with pytest.raises(RunStoreError):
        open_run(name, {}, store=store, run_dir=tmp_path / "never")
    assert store.list_runs() == []
    assert not (tmp_path / "never").exists()


def test_plain_run_names_are_accepted():
    for name in ("grpo-starter_2024.06.01", "a", "-dash", "run..2"):
        assert check_run_name(name) == name


def test_the_run_folder_gets_a_jsonl_copy_of_every_metric_row(store, tmp_path):
    run = open_run("copy", {}, store=store, run_dir=tmp_path / "copy")
    run.log(1, {"reward": 0.1})
    run.log(2, {"reward": 0.2, "nan": float("nan")})
    run.finish()
    lines = (tmp_path / "copy" / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert [(r["step"], r["metrics"]) for r in rows] == [(1, {"reward": 0.1}), (2, {"reward": 0.2})]
    assert all(isinstance(r["time"], float) for r in rows)


def test_leaving_a_with_block_on_an_error_marks_the_run_failed(store):
    with pytest.raises(RuntimeError), open_run("boom", {}, store=store) as run:
        run.log(0, {"loss": 1.0})
        raise RuntimeError("out of memory")
    detail = store.get_run("boom")
    assert detail["status"] == "failed"
    assert detail["summary"]["error"] == "RuntimeError: out of memory"


def test_storage_trouble_warns_once_and_never_stops_training(tmp_path, capsys):
    broken = SqliteRunStore(tmp_path / "posttrain.db")
    run = open_run("fragile", {}, store=broken)
    broken.close()  # every later write fails with sqlite3.ProgrammingError
    for step in range(5):
        run.log(step, {"loss": 1.0})
    run.progress(5, 10)
    run.finish()
    assert capsys.readouterr().err.count("run store could not") == 1


def test_null_run_accepts_every_call_and_records_nothing():
    run = NullRun()
    with run:
        run.log(0, {"loss": 1.0})
        run.progress(0, 10, 5.0)
        run.note("x")
        run.alarm("feature", 0, "m", {})
    run.finish({"a": 1}, status="done")
    assert run.url is None


def test_default_store_is_the_sqlite_file_under_the_runs_root(tmp_path, monkeypatch):
    monkeypatch.delenv("POSTTRAIN_SERVER", raising=False)
    chosen = default_store(tmp_path / "runs")
    assert isinstance(chosen, SqliteRunStore)
    assert chosen.path == tmp_path / "runs" / "posttrain.db" and chosen.path.exists()
    chosen.close()


def test_default_store_posts_to_the_server_when_posttrain_server_is_set(monkeypatch):
    monkeypatch.setenv("POSTTRAIN_SERVER", "http://127.0.0.1:9/")
    monkeypatch.setenv("POSTTRAIN_TOKEN", "secret")
    chosen = default_store("unused")
    assert isinstance(chosen, HttpRunStore)
    assert chosen.server_url == "http://127.0.0.1:9" and chosen.token == "secret"
    chosen.close_timeout = 0.1
    chosen.close()


def test_the_file_is_in_wal_mode_and_a_second_reader_sees_live_writes(store):
    run = open_run("live", {}, store=store)
    run.log(1, {"loss": 1.0})
    with SqliteRunStore(store.path) as reader:  # what the dashboard process does
        assert reader.metric_series("live", "loss")["count"] == 1
        run.log(2, {"loss": 0.5})
        assert reader.metric_series("live", "loss")["count"] == 2
    mode = store._writer.execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


WRITER_SCRIPT = textwrap.dedent("""
    import sys, time
    from posttrain.runs.store import SqliteRunStore, open_run
    store = SqliteRunStore(sys.argv[1])
    run = open_run("killed", {"base_model": "starter"}, store=store, run_dir=sys.argv[2])
    step = 0
    while True:
        run.log(step, {"loss": 1.0 / (step + 1), "reward": step / 1000})
        run.progress(step, 1000)
        print(step, flush=True)  # printed only after the write returned (committed)
        step += 1
        time.sleep(0.002)
""")


def test_what_was_logged_before_the_writer_was_killed_survives(tmp_path):
    database, run_dir = tmp_path / "posttrain.db", tmp_path / "killed"
    environment = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER_SCRIPT, str(database), str(run_dir)],
        stdout=subprocess.PIPE, text=True, env=environment,
    )
    last_acknowledged = -1
    deadline = time.monotonic() + 120  # a bound for a loaded machine
    try:
        while last_acknowledged < 50 and time.monotonic() < deadline:
            line = writer.stdout.readline()
            if not line:
                break
            last_acknowledged = int(line)
    finally:
        writer.send_signal(signal.SIGKILL)  # no cleanup, no atexit, no flush
        writer.wait(10)
        writer.stdout.close()
    assert writer.returncode == -signal.SIGKILL
    assert last_acknowledged >= 50

    with SqliteRunStore(database) as reader:
        steps = reader.metric_series("killed", "loss")["steps"]
        detail = reader.get_run("killed")
    assert steps[: last_acknowledged + 1] == list(range(last_acknowledged + 1))
    assert detail["status"] == "running" and detail["config"] == {"base_model": "starter"}
    copied = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert len(copied) >= last_acknowledged + 1
    assert all(json.loads(line)["metrics"] for line in copied)  # no torn line


def test_thinning_keeps_spikes_dips_and_both_ends(store):
    store.create_run("long", {})
    values = [0.5] * 100_000
    values[31_337], values[77_001] = 9.0, -4.0  # one spike, one dip
    store.apply([{"op": "metrics", "run": "long", "step": step, "metrics": {"loss": value}}
                 for step, value in enumerate(values)])
    for budget in (2000, 1000, 7):
        thinned = store.metric_series("long", "loss", max_points=budget)
        assert thinned["count"] == 100_000 and len(thinned["steps"]) <= budget
        assert thinned["steps"][0] == 0 and thinned["steps"][-1] == 99_999
        assert 9.0 in thinned["values"] and -4.0 in thinned["values"]
        assert thinned["steps"] == sorted(thinned["steps"])
    # the kept points are stored points: their values at their steps
    thinned = store.metric_series("long", "loss", max_points=2000)
    kept = zip(thinned["steps"], thinned["values"], strict=True)
    assert all(values[step] == value for step, value in kept)


def test_thinning_leaves_short_series_alone_and_handles_tiny_budgets(store):
    store.create_run("short", {})
    store.apply([{"op": "metrics", "run": "short", "step": step, "metrics": {"x": value}}
                 for step, value in ((1, 3.0), (2, 1.0), (3, 2.0))])

    def thinned(budget):
        series = store.metric_series("short", "x", max_points=budget)
        return series["steps"], series["values"]

    assert thinned(5) == ([1, 2, 3], [3.0, 1.0, 2.0])
    assert thinned(1) == ([3], [2.0])
    assert thinned(2) == ([1, 3], [3.0, 2.0])
    assert thinned(3) == ([1, 2, 3], [3.0, 1.0, 2.0])
    assert store.metric_series("short", "x", max_points=2, after_step=1)["steps"] == [2, 3]


def test_metric_series_downsamples_on_request_and_reads_incrementally(store):
    store.create_run("long", {})
    store.apply([{"op": "metrics", "run": "long", "step": step, "metrics": {"loss": float(step)}}
                 for step in range(5000)])
    thinned = store.metric_series("long", "loss", max_points=100)
    assert thinned["count"] == 5000 and len(thinned["steps"]) <= 100 and thinned["downsampled"]
    assert thinned["steps"][-1] == 4999
    newer = store.metric_series("long", "loss", after_step=4997)
    assert newer["steps"] == [4998, 4999] and not newer["downsampled"]


def test_an_unknown_eta_is_stored_as_none(store):
    run = open_run("eta-nan", {}, store=store)
    run.progress(1, 10, float("nan"))
    assert store.get_run("eta-nan")["progress"] == {"step": 1, "total": 10, "eta": None}


def test_both_back_ends_refuse_a_bad_op_at_the_call(store):
    remote = HttpRunStore("http://127.0.0.1:9", None, close_timeout=0.1)
    try:
        for back_end in (store, remote):
            with pytest.raises(RunStoreError, match="status"):
                back_end.finish_run("x", {}, status="exploded")
        assert remote.pending == 0  # nothing queued that would poison a batch
    finally:
        remote.close()


@pytest.mark.parametrize(("op", "fragment"), [
    ({"op": ["create"], "run": "r", "config": {}}, "unknown op"),  # was a TypeError
    ({"op": "create", "run": "r", "config": {"a": {"b": [1.0, float("nan")]}}},
     "'config': a: b: [1]: nan is not a finite number"),
    ({"op": "finish", "run": "r", "status": "done", "summary": {"x": float("inf")}},
     "'summary': x: inf is not a finite number"),
    ({"op": "alarm", "run": "r", "kind": "hack", "step": 1, "message": "m",
      "details": {1: "x"}}, "key 1 is not a string"),
])
def test_ops_that_cannot_be_stored_as_strict_json_are_refused(store, op, fragment):
    from posttrain.runs.ops import RunStoreError

    with pytest.raises(RunStoreError, match=re.escape(fragment)):
        store.apply([op])
    assert store.list_runs() == []


def test_graded_replies_of_a_check_are_kept_bounded_and_go_with_the_run(store):
    from posttrain.runs.ops import MAX_SAMPLE_ROWS, RunStoreError

    run = open_run("checked", {}, store=store, heartbeat_seconds=None)
    rows = [{"prompt": f"p{i}", "reply": "x" * 10_000, "score": 1.0, "reward": 1,
             "category": "with_id", "secret_column": "dropped"} for i in range(100)]
    run.samples(10, rows, "monitor")
    run.samples(10, rows[:2], "rollouts")
    kept = store.sample_rows("checked", "monitor", 10)
    assert len(kept) == MAX_SAMPLE_ROWS and "secret_column" not in kept[0]
    assert len(kept[0]["reply"]) < 5000  # long texts are cut for the view
    assert store.get_run("checked")["sample_checks"] == [
        {"source": "monitor", "step": 10, "time": store.get_run("checked")["sample_checks"][0]
         ["time"], "count": MAX_SAMPLE_ROWS},
        {"source": "rollouts", "step": 10, "time": store.get_run("checked")["sample_checks"][1]
         ["time"], "count": 2}]
    with pytest.raises(RunStoreError, match="at most 64"):
        store.apply([{"op": "samples", "run": "checked", "step": 1, "source": "monitor",
                      "rows": [{}] * 65}])
    with pytest.raises(RunStoreError, match="source"):
        store.apply([{"op": "samples", "run": "checked", "step": 1, "source": "elsewhere",
                      "rows": []}])
    run.finish()
    open_run("checked", {}, store=store, heartbeat_seconds=None).finish()  # a new run, same name
    assert store.sample_checks("checked") == []


def write_curve(store, run: str, values: list[float], metric: str = "loss") -> None:
    store.create_run(run, {})
    store.apply([{"op": "metrics", "run": run, "step": step, "metrics": {metric: value}}
                 for step, value in enumerate(values)])


def test_tiles_keep_thinning_exact_when_a_point_is_overwritten(store):
    write_curve(store, "rewritten", [0.5] * 20_000)
    store.log_metrics("rewritten", 5000, {"loss": -9.0})  # a dip, logged...
    assert -9.0 in store.metric_series("rewritten", "loss", max_points=100)["values"]
    store.log_metrics("rewritten", 5000, {"loss": 0.5})  # ...then overwritten
    thinned = store.metric_series("rewritten", "loss", max_points=100)
    assert -9.0 not in thinned["values"] and len(thinned["steps"]) <= 100
    store.log_metrics("rewritten", 12_345, {"loss": 7.0})  # a spike by overwrite
    assert 7.0 in store.metric_series("rewritten", "loss", max_points=100)["values"]


@given(values=st.lists(st.floats(-1e6, 1e6), min_size=300, max_size=3000),
       budget=st.integers(4, 60))  # under 4 points the ends and both extremes cannot all fit
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_thinned_curves_keep_the_extremes_and_both_ends_whatever_the_series(store, values,
                                                                          budget):
    write_curve(store, "random", values)
    thinned = store.metric_series("random", "loss", max_points=budget)
    steps, kept = thinned["steps"], thinned["values"]
    assert len(steps) <= budget and steps == sorted(set(steps))
    assert steps[0] == 0 and steps[-1] == len(values) - 1
    assert min(values) in kept and max(values) in kept
    assert all(values[step] == value for step, value in zip(steps, kept, strict=True))


def test_a_budget_under_four_points_keeps_the_ends(store):
    write_curve(store, "tiny-budget", [0.0] * 150 + [1.0] + [0.0] * 149)
    for budget, expected in ((3, [0, 299]), (2, [0, 299]), (1, [299])):
        assert store.metric_series("tiny-budget", "loss", max_points=budget)["steps"] == expected
    assert 1.0 in store.metric_series("tiny-budget", "loss", max_points=4)["values"]


def test_a_store_written_before_tiles_gets_them_when_opened(tmp_path):
    import sqlite3

    from posttrain.runs.sqlite_store import SCHEMA_VERSION

    path = tmp_path / "posttrain.db"
    with SqliteRunStore(path) as store:
        write_curve(store, "old", [float(step % 97) for step in range(30_000)])
        expected = store.metric_series("old", "loss", max_points=200)
    connection = sqlite3.connect(path)  # as a store of schema 1 left it: no tiles
    connection.execute("DROP TABLE metric_tiles")
    connection.execute("PRAGMA user_version=1")
    connection.commit()
    connection.close()
    with SqliteRunStore(path) as store:
        assert store.metric_series("old", "loss", max_points=200) == expected
    connection = sqlite3.connect(path)
    assert connection.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert connection.execute("SELECT count(*) FROM metric_tiles").fetchone()[0] == 469
    connection.close()


def _open_and_write(path: str, name: str) -> None:
    with SqliteRunStore(path) as store:
        store.create_run(name, {})
        store.log_metrics(name, 0, {"reward": 1.0})


def test_eight_processes_opening_a_new_store_at_once_all_write(tmp_path):
    # the first opener creates the tables; the others must wait for it, not take its
    # half-made store for an old one to back up and migrate
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    path = str(tmp_path / "fresh" / "posttrain.db")
    workers = [context.Process(target=_open_and_write, args=(path, f"run-{i}"))
               for i in range(8)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
    assert [worker.exitcode for worker in workers] == [0] * 8
    with SqliteRunStore(path) as store:
        assert len(store.list_runs()) == 8
    assert not list((tmp_path / "fresh").glob("*.bak")) and not list(
        (tmp_path / "fresh").glob("*.partial"))


def test_a_step_with_thousands_of_metrics_and_some_replaced_keeps_every_value(tmp_path):
    with SqliteRunStore(tmp_path / "posttrain.db") as store:
        store.create_run("wide", {})
        first = {f"m{index}": float(index) for index in range(1200)}
        store.log_metrics("wide", 3, first)
        store.log_metrics("wide", 3, {"m5": -1.0, "m1100": 99.0, "new": 7.0})
        assert len(store.metric_names("wide")) == 1201
        assert store.metric_series("wide", "m5")["values"] == [-1.0]
        assert store.metric_series("wide", "m1100")["values"] == [99.0]
        assert store.metric_series("wide", "m7")["values"] == [7.0]
        thinned = store.metric_series("wide", "m5", max_points=1)
        assert thinned["values"] == [-1.0]
