"""Nobody touches what is not theirs, on the run server and the dashboard (issue #49, the
third hostile probe's severe findings 1 and 2): every write route is enumerated and each
refuses a token that did not create the run (403), leaving the run's record, curves and
folder byte-identical; a record ingested for a folder posttrain did not make never makes
that folder deletable."""

from __future__ import annotations

import hashlib
import json
import time
import urllib.error
import urllib.request

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from posttrain.runs.http_store import HttpRunStore
from posttrain.runs.server import serve, start_in_thread
from posttrain.ui.app import dashboard_server

ALICE, BOB, ADMIN_TOKEN = "tml-alice-0123456789", "tml-bob-0123456789ab", "admin-0123456789abc"
RUN_CONFIG = {"recipe": "grpo", "settings": {}}


def post(base: str, path: str, body: object, token: str | None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(base + path, json.dumps(body).encode(), headers,
                                     method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def get(base: str, path: str) -> bytes:
    with urllib.request.urlopen(base + path, timeout=30) as answer:
        return answer.read()


def every_op(run: str) -> list[dict]:
    """One op of every kind the ingest route accepts, each aimed at ``run``."""
    now = time.time()
    return [
        {"op": "create", "run": run, "config": {"recipe": "forged"}, "time": now},
        {"op": "heartbeat", "run": run, "time": now},
        {"op": "metrics", "run": run, "step": 1, "metrics": {"loss": 99.0}, "time": now},
        {"op": "progress", "run": run, "step": 9, "total": 10, "eta": 1.0, "time": now},
        {"op": "samples", "run": run, "step": 1, "source": "monitor",
         "rows": [{"reply": "forged"}], "time": now},
        {"op": "note", "run": run, "text": "forged", "step": 1, "time": now},
        {"op": "alarm", "run": run, "kind": "hack", "step": 1, "message": "forged",
         "details": {}, "time": now},
        {"op": "finish", "run": run, "status": "failed", "summary": {"forged": True},
         "time": now},
    ]


def write_requests(run: str) -> dict[tuple[str, str], list[object]]:
    """Per write route of the server (method, path), the bodies that try to change ``run``."""
    return {
        ("POST", "/api/ingest"): [{"ops": [op]} for op in every_op(run)]
                                 + [{"ops": every_op(run)}],
        ("POST", "/api/runs/{name}/delete"): [{}, {"force": True}],
    }


def snapshot(base: str, folder) -> str:
    """Everything a reader sees of alice's run: record, curves, samples, and the folder."""
    parts = [get(base, "/api/runs/alice-run"),
             get(base, "/api/runs/alice-run/metrics?names=loss"),
             get(base, "/api/runs/alice-run/metrics.csv")]
    parts += [path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()]
    return hashlib.sha256(b"\0".join(parts)).hexdigest()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_spec(request, tmp_path):
    return (str(tmp_path / "posttrain.db") if request.param == "sqlite"
            else request.getfixturevalue("postgres_url"))


@pytest.mark.parametrize("make_server", [serve, dashboard_server],
                         ids=["run-server", "dashboard"])
def test_every_write_route_refuses_a_token_that_did_not_create_the_run(
        make_server, store_spec, tmp_path):
    runs_root = tmp_path / "runs"
    runs_root.mkdir()
    tokens = {ALICE: "alice", BOB: "bob"}
    if make_server is serve:
        server = serve(store_spec, port=0, token=ADMIN_TOKEN, runs_root=runs_root,
                       tokens=tokens)
    else:
        server = dashboard_server(store_spec, "127.0.0.1", 0, ADMIN_TOKEN,
                                  runs_root=runs_root, tokens=tokens)
    start_in_thread(server)
    base = server.url
    try:
        alice = HttpRunStore(base, ALICE)
        alice.create_run("alice-run", RUN_CONFIG)
        alice.log_metrics("alice-run", 1, {"loss": 0.5})
        alice.finish_run("alice-run", {"verdict": "moved"}, "done")
        alice.close()
        folder = runs_root / "alice-run"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(RUN_CONFIG))
        (folder / "report.md").write_text("# alice's report\n")
        before = snapshot(base, folder)

        # the server's write routes are exactly the ones this test knows how to try
        served = {(method, route.path) for route in server.routes
                  for method in route.methods if method not in ("GET", "HEAD")}
        attempts = write_requests("alice-run")
        assert served == set(attempts), "a write route this test does not try"
        for (_method, path), bodies in attempts.items():
            for body in bodies:
                status, answer = post(base, path.replace("{name}", "alice-run"), body, BOB)
                assert status == 403, (path, body, status, answer)
                assert "created by alice" in answer["error"]["message"]
                assert snapshot(base, folder) == before, (path, body)
        # the owner and the administrator still may
        assert post(base, "/api/ingest", {"ops": [every_op("alice-run")[5]]}, ALICE)[0] == 200
        assert post(base, "/api/runs/alice-run/delete", {}, ADMIN_TOKEN)[0] == 200
        assert not folder.exists()
        # a new name is anyone's to create, and then theirs
        assert post(base, "/api/ingest", {"ops": every_op("bob-run")}, BOB)[0] == 200
        runs = {run["name"]: run["owner"]
                for run in json.loads(get(base, "/api/runs"))["runs"]}
        assert runs["bob-run"] == "bob"
        # an op for a run never created belongs to whoever sent it, not to nobody
        assert post(base, "/api/ingest", {"ops": [every_op("orphan")[2]]}, BOB)[0] == 200
        assert post(base, "/api/ingest", {"ops": [every_op("orphan")[5]]}, ALICE)[0] == 403
    finally:
        server.shutdown()
        server.server_close()


def test_an_ingested_record_never_makes_a_folder_deletable(tmp_path):
    """Finding 2: `create` + `finish` ingested for the name of a folder that posttrain did
    not make for a run (on a dashboard without a token) made the delete route remove it."""
    runs_root = tmp_path / "runs"
    (runs_root / "src").mkdir(parents=True)
    (runs_root / "src" / "main.py").write_text("print('mine')\n")
    server = dashboard_server(str(runs_root / "posttrain.db"), "127.0.0.1", 0, None)
    start_in_thread(server)
    base = server.url
    try:
        forged = [op for op in every_op("src") if op["op"] in ("create", "finish")]
        assert post(base, "/api/ingest", {"ops": forged}, None)[0] == 200
        status, answer = post(base, "/api/runs/src/delete", {"force": True}, None)
        assert status == 200 and answer["record"] is True and answer["folder"] is False
        assert (runs_root / "src" / "main.py").read_text() == "print('mine')\n"
        # a link to a folder that is no run is left too (never followed, never removed)
        (runs_root / "link").symlink_to(runs_root / "src", target_is_directory=True)
        linked = [{**op, "run": "link"} for op in forged]
        assert post(base, "/api/ingest", {"ops": linked}, None)[0] == 200
        assert post(base, "/api/runs/link/delete", {"force": True}, None)[0] == 200
        assert (runs_root / "link").is_symlink()
    finally:
        server.shutdown()
        server.server_close()


OP_KINDS = ["create", "heartbeat", "metrics", "progress", "samples", "note", "alarm", "finish"]


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kinds=st.lists(st.sampled_from(OP_KINDS), min_size=1, max_size=8),
       mine_first=st.booleans())
def test_any_batch_touching_a_run_of_another_applies_nothing(tmp_path_factory, kinds,
                                                             mine_first):
    """Property: a batch from bob mixing ops for his own run with any op for alice's is
    refused whole, whatever the kinds and their order; neither run changes."""
    from posttrain.access import Caller
    from posttrain.runs.ops import NotYours
    from posttrain.runs.sqlite_store import SqliteRunStore

    folder = tmp_path_factory.mktemp("store")
    with SqliteRunStore(folder / "posttrain.db") as store:
        store.apply([every_op("alice-run")[0]], owner="alice", caller=Caller("alice"))
        store.apply([every_op("bob-run")[0]], owner="bob", caller=Caller("bob"))
        before = (store.get_run("alice-run"), store.get_run("bob-run"))
        ops_by_kind = {op["op"]: op for op in every_op("alice-run")}
        bobs = {op["op"]: op for op in every_op("bob-run")}
        batch = [ops_by_kind[kind] for kind in kinds]
        batch = [bobs["note"], *batch] if mine_first else [*batch, bobs["note"]]
        with pytest.raises(NotYours, match="created by alice"):
            store.apply(batch, owner="bob", caller=Caller("bob"))
        assert (store.get_run("alice-run"), store.get_run("bob-run")) == before


def folder_digest(folder) -> str:
    return hashlib.sha256(b"\0".join(
        path.relative_to(folder).as_posix().encode() + path.read_bytes()
        for path in sorted(folder.rglob("*")) if path.is_file())).hexdigest()


def real_run_folder(runs_root, name: str, run_id: str = "a1b2c3") -> tuple:
    """A run's folder as a recipe leaves it (its config names a run id), with no record."""
    folder = runs_root / name
    folder.mkdir()
    config = {**RUN_CONFIG, "run_id": run_id, "resolved": {}, "data": {}, "versions": {}}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "summary.json").write_text('{"verdict": "moved"}')
    return folder, config


def test_owners_beyond_the_record_a_folder_without_a_record_is_claimed_only_by_the_admin(
        tmp_path):
    """The record-less folder (a store rebuilt after damage, a folder copied in): another
    person's create for its name is refused and the folder stays byte-identical; the
    administrator may claim it."""
    runs_root = tmp_path / "runs"
    runs_root.mkdir()
    folder, _ = real_run_folder(runs_root, "copied-in")
    before = folder_digest(folder)
    server = dashboard_server(str(tmp_path / "posttrain.db"), "127.0.0.1", 0, ADMIN_TOKEN,
                              runs_root=runs_root, tokens={ALICE: "alice", BOB: "bob"})
    start_in_thread(server)
    try:
        create = {"ops": [{"op": "create", "run": "copied-in", "config": {"recipe": "x"},
                           "time": time.time()}]}
        status, answer = post(server.url, "/api/ingest", create, BOB)
        assert status == 403 and "only the server's --token may claim another's folder" in \
            answer["error"]["message"]
        assert post(server.url, "/api/runs/copied-in/delete", {"force": True}, BOB)[0] == 403
        assert folder_digest(folder) == before and server.store.get_run("copied-in") is None
        assert post(server.url, "/api/ingest", create, ADMIN_TOKEN)[0] == 200
    finally:
        server.shutdown()
        server.server_close()


def test_a_record_the_folders_run_did_not_write_deletes_no_folder(tmp_path):
    """The second store: a dashboard on another store over the same runs folder holds a
    record of the name its own create wrote (no run id of the folder's). Deleting it
    removes that record and leaves the folder; the record the folder's own run wrote
    (its run id) deletes the folder with it."""
    from posttrain.runs.removal import delete_run
    from posttrain.runs.sqlite_store import SqliteRunStore

    runs_root = tmp_path / "runs"
    runs_root.mkdir()
    folder, config = real_run_folder(runs_root, "shared-name")
    before = folder_digest(folder)
    second = SqliteRunStore(tmp_path / "second.db")
    try:
        second.create_run("shared-name", {**config, "run_id": "not-the-folders"})
        second.finish_run("shared-name", {}, "done")
        deleted = delete_run(second, runs_root, "shared-name")
        assert deleted.record and deleted.folder is None and deleted.kept == folder
        assert folder_digest(folder) == before
        second.create_run("shared-name", config)  # what the folder's own run wrote
        second.finish_run("shared-name", {}, "done")
        deleted = delete_run(second, runs_root, "shared-name")
        assert deleted.folder == folder and not folder.exists()
    finally:
        second.close()
