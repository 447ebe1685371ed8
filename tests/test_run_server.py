"""The run server and the HTTP store: a real server on 127.0.0.1, real sockets, real SQLite."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request

import pytest

from posttrain.runs.ops import RunStoreError
from posttrain.runs.server import serve, start_in_thread
from posttrain.runs.store import HttpRunStore, SqliteRunStore, open_run

TOKEN = "s3cret"


@pytest.fixture
def server(tmp_path):
    running = serve(tmp_path / "posttrain.db", "127.0.0.1", 0, TOKEN)
    thread = start_in_thread(running)
    yield running
    running.shutdown()
    running.server_close()
    thread.join(5)


def request(url, *, body=None, token=TOKEN, method=None, raw=None):
    """(status, parsed JSON) of one HTTP call; 4xx/5xx answers are returned, not raised."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    call = urllib.request.Request(url, data=data, method=method or ("POST" if data else "GET"))
    call.add_header("Content-Type", "application/json")
    if token:
        call.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(call, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def ingest(server, ops, batch="b1", token=TOKEN):
    return request(server.url + "/api/ingest", body={"batch": batch, "ops": ops}, token=token)


CREATE = {"op": "create", "run": "r1", "config": {"base_model": "starter"}, "time": 1.0}


def test_http_store_batches_arrive_and_read_back_through_the_api(server):
    store = HttpRunStore(server.url, TOKEN)
    run = open_run("grpo-http", {"base_model": "starter"}, store=store)
    for step in range(300):
        run.log(step, {"reward": step / 300, "kl": 0.01})
        run.progress(step, 300, 1.0)
    run.alarm("feature", 299, "length is paid for", {"feature": "length"})
    run.finish({"delta": {"delta": 0.2, "verdict": "moved"}})
    store.close()  # flushes
    assert store.pending == 0 and store.dropped == 0

    status, listing = request(server.url + "/api/runs")
    assert status == 200
    (listed,) = listing["runs"]
    assert (listed["name"], listed["status"], listed["last_step"]) == ("grpo-http", "done", 299)
    assert listed["headline_delta"] == 0.2
    status, detail = request(server.url + "/api/runs/grpo-http")
    assert status == 200 and detail["alarms"][0]["details"] == {"feature": "length"}
    assert detail["metric_names"] == ["kl", "reward"]
    status, metrics = request(server.url + "/api/runs/grpo-http/metrics?names=reward,kl"
                              "&max_points=50")
    assert status == 200 and metrics["names"] == ["kl", "reward"]
    reward = metrics["series"]["reward"]
    assert reward["count"] == 300 and len(reward["steps"]) <= 50 and reward["steps"][-1] == 299


def test_ingest_refuses_a_missing_or_wrong_token(server):
    assert ingest(server, [CREATE], token=None)[0] == 401
    status, answer = ingest(server, [CREATE], token="guess")
    assert status == 401 and "token" in answer["error"]["message"]
    assert request(server.url + "/api/runs")[1]["runs"] == []
    assert ingest(server, [CREATE])[0] == 200


def test_a_run_the_server_refuses_stops_before_training_and_later_refusals_warn_once(
        server, capsys):
    store = HttpRunStore(server.url, "wrong", flush_seconds=0.05)
    with pytest.raises(RunStoreError, match=r"refused run 'refused' \(HTTP 401\).*nothing "
                                            r"was trained.*POSTTRAIN_TOKEN"):
        open_run("refused", {}, store=store)
    for step in range(50):  # a refusal after the start (a token revoked): said once
        store.log_metrics("refused", step, {"loss": 1.0})
    store.close()
    assert capsys.readouterr().err.count("refused the token") == 1
    assert request(server.url + "/api/runs")[1]["runs"] == []


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (b"{not json", "not valid JSON"),
        (b'{"batch": "x", "ops": [{"op": "metrics", "run": "r", "step": 1, '
         b'"metrics": {"a": NaN}}]}', "not valid JSON"),
        (b"[1, 2]", "expected a JSON object"),
        (b'{"batch": "x", "ops": "create"}', "must be a list"),
        (b'{"batch": "x", "ops": [{"op": "explode", "run": "r"}]}', "unknown op"),
        (b'{"batch": "x", "ops": [{"op": "metrics", "run": "r", "step": -1, "metrics": {}}]}',
         "step"),
        (b'{"batch": "x", "ops": [{"op": "finish", "run": "r", "status": "great"}]}', "status"),
        (b'{"batch": 7, "ops": []}', "batch"),
        (b"\xff\xfe", "not valid JSON"),
        # a number no float holds would be stored as infinity and break every page
        (b'{"batch": "x", "ops": [{"op": "create", "run": "r", "config": {"x": 1e400}}]}',
         "1e400 does not fit a float"),
        (b'{"batch": "x", "ops": [{"op": "note", "run": "r", "text": "t", "step": Infinity}]}',
         "not valid JSON"),
        # steps past 2**53 overflowed SQLite's integers (a 500)
        (b'{"batch": "x", "ops": [{"op": "metrics", "run": "r", "step": 100000000000000000000000,'
         b' "metrics": {}}]}', "from 0 to 2**53"),
        (b'{"batch": "x", "ops": [{"op": "metrics", "run": "r", "step": 1e23, "metrics": {}}]}',
         "from 0 to 2**53"),
        # nesting too deep to parse was a RecursionError (a 500)
        (b'{"batch": "x", "ops": [{"op": "create", "run": "r", "config": '
         + b'{"a": ' * 5000 + b"1" + b"}" * 5000 + b"}]}", "nested too deeply"),
    ],
)
def test_malformed_ingest_bodies_get_a_400_with_a_message(server, raw, fragment):
    status, answer = request(server.url + "/api/ingest", raw=raw)
    assert status == 400
    assert fragment in answer["error"]["message"]


def test_a_batch_with_one_bad_op_applies_nothing(server):
    bad = {"op": "metrics", "run": "r1", "step": "three", "metrics": {"loss": 1.0}}
    status, answer = ingest(server, [CREATE, bad])
    assert status == 400 and "op 1 (metrics)" in answer["error"]["message"]
    assert request(server.url + "/api/runs")[1]["runs"] == []


def test_a_batch_sent_twice_is_applied_once(server):
    note = {"op": "note", "run": "r1", "text": "once", "step": 0}
    assert ingest(server, [CREATE, note], batch="same")[1]["applied"] == 2
    assert ingest(server, [CREATE, note], batch="same")[1]["duplicate"] is True
    assert len(request(server.url + "/api/runs/r1")[1]["notes"]) == 1


@pytest.mark.parametrize("path", ["/api/runs/.hidden", "/api/runs/..%2F..%2Fetc",
                                  "/api/runs/a%2Fb/metrics", "/api/runs/..", "/api/runs/%2e%2e"])
def test_run_names_in_urls_cannot_escape(server, path):
    status, answer = request(server.url + path)
    assert status in (400, 404) and "error" in answer


@pytest.mark.parametrize("name", ["../x", "a/b", ".hidden", "posttrain.db-wal"])
def test_ingest_refuses_run_names_that_could_escape(server, name):
    status, answer = ingest(server, [{**CREATE, "run": name}])
    assert status == 400 and "run name" in answer["error"]["message"]


def test_read_endpoints_answer_unknown_runs_and_bad_parameters_with_4xx(server):
    assert request(server.url + "/api/runs/nobody")[0] == 404
    ingest(server, [CREATE])
    assert request(server.url + "/api/runs/r1/metrics?max_points=0")[0] == 400
    assert request(server.url + "/api/runs/r1/metrics?max_points=lots")[0] == 400
    assert request(server.url + "/api/nothing")[0] == 404
    assert request(server.url + "/api/runs", body={})[0] == 405
    status, empty = request(server.url + "/api/runs/r1/metrics")
    assert status == 200 and empty["series"] == {}


def test_the_metrics_route_asks_the_store_once_a_name_and_caps_the_names(server):
    """The work bounded by the request before any query (the hostile probe: 300 copies of
    one name on a 100,000-point run, one query each, 49 s)."""
    ingest(server, [CREATE])
    calls = []
    store_series = server.store.metric_series

    def counted(*args, **kwargs):
        calls.append(args)
        return store_series(*args, **kwargs)

    server.store.metric_series = counted
    try:
        names = ",".join(["reward"] * 300 + ["nothing-like-it"])
        status, answer = request(server.url + f"/api/runs/r1/metrics?names={names}")
        assert status == 200 and set(answer["series"]) == {"reward", "nothing-like-it"}
        # one name the run has not logged: no query at all; the repeated one: not 300
        assert len(calls) <= 1
        many = ",".join(f"m{i}" for i in range(65))
        status, refused = request(server.url + f"/api/runs/r1/metrics?names={many}")
        assert status == 400 and "at most 64" in refused["error"]["message"]
    finally:
        server.store.metric_series = store_series


def test_a_server_without_a_token_accepts_ingest_without_one(tmp_path):
    open_server = serve(tmp_path / "open.db", "127.0.0.1", 0, None)
    thread = start_in_thread(open_server)
    try:
        assert ingest(open_server, [CREATE], token=None)[0] == 200
    finally:
        open_server.shutdown()
        open_server.server_close()
        thread.join(5)


def test_the_dashboard_can_add_a_route(server):
    from posttrain.runs.server import Response

    server.add_route("GET", "/runs/{name}",
                     lambda request: Response(200, request.match["name"].encode(), "text/plain"))
    with urllib.request.urlopen(server.url + "/runs/r1", timeout=10) as response:
        assert response.read() == b"r1"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_server_down_never_blocks_training_and_data_arrives_once_it_is_up(tmp_path, capsys):
    port = free_port()
    store = HttpRunStore(f"http://127.0.0.1:{port}", TOKEN, flush_seconds=0.05,
                         max_backoff=0.2, close_timeout=15)
    run = open_run("patient", {"base_model": "starter"}, store=store)
    started = time.perf_counter()
    for step in range(2000):  # the training loop: must not wait on the dead server
        run.log(step, {"loss": 1.0 / (step + 1)})
        run.progress(step, 2000)
    assert time.perf_counter() - started < 1.0
    time.sleep(0.3)  # let the sender fail a few times
    assert capsys.readouterr().err.count("unreachable") == 1

    late = serve(tmp_path / "posttrain.db", "127.0.0.1", port, TOKEN)
    thread = start_in_thread(late)
    try:
        run.finish({"after": 0.5})
        store.close()
        assert store.pending == 0
        with SqliteRunStore(tmp_path / "posttrain.db") as reader:
            detail = reader.get_run("patient")
            assert detail["status"] == "done" and detail["config"] == {"base_model": "starter"}
            assert reader.metric_series("patient", "loss")["count"] == 2000
    finally:
        late.shutdown()
        late.server_close()
        thread.join(5)
    assert "unreachable" not in capsys.readouterr().err  # still the one warning only


def test_a_full_buffer_drops_the_oldest_records_but_keeps_the_run(tmp_path, server):
    port = free_port()
    store = HttpRunStore(f"http://127.0.0.1:{port}", TOKEN, max_buffer=100, close_timeout=0.5,
                         flush_seconds=10)
    run = open_run("bounded", {}, store=store)
    for step in range(500):
        run.log(step, {"loss": 1.0})
    assert store.pending <= 100 and store.dropped >= 400
    queued_ops = [op["op"] for op in store._queue]
    assert queued_ops[0] == "create"
    store.close()


def _raw_exchange(server, payload: bytes, wait: float = 5.0) -> bytes:
    host, port = server.server_address[:2]
    with socket.create_connection((host, port), timeout=wait) as conn:
        conn.sendall(payload)
        chunks = []
        while True:
            try:
                chunk = conn.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


def test_a_write_without_the_token_is_refused_before_its_body_is_read(server):
    # headers announce 30 MB; none of it is sent: the 401 must come without waiting for it
    started = time.monotonic()
    answer = _raw_exchange(server, b"POST /api/ingest HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                   b"Content-Type: application/json\r\n"
                                   b"Content-Length: 30000000\r\n"
                                   b"Authorization: Bearer wrong\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 401")
    assert b"missing or wrong token" in answer
    assert time.monotonic() - started < 4


@pytest.mark.parametrize("sent", [b"", b"GET /api/runs HTTP/1.1\r\nHost: 127.0.0.1\r\n",
                                  b"POST /api/ingest HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                  b"Authorization: Bearer " + TOKEN.encode() + b"\r\n"
                                  b"Content-Type: application/json\r\n"
                                  b"Content-Length: 100\r\n\r\n{\"batch\""])
def test_a_stalled_client_is_dropped_after_the_read_timeout(tmp_path, sent):
    """Nothing sent, headers cut short, a body cut short: each is dropped (a body with
    a 408), without waiting for the client."""
    from posttrain.runs.server import RunServer
    from posttrain.runs.sqlite_store import SqliteRunStore

    slow = RunServer(("127.0.0.1", 0), SqliteRunStore(tmp_path / "posttrain.db"), TOKEN,
                     read_timeout_s=0.5)
    start_in_thread(slow)
    try:
        started = time.monotonic()
        answer = _raw_exchange(slow, sent, wait=10)  # returns when the server hangs up
        assert time.monotonic() - started < 5
        assert answer == b"" if b"Content-Length" not in sent else answer.startswith(
            b"HTTP/1.1 408")
        assert request(slow.url + "/api/runs")[0] == 200  # and it still serves
    finally:
        slow.shutdown()
        slow.server_close()


def test_answers_never_carry_nan_or_infinity():
    from posttrain.runs.server import json_response

    body = json_response({"a": float("inf"), "b": [float("nan"), 1.5], "c": {"d": -float("inf")}})
    assert json.loads(body.body, parse_constant=lambda name: pytest.fail(name)) == {
        "a": None, "b": [None, 1.5], "c": {"d": None}}


@pytest.mark.parametrize(("headers", "status", "fragment"), [
    ({"Content-Type": "text/plain"}, 415, "application/json"),
    ({"Content-Type": "application/x-www-form-urlencoded"}, 415, "application/json"),
    ({"Origin": "http://evil.example"}, 403, "another site"),
    ({"Origin": "http://127.0.0.1:1"}, 403, "another site"),  # another port, another site
    ({"Origin": "null"}, 403, "opaque origin"),
    ({"Host": "evil.example:8765"}, 403, "is not this server's address"),
])
def test_writes_from_a_foreign_page_are_refused(server, headers, status, fragment):
    body = json.dumps({"batch": "x", "ops": [CREATE]}).encode()
    call = urllib.request.Request(server.url + "/api/ingest", data=body, method="POST")
    call.add_header("Content-Type", "application/json")
    call.add_header("Authorization", f"Bearer {TOKEN}")
    for name, value in headers.items():
        call.add_header(name, value)
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(call, timeout=10)
    assert refused.value.code == status
    assert fragment in json.loads(refused.value.read())["error"]["message"]
    assert request(server.url + "/api/runs")[1]["runs"] == []


def test_same_origin_writes_and_reads_under_a_foreign_host_name(server):
    port = server.server_address[1]
    call = urllib.request.Request(server.url + "/api/ingest", method="POST",
                                  data=json.dumps({"batch": "o", "ops": [CREATE]}).encode())
    call.add_header("Content-Type", "application/json; charset=utf-8")
    call.add_header("Authorization", f"Bearer {TOKEN}")
    call.add_header("Origin", f"http://localhost:{port}")
    with urllib.request.urlopen(call, timeout=10) as answer:
        assert answer.status == 200
    # a DNS-rebinding page reads under its own name: refused
    rebinding = urllib.request.Request(server.url + "/api/runs")
    rebinding.add_header("Host", f"attacker.example:{port}")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(rebinding, timeout=10)
    assert refused.value.code == 403


def test_the_metrics_csv_is_one_bounded_query(server, monkeypatch):
    """Issue #49: the CSV export of a run with 500,000 metric names took 407 s, one query
    per name, open to anyone. Now one query whose size is bounded before the answer is
    built: past the limit a 413 that says what to do; too many names asked, a 400."""
    import posttrain.runs.server as run_server

    names = {f"m{i:04d}": float(i) for i in range(300)}
    ingest(server, [{"op": "create", "run": "wide", "config": {}},
                    {"op": "metrics", "run": "wide", "step": 1, "metrics": names},
                    {"op": "metrics", "run": "wide", "step": 2, "metrics": names}])
    base = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setattr(run_server, "MAX_CSV_POINTS", 599)
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{base}/api/runs/wide/metrics.csv", timeout=10)
    assert refused.value.code == 413
    assert "more than 599 metric points" in json.loads(refused.value.read())["error"]["message"]
    monkeypatch.setattr(run_server, "MAX_CSV_POINTS", 600)
    with urllib.request.urlopen(f"{base}/api/runs/wide/metrics.csv", timeout=10) as answer:
        lines = answer.read().decode().splitlines()
    assert len(lines) == 601 and lines[1].startswith("m0000,1,")
    asked = ",".join(f"n{i}" for i in range(run_server.MAX_CSV_NAMES + 1))
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{base}/api/runs/wide/metrics.csv?names={asked}", timeout=10)
    assert refused.value.code == 400
    with urllib.request.urlopen(f"{base}/api/runs/wide/metrics.csv?names=m0007,nosuch",
                                timeout=10) as answer:
        assert answer.read().decode().splitlines()[1:] == [
            line for line in lines if line.startswith("m0007,")]


def test_a_recipe_whose_run_the_server_refuses_exits_2_leaving_nothing(
        server, starter_2m_folder, tmp_path, monkeypatch, capsys):
    from posttrain.cli import main

    monkeypatch.setenv("POSTTRAIN_SERVER", server.url)
    monkeypatch.setenv("POSTTRAIN_TOKEN", "a-token-the-server-does-not-know")
    runs = tmp_path / "runs"
    code = main(["sft", "--base-model", "starter-2m", "--prompts", "40", "--steps", "2",
                 "--eval-samples", "1", "--runs-dir", str(runs), "--run-name", "taken"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "refused run 'taken' (HTTP 401)" in err and "nothing was trained" in err, err
    assert not (runs / "taken").exists()  # no folder, no metrics, no config
    assert request(server.url + "/api/runs")[1]["runs"] == []
