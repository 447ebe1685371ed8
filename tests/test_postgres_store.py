"""The run store on a real PostgreSQL server (started by the suite, see postgres_server.py):
the same answers as the SQLite store, batches applied once, eight writers at once, a
database restart mid-run with no point lost, clear errors, and the CLI and dashboard on it."""

from __future__ import annotations

import json
import multiprocessing
import sys
import time
import urllib.request

import pytest

from posttrain.cli import main
from posttrain.runs.http_store import HttpRunStore
from posttrain.runs.ops import RunStoreError, StoreUnreachable
from posttrain.runs.postgres_store import PostgresRunStore, is_postgres_url, redacted
from posttrain.runs.server import serve, start_in_thread
from posttrain.runs.sqlite_store import SqliteRunStore
from posttrain.runs.store import STORE_ENV, default_store, open_run
from tests.test_dashboard import browser, page  # noqa: F401 (the browser's fixtures)

T0 = 1_700_000_000.0


def write_a_run(store, name: str = "alpha", points: int = 300) -> None:
    """Every kind of op, with fixed times, so two stores can be compared field by field."""
    store.create_run(name, {"recipe": "grpo", "settings": {"base_model": "starter"}},
                     started=T0)
    for step in range(points):
        wave = ((step * 37) % 101) / 100.0
        store.log_metrics(name, step, {"reward": wave, "loss": 1.0 / (step + 1)},
                          timestamp=T0 + step)
    store.log_metrics(name, 7, {"reward": -5.0}, timestamp=T0 + 999)  # a value replaced
    store.set_progress(name, points - 1, points, 12.5, timestamp=T0 + points)
    store.add_note(name, "first note", 3, timestamp=T0 + 3)
    store.add_note(name, "second note", None, timestamp=T0 + 4)
    store.add_alarm(name, "hack", 10, "replies grew", {"feature": "length", "z": 3.5},
                    timestamp=T0 + 10)
    store.log_samples(name, 10, [{"prompt": "p", "reply": "r", "score": 1.0}],
                      timestamp=T0 + 10)
    store.log_samples(name, 20, [{"prompt": "q", "reply": "s", "score": 0.0}] * 3,
                      source="rollouts", timestamp=T0 + 20)
    store.finish_run(name, {"delta": {"delta": 0.25, "verdict": "moved"}}, "done",
                     timestamp=T0 + points + 1)


def everything(store, name: str = "alpha") -> dict:
    run = store.get_run(name)
    curves = {}
    for metric in run["metric_names"]:
        curves[metric] = {
            "full": store.metric_series(name, metric),
            "thinned": store.metric_series(name, metric, max_points=40),
            "tail": store.metric_series(name, metric, after_step=250, max_points=10),
            "tiny": store.metric_series(name, metric, max_points=3),
        }
    samples = {(check["source"], check["step"]): store.sample_rows(name, check["source"],
                                                                    check["step"])
               for check in run["sample_checks"]}
    return {"list": store.list_runs(), "run": run, "curves": curves, "samples": samples}


def test_postgres_answers_exactly_as_sqlite(postgres_url, tmp_path):
    sqlite = SqliteRunStore(tmp_path / "posttrain.db")
    postgres = PostgresRunStore(postgres_url)
    try:
        for store in (sqlite, postgres):
            write_a_run(store)
            write_a_run(store, "beta", points=5000)  # long enough to be drawn from tiles
        assert everything(postgres) == everything(sqlite)
        assert everything(postgres, "beta") == everything(sqlite, "beta")
        thinned = postgres.metric_series("beta", "reward", max_points=100)
        assert thinned["downsampled"] and thinned["count"] == 5000
        assert min(thinned["values"]) == -5.0 and max(thinned["values"]) == 1.0  # spikes kept
        for store in (sqlite, postgres):
            assert store.delete_run("alpha") is True
            assert store.delete_run("alpha") is False
        assert [run["name"] for run in postgres.list_runs()] == ["beta"]
        assert postgres.get_run("alpha") is None
        assert postgres.metric_series("alpha", "reward")["count"] == 0
    finally:
        sqlite.close()
        postgres.close()


def test_a_batch_sent_twice_is_applied_once(postgres_url):
    with PostgresRunStore(postgres_url, hold_when_down=False) as store:
        store.create_run("once", {}, started=T0)
        batch = [{"op": "note", "run": "once", "text": "hello", "step": 1, "time": T0}]
        assert store.apply(batch, batch_id="b-1") == 1
        assert store.apply(batch, batch_id="b-1") == 0
        assert [note["text"] for note in store.get_run("once")["notes"]] == ["hello"]


def test_a_live_run_is_refused_deletion_and_reads_lost_when_silent(postgres_url):
    with PostgresRunStore(postgres_url, lost_after_seconds=60) as store:
        store.create_run("live", {})
        with pytest.raises(RunStoreError, match="still running"):
            store.delete_run("live")
        store.create_run("silent", {}, started=time.time() - 3600)
        statuses = {run["name"]: run["status"] for run in store.list_runs()}
        assert statuses == {"live": "running", "silent": "lost"}


def _writer(url: str, name: str, points: int) -> None:
    with PostgresRunStore(url) as store:
        store.create_run(name, {"writer": name})
        for step in range(points):
            store.log_metrics(name, step, {"reward": step / points, "loss": 1.0})
        store.finish_run(name, {"points": points})


def test_eight_processes_write_at_once_while_the_dashboard_reads(postgres_url):
    points = 150
    context = multiprocessing.get_context("spawn")
    writers = [context.Process(target=_writer, args=(postgres_url, f"run-{i}", points))
               for i in range(8)]
    for process in writers:
        process.start()
    reads = 0
    with PostgresRunStore(postgres_url) as reader:
        while any(process.is_alive() for process in writers):
            for run in reader.list_runs():
                reader.metric_series(run["name"], "reward", max_points=50)
            reads += 1
        for process in writers:
            process.join(timeout=120)
            assert process.exitcode == 0
        runs = reader.list_runs()
        assert sorted(run["name"] for run in runs) == [f"run-{i}" for i in range(8)]
        assert all(run["status"] == "done" for run in runs)
        for run in runs:
            series = reader.metric_series(run["name"], "reward")
            assert series["count"] == points and series["steps"] == list(range(points))
    assert reads >= 1


def test_a_database_restart_mid_run_loses_no_point(postgres_server, postgres_url, tmp_path,
                                                   capfd):
    run = open_run("restarted", {"recipe": "grpo"}, run_dir=tmp_path / "restarted",
                   store_url=postgres_url, heartbeat_seconds=None)
    for step in range(20):
        run.log(step, {"reward": step / 10})
    postgres_server.stop()
    try:
        for step in range(20, 40):  # the database is down: held, training goes on
            run.log(step, {"reward": step / 10})
        run.note("written while the database was down", step=39)
        assert run.store.held_ops() > 0
    finally:
        postgres_server.start()
    time.sleep(2.5)  # past the reconnect interval
    for step in range(40, 60):
        run.log(step, {"reward": step / 10})
    run.finish({"ok": True})
    err = capfd.readouterr().err
    assert "cannot be reached" in err and "holding this run's records" in err
    assert "answers again" in err
    with PostgresRunStore(postgres_url) as store:
        series = store.metric_series("restarted", "reward")
        assert series["steps"] == list(range(60))
        record = store.get_run("restarted")
        assert record["status"] == "done"
        assert [note["text"] for note in record["notes"]] == [
            "written while the database was down"]
    lines = (tmp_path / "restarted" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 60


def test_a_server_store_answers_503_while_the_database_is_down(postgres_server,
                                                               postgres_url, tmp_path):
    server = serve(postgres_url, port=0, runs_root=tmp_path)
    start_in_thread(server)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        postgres_server.stop()
        try:
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(f"{base}/api/runs", timeout=30)
            assert refused.value.code == 503
            body = json.loads(refused.value.read())
            assert "cannot be reached" in body["error"]["message"]
        finally:
            postgres_server.start()
        with urllib.request.urlopen(f"{base}/api/runs", timeout=30) as answer:
            assert json.loads(answer.read()) == {"runs": []}
    finally:
        server.shutdown()
        server.server_close()


def test_an_unreachable_database_is_one_line_without_the_password():
    url = "postgresql://me:s3cret-pw@127.0.0.1:1/nowhere"
    with pytest.raises(StoreUnreachable) as refused:
        PostgresRunStore(url, connect_timeout=2)
    message = str(refused.value)
    assert "s3cret-pw" not in message and "postgresql://me:***@127.0.0.1:1/nowhere" in message
    assert "\n" not in message
    assert redacted("postgresql://u@h/db") == "postgresql://u@h/db"
    assert is_postgres_url("postgres://h/db") and not is_postgres_url("runs/posttrain.db")


def test_the_schema_version_is_checked_and_an_old_store_migrated(postgres_url):
    import psycopg

    with PostgresRunStore(postgres_url) as store:
        write_a_run(store, points=200)
        expected = everything(store)
        assert store.schema_version() == 3
    # a store written before tiles and owners existed: version 1
    with psycopg.connect(postgres_url, autocommit=True) as connection:
        connection.execute("DROP TABLE metric_tiles")
        connection.execute("ALTER TABLE runs DROP COLUMN owner")
        connection.execute("UPDATE posttrain_schema SET version = 1")
    with PostgresRunStore(postgres_url) as store:
        assert store.schema_version() == 3
        assert everything(store) == expected
    with psycopg.connect(postgres_url, autocommit=True) as connection:
        connection.execute("UPDATE posttrain_schema SET version = 99")
    with pytest.raises(RunStoreError, match="schema 99 is newer"):
        PostgresRunStore(postgres_url)


def test_the_store_is_chosen_by_flag_or_environment(postgres_url, tmp_path, monkeypatch):
    monkeypatch.delenv(STORE_ENV, raising=False)
    store = default_store(tmp_path, postgres_url)
    assert isinstance(store, PostgresRunStore)
    store.close()
    monkeypatch.setenv(STORE_ENV, postgres_url)
    store = default_store(tmp_path)
    assert isinstance(store, PostgresRunStore)
    store.close()
    monkeypatch.setenv(STORE_ENV, str(tmp_path / "other.db"))
    store = default_store(tmp_path)
    assert isinstance(store, SqliteRunStore) and store.path == tmp_path / "other.db"
    store.close()
    monkeypatch.setenv(STORE_ENV, "mysql://h/db")
    with pytest.raises(RunStoreError, match="postgresql:// URL"):
        default_store(tmp_path)
    assert main(["runs", "list", "--runs-dir", str(tmp_path)]) == 2  # not read as a file


def test_runs_commands_and_copy_from_sqlite(postgres_url, tmp_path, capsys):
    runs_dir = tmp_path / "runs"
    with SqliteRunStore(runs_dir / "posttrain.db") as local:
        write_a_run(local, "one")
        write_a_run(local, "two", points=50)
        local.create_run("three", {}, started=T0 + 5)
        local.finish_run("three", {}, "failed", timestamp=T0 + 6)
        expected = {name: everything(local, name) for name in ("one", "two", "three")}
    assert main(["runs", "copy", "--runs-dir", str(runs_dir), "--to", postgres_url]) == 0
    out = capsys.readouterr()
    assert "copied one" in out.out and "3 of 3 runs copied" in out.err
    with PostgresRunStore(postgres_url) as shared:
        for name, record in expected.items():
            assert everything(shared, name) == record
    assert main(["runs", "copy", "two", "--runs-dir", str(runs_dir), "--to", postgres_url]) == 1
    assert "already has it" in capsys.readouterr().out
    assert main(["runs", "copy", "two", "--replace", "--runs-dir", str(runs_dir),
                 "--to", postgres_url]) == 0
    capsys.readouterr()

    assert main(["runs", "list", "--store", postgres_url, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [run["name"] for run in listed["runs"]] == ["three", "one", "two"]
    assert listed["store"] == postgres_url
    out_file = tmp_path / "one.json"
    assert main(["runs", "export", "one", "--store", postgres_url, "--runs-dir",
                 str(tmp_path / "elsewhere"), "--out", str(out_file)]) == 0
    exported = json.loads(out_file.read_text())
    assert exported["run"]["name"] == "one" and len(exported["metrics"]["reward"]["steps"]) == 300
    assert main(["runs", "delete", "two", "--store", postgres_url, "--runs-dir",
                 str(tmp_path / "elsewhere")]) == 0
    capsys.readouterr()
    assert main(["runs", "list", "--store", postgres_url]) == 0
    table = capsys.readouterr().out
    assert "one" in table and "three" in table and "two" not in table


def test_the_dashboard_api_reads_and_ingests_over_postgres(postgres_url, tmp_path):
    server = serve(postgres_url, port=0, token="tok", runs_root=tmp_path)
    start_in_thread(server)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        remote = HttpRunStore(base, "tok")
        write_a_run(remote, "posted", points=100)
        remote.close()
        with urllib.request.urlopen(f"{base}/api/runs", timeout=30) as answer:
            runs = json.loads(answer.read())["runs"]
        assert [run["name"] for run in runs] == ["posted"] and runs[0]["verdict"] == "moved"
        with urllib.request.urlopen(f"{base}/api/runs/posted/metrics?names=reward"
                                    f"&max_points=20", timeout=30) as answer:
            series = json.loads(answer.read())["series"]["reward"]
        assert series["count"] == 100 and len(series["steps"]) <= 20
    finally:
        server.shutdown()
        server.server_close()


def test_the_dashboard_in_chromium_follows_a_live_run_in_postgres(browser, page,  # noqa: F811
                                                                  postgres_url, tmp_path):
    import os
    import subprocess

    from posttrain.ui.app import dashboard_server
    from tests.test_dashboard import LIVE_WRITER, last_step

    environment = {key: value for key, value in os.environ.items()
                   if key not in ("POSTTRAIN_SERVER", "POSTTRAIN_TOKEN")}
    environment[STORE_ENV] = postgres_url  # the writer's store comes from the environment
    writer = subprocess.Popen([sys.executable, "-c", LIVE_WRITER, str(tmp_path), "pg-live"],
                              env=environment, stderr=subprocess.PIPE)
    server = dashboard_server(postgres_url, "127.0.0.1", 0, runs_root=tmp_path)
    start_in_thread(server)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        page.goto(url + "/")
        row = page.locator('tr[data-run="pg-live"]')
        row.wait_for()
        assert row.locator(".pill").inner_text() == "running"
        page.click('a[href="/runs/pg-live"]')
        page.wait_for_selector("html[data-ready]")
        first = last_step(page, "reward")
        page.wait_for_function(
            "(first) => +document.querySelector('.chart[data-metric=\"reward\"]')"
            ".dataset.lastStep >= first + 10", arg=first)
        page.locator('#alarms li[data-kind="hack"]').wait_for()
        assert writer.poll() is None, writer.stderr.read()
        assert not (tmp_path / "posttrain.db").exists()  # nothing went to a SQLite file
    finally:
        writer.kill()
        writer.wait(10)
        server.shutdown()
        server.server_close()


def test_a_recipe_writes_its_run_to_postgres(postgres_url, tmp_path, capsys):
    runs = tmp_path / "runs"
    code = main(["sft", "--base-model", "starter-2m", "--prompts", "60", "--eval-samples", "1",
                 "--eval-repeats", "2", "--steps", "2", "--batch-size", "4",
                 "--runs-dir", str(runs), "--run-name", "to-pg", "--store", postgres_url])
    assert code in (0, 1), capsys.readouterr().err
    assert not (runs / "posttrain.db").exists()
    with PostgresRunStore(postgres_url) as store:
        record = store.get_run("to-pg")
        assert record is not None and record["status"] == "done"
        assert record["config"]["settings"]["store"] == postgres_url
        assert record["metric_names"] and record["summary"]
        assert store.metric_series("to-pg", record["metric_names"][0])["count"] >= 1
    config = json.loads((runs / "to-pg" / "config.json").read_text())
    assert config["settings"]["store"] == postgres_url


def test_a_recipe_refuses_an_unreachable_store_before_the_model_loads(tmp_path, capsys):
    runs = tmp_path / "runs"
    code = main(["sft", "--base-model", "starter-2m", "--runs-dir", str(runs),
                 "--store", "postgresql://me:pw@127.0.0.1:1/runs"])
    assert code == 2
    err = capsys.readouterr().err
    assert "cannot be reached" in err and ":pw@" not in err
    assert not (runs / "sft-run").exists() and not (runs / "refund-sft").exists()


def test_a_recipe_flag_records_the_url_without_its_password(tmp_path):
    from posttrain.train.settings import RecipeSettings

    settings = RecipeSettings(store="postgresql://me:pw@db.example/runs")
    assert settings.to_config()["store"] == "postgresql://me:***@db.example/runs"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


def test_postgres_urls_that_cannot_serve_are_one_line_without_the_password(
        postgres_server, tmp_path, capsys):
    """Issue #49, class 6: PostgreSQL URLs with odd options or ports, or a user who may not
    create the tables, gave tracebacks, and one printed the password. Each is one line,
    exit 2, and the password appears nowhere."""
    import uuid

    import psycopg

    from posttrain.cli import main
    from posttrain.service.engine.errors import ServiceError
    from posttrain.service.protocols.tinker.journal import Journal

    secret = f"pw-{uuid.uuid4().hex[:10]}"
    database = postgres_server.new_database().rsplit("/", 1)[1]
    role = f"reader_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_server.url(), autocommit=True) as connection:
        connection.execute(f'CREATE ROLE "{role}" LOGIN')
    port = postgres_server.port
    urls = [
        f"postgresql://{role}:{secret}@127.0.0.1:{port}/{database}",  # may not create tables
        f"postgresql://u:{secret}@127.0.0.1:notaport/{database}",
        f"postgresql://u:{secret}@127.0.0.1:99999/{database}",
        f"postgresql://u:{secret}@127.0.0.1:{port}/{database}?bogus_option=1",
        f"postgresql://u:{secret}@127.0.0.1:{port}/{database}?sslmode=sometimes",
    ]
    for url in urls:
        code = main(["runs", "list", "--store", url])
        out, err = capsys.readouterr()
        assert code == 2, (url, out, err)
        assert len(err.strip().splitlines()) == 1, (url, err)
        assert secret not in out + err, (url, err)
        assert "Traceback" not in err
        try:
            Journal(tmp_path, url)
        except ServiceError as error:
            assert secret not in error.message and "\n" not in error.message, error.message
        else:
            raise AssertionError(f"the journal opened on {url}")
