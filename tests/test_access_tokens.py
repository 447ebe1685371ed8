"""Per-person tokens (``--tokens FILE``): the file's checks, a run server that records who
created each run and lets a token delete only its own (on SQLite and PostgreSQL), the
administrator's ``--token`` beside it, and the store's schema 2 -> 3 migration."""

from __future__ import annotations

import json
import sqlite3
import urllib.error
import urllib.request

import pytest

from posttrain.access import ADMIN, Caller, identify, load_tokens
from posttrain.cli import main
from posttrain.errors import PosttrainError
from posttrain.runs.http_store import HttpRunStore
from posttrain.runs.server import serve, start_in_thread
from posttrain.runs.sqlite_store import SCHEMA_VERSION, SqliteRunStore

ALICE, BOB, ADMIN_TOKEN = "tml-alice-0123456789", "tml-bob-0123456789ab", "admin-0123456789abc"


def tokens_file(tmp_path, content) -> str:
    path = tmp_path / "tokens.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


@pytest.mark.parametrize("content, problem", [
    ("{not json", "not a JSON object"),
    ("[]", "expected a JSON object"),
    ({}, "expected a JSON object"),
    ({"alice": "short"}, "at least 16 characters"),
    ({"alice": 12345678901234567}, "must be a string"),
    ({"al ice": ALICE}, "name 'al ice'"),
    ({"alice": ALICE, "bob": ALICE}, "share a token"),
])
def test_a_bad_tokens_file_is_named_with_what_is_wrong(tmp_path, content, problem):
    path = tokens_file(tmp_path, content)
    with pytest.raises(PosttrainError, match=problem) as refused:
        load_tokens(path)
    assert path in str(refused.value)


def test_a_missing_tokens_file_is_named(tmp_path):
    with pytest.raises(PosttrainError, match="cannot read it"):
        load_tokens(tmp_path / "nosuch.json")


def test_headers_identify_their_caller():
    tokens = {ALICE: "alice", BOB: "bob"}
    assert identify({}, None, None) is ADMIN  # no credentials: everyone may do anything
    assert identify({"authorization": f"Bearer {ALICE}"}, ADMIN_TOKEN, tokens).name == "alice"
    assert identify({"x-api-key": BOB}, ADMIN_TOKEN, tokens).name == "bob"
    assert identify({"authorization": f"Bearer {ADMIN_TOKEN}"}, ADMIN_TOKEN, tokens) is ADMIN
    assert identify({"authorization": "Bearer wrong-token-123456"}, ADMIN_TOKEN, tokens) is None
    assert identify({}, ADMIN_TOKEN, tokens) is None
    assert Caller("alice").may_delete("alice") and not Caller("alice").may_delete("bob")
    assert not Caller("alice").may_delete(None) and ADMIN.may_delete("bob")


def _post(url: str, body: dict, token: str | None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def _runs(base: str) -> dict[str, str | None]:
    with urllib.request.urlopen(f"{base}/api/runs", timeout=30) as answer:
        return {run["name"]: run["owner"] for run in json.loads(answer.read())["runs"]}


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_each_token_deletes_only_its_own_runs(backend, tmp_path, request):
    store = (str(tmp_path / "posttrain.db") if backend == "sqlite"
             else request.getfixturevalue("postgres_url"))
    server = serve(store, port=0, token=ADMIN_TOKEN, runs_root=tmp_path,
                   tokens={ALICE: "alice", BOB: "bob"})
    start_in_thread(server)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        for token, name in ((ALICE, "alice-run"), (BOB, "bob-run"), (ADMIN_TOKEN, "admin-run")):
            remote = HttpRunStore(base, token)
            remote.create_run(name, {"recipe": "grpo"})
            remote.finish_run(name, {}, "done")
            remote.close()
        assert _runs(base) == {"alice-run": "alice", "bob-run": "bob", "admin-run": None}
        status, body = _post(f"{base}/api/ingest", {"ops": []}, "tml-nobody-0123456789")
        assert status == 401
        status, body = _post(f"{base}/api/runs/alice-run/delete", {}, BOB)
        assert status == 403 and "created by alice" in body["error"]["message"]
        status, body = _post(f"{base}/api/runs/admin-run/delete", {}, BOB)
        assert status == 403 and "not created with a token" in body["error"]["message"]
        assert _post(f"{base}/api/runs/alice-run/delete", {}, ALICE)[0] == 200
        assert _post(f"{base}/api/runs/bob-run/delete", {}, ADMIN_TOKEN)[0] == 200
        assert _runs(base) == {"admin-run": None}
    finally:
        server.shutdown()
        server.server_close()


def test_a_schema_2_store_gains_owners_and_keeps_a_copy(tmp_path):
    path = tmp_path / "posttrain.db"
    with SqliteRunStore(path) as store:
        store.create_run("older", {"recipe": "grpo"})
        store.log_metrics("older", 0, {"reward": 0.5})
    with sqlite3.connect(path) as old:  # as posttrain wrote it before owners existed
        old.execute("ALTER TABLE runs DROP COLUMN owner")
        old.execute("PRAGMA user_version=2")
    old.close()
    with SqliteRunStore(path) as store:
        (run,) = store.list_runs()
        assert run["name"] == "older" and run["owner"] is None
        assert store.metric_series("older", "reward")["values"] == [0.5]
    with sqlite3.connect(path) as upgraded:
        assert upgraded.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 3
    upgraded.close()
    assert (tmp_path / "posttrain.db.v2.bak").is_file()


def test_ui_refuses_a_bad_tokens_file_before_serving(tmp_path, capsys):
    path = tokens_file(tmp_path, {"alice": "short"})
    assert main(["ui", "--runs-dir", str(tmp_path), "--port", "0", "--tokens", path]) == 2
    assert "at least 16 characters" in capsys.readouterr().err


def test_a_persons_token_may_not_also_be_the_administrators(tmp_path, capsys):
    shared = "tok-alice-0123456789"
    path = tokens_file(tmp_path, {"alice": shared, "bob": "tok-bob-0123456789ab"})
    assert load_tokens(path, admin_token="tok-admin-0123456789") == {
        shared: "alice", "tok-bob-0123456789ab": "bob"}
    with pytest.raises(PosttrainError, match="alice's token is also the administrator's"):
        load_tokens(path, admin_token=shared)
    # both servers refuse it before serving
    assert main(["ui", "--runs-dir", str(tmp_path), "--port", "0", "--tokens", path,
                 "--token", shared]) == 2
    assert "is also the administrator's --token" in capsys.readouterr().err
    assert main(["serve", "--base-model", "starter-2m", "--port", "0", "--tokens", path,
                 "--token", shared, "--state-dir", str(tmp_path / "state")]) == 2
    assert "is also the administrator's --token" in capsys.readouterr().err
