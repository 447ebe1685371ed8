"""Every door of every server posttrain starts, tried against the HTTP core's guards.

The three servers (the run server with the dashboard, the training service, and
``posttrain env serve``'s OpenEnv app) all run on ``posttrain.http_core``. Rather than
trust that each route was added through it, this enumerates the routes and WebSockets
each server actually serves (the mounted OpenEnv app's included) and tries every one: a
foreign ``Host``, a write from another site or of a type a page can forge, a body
announced over the limit, a request without the token, and a body of the wrong shape
(never a 500). A route added later is tried without anyone writing a
test for it.
"""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from posttrain.http_core import HttpServer, Rules

ADMIN_TOKEN = "admin-token-0123456789abcdef"
TOKENS = {"person-token-0123456789abcdef": "alice"}
PARAMETER = re.compile(r"\{[^}]+\}")


def doors(server: HttpServer) -> tuple[list[tuple[str, str]], list[str]]:
    """(method, path) of every HTTP route and the path of every WebSocket ``server``
    serves, the mounted app's included; path parameters filled in."""
    routes: list[Any] = list(server.routes)
    if server.mounted is not None:
        routes += list(server.mounted.routes)
    http, sockets = [], []
    for route in routes:
        path = PARAMETER.sub("x", route.path)
        methods = getattr(route, "methods", None)
        if methods is None:
            sockets.append(path)
        else:
            http += [(method, path) for method in sorted(methods) if method != "HEAD"]
    return http, sockets


def ask(url: str, method: str, path: str, *, headers: dict[str, str] | None = None,
        data: bytes | None = None) -> int:
    """The status of one request (error statuses included)."""
    if data is None and method in ("POST", "PUT", "PATCH", "DELETE"):
        data = b"{}"
    request = urllib.request.Request(url + path, data=data, method=method, headers={
        "Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        error.read()
        return error.code


def announced_too_long(server: HttpServer, method: str, path: str, token: str) -> int:
    """The status answered to a body announced one byte over the limit (none of it sent)."""
    length = server.rules.max_body_bytes + 1
    with socket.create_connection(server.server_address, timeout=30) as connection:
        connection.sendall(
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
            f"\r\nAuthorization: Bearer {token}\r\nContent-Length: {length}\r\n\r\n".encode())
        status_line = connection.recv(64).split(b"\r\n")[0]
    return int(status_line.split()[1])


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def try_every_http_door(server: HttpServer, open_doors: set[tuple[str, str]]) -> dict[str, int]:
    """Each guard on each HTTP route; ``open_doors``: the routes that need no token, by
    design. Returns how many routes were tried, by method (for the test's own check)."""
    url = server.url
    http, _ = doors(server)
    tried: dict[str, int] = {}
    for method, path in http:
        tried[method] = tried.get(method, 0) + 1
        where = f"{method} {path}"
        assert ask(url, method, path, headers={"Host": "evil.example"}) == 403, where
        without = ask(url, method, path)
        if (method, path) in open_doors:
            assert without != 401, where
        else:
            assert without == 401, where
        if method == "GET":
            continue
        assert ask(url, method, path, headers={**bearer(ADMIN_TOKEN),
                                               "Origin": "http://evil.example"}) == 403, where
        assert ask(url, method, path, headers={**bearer(ADMIN_TOKEN),
                                               "Content-Type": "text/plain"}) == 415, where
        assert announced_too_long(server, method, path, ADMIN_TOKEN) == 413, where
        for shape in (b"[]", b'{"a": NaN}', b"\xff\xfe", b'{"a": 1e400}', b"[" * 5000):
            # refused with a 4xx naming it, or ignored by a route that reads no body
            # (the tinker SDK's dynamic_config): never a 500
            status = ask(url, method, path, headers=bearer(ADMIN_TOKEN), data=shape)
            assert status < 500, (where, shape, status)
    return tried


def test_every_door_of_the_run_server_and_the_dashboard(tmp_path):
    from posttrain.ui.app import dashboard_server

    server = dashboard_server(tmp_path / "runs.db", port=0, token=ADMIN_TOKEN, tokens=TOKENS)
    server.start()
    try:
        http, sockets = doors(server)
        # with named people, reads are open but a run's rows and replies, its owner's
        user_data = {("GET", "/api/runs/x/samples"), ("GET", "/api/runs/x/rows.x")}
        assert user_data <= set(http)
        reads = {(method, path) for method, path in http if method == "GET"} - user_data
        tried = try_every_http_door(server, open_doors=reads)
        assert tried.get("GET", 0) >= 10 and tried.get("POST", 0) >= 1 and not sockets
    finally:
        server.shutdown()
        server.server_close()


def test_every_door_of_the_training_service(policy, tmp_path, one_torch_thread):
    from posttrain.service.engine import Engine
    from posttrain.service.server import start_server

    engine = Engine("starter-2m", tmp_path / "state", policy=policy,
                    torch_threads=one_torch_thread)
    running = start_server(engine, port=0, token=ADMIN_TOKEN, tokens=TOKENS)
    try:
        tried = try_every_http_door(running._server, open_doors=set())
        assert tried.get("POST", 0) >= 10 and tried.get("GET", 0) >= 5
    finally:
        running.stop()


@pytest.fixture(scope="module")
def served():
    from posttrain.commands.env import MAX_BODY_BYTES
    from posttrain.envs import get_env
    from posttrain.score.openenv_served import openenv_app

    env = get_env("refund-multiturn")
    server = HttpServer("127.0.0.1", 0, Rules(
        token=ADMIN_TOKEN, tokens=TOKENS, needs_token=lambda method, path: path != "/health",
        max_body_bytes=MAX_BODY_BYTES, idle_socket_s=1.0, name="posttrain env serve"))
    server.mount(openenv_app(env, env.write_prompts(8, seed=0), max_concurrent_envs=2,
                             idle_timeout_s=1.0))
    server.start()
    yield server
    server.shutdown()
    server.server_close()


def test_every_door_of_env_serve(served):
    tried = try_every_http_door(served, open_doors={("GET", "/health")})
    assert tried.get("POST", 0) >= 3 and tried.get("GET", 0) >= 4
    _, sockets = doors(served)
    assert "/ws" in sockets
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    ws_url = served.url.replace("http://", "ws://")
    for path in sockets:
        for headers, origin, status in (({}, None, 401),  # no token
                                        (bearer(ADMIN_TOKEN), "http://evil.example", 403),
                                        (bearer(ADMIN_TOKEN), "null", 403)):
            with pytest.raises(InvalidStatus) as refused:
                connect(ws_url + path, additional_headers=headers, origin=origin,
                        open_timeout=10)
            assert refused.value.response.status_code == status, (path, headers, origin)
            assert json.loads(refused.value.response.body)["error"]["status"] == status
        assert socket_handshake(served, path, host="evil.example") == 403, path
        assert socket_handshake(served, path, host="127.0.0.1") == 101, path


def socket_handshake(server: HttpServer, path: str, host: str) -> int:
    """The status answered to a WebSocket handshake naming ``host`` (with the token)."""
    with socket.create_connection(server.server_address, timeout=30) as connection:
        connection.sendall(
            f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            f"Sec-WebSocket-Version: 13\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n\r\n"
            .encode())
        status_line = connection.recv(64).split(b"\r\n")[0]
    return int(status_line.split()[1])


def test_env_serve_plays_over_its_socket_and_closes_idle_ones_freeing_their_slots(served):
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    ws_url = served.url.replace("http://", "ws://") + "/ws"
    # both slots taken by clients that then say nothing: closed after the idle second
    idle = [connect(ws_url, additional_headers=bearer(token), open_timeout=10)
            for token in (ADMIN_TOKEN, *TOKENS)]
    for client in idle:
        client.send(json.dumps({"type": "reset", "data": {"seed": 1}}))
        assert json.loads(client.recv(timeout=10))["type"] == "observation"
    started = time.monotonic()
    for client in idle:
        with pytest.raises(ConnectionClosed) as closed:
            client.recv(timeout=10)
        assert closed.value.rcvd.code == 1001
    assert time.monotonic() - started < 5
    # the slots are free again: a new client plays an episode to its grade
    with connect(ws_url, additional_headers=bearer(ADMIN_TOKEN), open_timeout=10) as client:
        deadline = time.monotonic() + 10
        while True:  # the app frees a closed session's slot a moment after the close
            client.send(json.dumps({"type": "reset", "data": {"seed": 2}}))
            answer = json.loads(client.recv(timeout=10))
            if answer["type"] == "observation" or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert answer["type"] == "observation", answer
        client.send(json.dumps({"type": "step", "data": {"reply": "Sorry, I cannot help."}}))
        graded = json.loads(client.recv(timeout=10))["data"]
        assert graded["done"] is True and isinstance(graded["reward"], float)


def test_env_serve_answers_bad_episodes_and_bad_numbers_with_a_4xx_naming_them(served):
    url, token = served.url, bearer(ADMIN_TOKEN)
    for body, status, words in (
            (b'{"seed": 1e400}', 400, "1e400"),
            (b'{"seed": "x"}', 422, "seed"),
            (b'{"scenario_id": "nope"}', 400, "no scenario"),
            (b'{"seed": 3}', 200, "")):
        request = urllib.request.Request(url + "/reset", data=body, method="POST", headers={
            "Content-Type": "application/json", **token})
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                got, text = answer.status, answer.read().decode()
        except urllib.error.HTTPError as error:
            got, text = error.code, error.read().decode()
        assert got == status and words in text, (body, got, text)
    # over HTTP a /step is an environment of its own, never reset: 409, saying to use /ws
    request = urllib.request.Request(url + "/step", method="POST", headers={
        "Content-Type": "application/json", **token},
        data=json.dumps({"action": {"reply": "hi"}}).encode())
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 409 and "/ws" in refused.value.read().decode()


def test_env_serve_refuses_unbounded_flags_and_an_open_door_beyond_loopback(capsys):
    from posttrain.cli import main

    assert main(["env", "serve", "--host", "0.0.0.0"]) == 2
    assert "--token" in capsys.readouterr().err
    for flags, named in ((["--prompts", "1000000000"], "--prompts"),
                         (["--prompts", "0"], "--prompts"),
                         (["--max-concurrent-envs", "100000"], "--max-concurrent-envs"),
                         (["--idle-timeout", "nan"], "--idle-timeout"),
                         (["--idle-timeout", "0"], "--idle-timeout"),
                         (["--seed", "-1"], "--seed"),
                         (["--port", "70000"], "--port")):
        started = time.monotonic()
        assert main(["env", "serve", *flags]) == 2, flags
        err = capsys.readouterr().err
        assert named in err and len(err.strip().splitlines()) == 1, (flags, err)
        assert time.monotonic() - started < 5, flags  # refused before any work


def test_posttrains_openenv_client_sends_the_served_token(served, monkeypatch):
    from posttrain.envs import get_env
    from posttrain.errors import PosttrainError

    spec = f"openenv:{served.url}?prompts=2&action_field=reply&max_turns=4"
    monkeypatch.delenv("POSTTRAIN_ENV_TOKEN", raising=False)
    with pytest.raises(PosttrainError, match="HTTP 401"):
        get_env(spec)
    monkeypatch.setenv("POSTTRAIN_ENV_TOKEN", next(iter(TOKENS)))
    env = get_env(spec)
    try:
        assert len(env.write_prompts(2, seed=0)) == 2
    finally:
        env.close()


BOB_TOKEN = "bob-token-0123456789abcdefgh"


def read_as(url: str, path: str, token: str | None) -> int:
    return ask(url, "GET", path, headers=bearer(token) if token else None)


def test_a_runs_rows_and_replies_are_read_by_its_owner_and_the_administrator(tmp_path):
    """docs/security.md, "What listens": with named people (--tokens), graded rows and
    kept replies (every prompt and reply) go to the run's owner and the administrator
    only; the run's record and curves stay open to readers; with no credentials or a
    single --token every read is open."""
    from posttrain.runs.http_store import HttpRunStore
    from posttrain.ui.app import dashboard_server

    alice = next(iter(TOKENS))
    runs_root = tmp_path / "runs"
    runs_root.mkdir()
    server = dashboard_server(tmp_path / "runs.db", port=0, token=ADMIN_TOKEN,
                              runs_root=runs_root, tokens={**TOKENS, BOB_TOKEN: "bob"})
    server.start()
    try:
        store = HttpRunStore(server.url, alice)
        store.create_run("alices", {"recipe": "grpo", "settings": {}})
        store.log_samples("alices", 2, [{"prompt": "secret", "reply": "r"}], "monitor")
        store.finish_run("alices", {"verdict": "moved"}, "done")
        store.close()
        folder = runs_root / "alices"
        folder.mkdir()
        (folder / "holdout_after.jsonl").write_text(json.dumps(
            {"prompt": "secret", "reply": "r", "score": 1.0, "category": "c"}) + "\n")
        user_data = ["/api/runs/alices/samples?which=after",
                     "/api/runs/alices/samples?which=monitor&step=2",
                     "/api/runs/alices/rows.json?which=after",
                     "/api/runs/alices/rows.csv?which=after"]
        for path in user_data:
            assert read_as(server.url, path, None) == 401, path  # anonymous
            assert read_as(server.url, path, BOB_TOKEN) == 403, path  # another person
            assert read_as(server.url, path, alice) == 200, path  # the owner
            assert read_as(server.url, path, ADMIN_TOKEN) == 200, path  # the administrator
        for path in ("/api/runs/alices", "/api/runs", "/runs/alices"):
            assert read_as(server.url, path, None) == 200, path  # the record stays open
    finally:
        server.shutdown()
        server.server_close()
    # no named people (no credentials, or one --token guarding writes): reads are open
    for token in (None, ADMIN_TOKEN):
        open_server = dashboard_server(tmp_path / "runs.db", port=0, token=token,
                                       runs_root=runs_root)
        open_server.start()
        try:
            assert read_as(open_server.url, user_data[2], None) == 200
        finally:
            open_server.shutdown()
            open_server.server_close()


def get_json(url: str, path: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url + path, timeout=60) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def test_every_read_route_names_what_bounds_it_and_holds_it(tmp_path):
    """Issue #68, class 3: a read route's work was bounded by the server's goodwill
    (`/metrics?names=` with 300 copies of one name ran 300 queries, 49 s). Every GET
    route of the run server and the dashboard now names its bound in `read_caps` (a route
    added without one fails here), and each bound is tried past its edge."""
    from posttrain.runs import server as run_server
    from posttrain.ui import app
    from posttrain.ui.app import dashboard_server

    server = dashboard_server(tmp_path / "runs.db", port=0, token=ADMIN_TOKEN)
    store = server.store
    items = run_server.MAX_LISTED_ITEMS
    ops = [{"op": "create", "run": f"r{index:04d}", "config": {}, "time": float(index)}
           for index in range(run_server.MAX_LISTED_RUNS + 1)]
    ops.append({"op": "create", "run": "big", "config": {}, "time": 1e9})
    ops += [{"op": "note", "run": "big", "text": f"note {index}", "step": index}
            for index in range(items + 1)]
    ops += [{"op": "metrics", "run": "big", "step": 0,
             "metrics": {f"m{index:05d}": 1.0 for index in range(start, start + 1000)}}
            for start in range(0, items + 1000, 1000)]
    store.apply(ops)
    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "holdout_after.jsonl").write_bytes(
        b'{"pad": [' + b"{}," * 3_000_000 + b"{}]}\n")
    served: list[str] = []
    series = store.metric_series

    def counted_series(run, metric, **kwargs):
        served.append(metric)
        return series(run, metric, **kwargs)

    store.metric_series = counted_series
    server.start()
    try:
        http, _ = doors(server)
        gets = {PARAMETER.sub("x", path) for path in server.read_caps}
        assert {path for method, path in http if method == "GET"} == gets
        assert all(server.read_caps.values())
        url = server.url

        status, listing = get_json(url, "/api/runs")
        assert status == 200 and len(listing["runs"]) == run_server.MAX_LISTED_RUNS
        assert listing["more"] is True and listing["runs"][0]["name"] == "big"

        status, run = get_json(url, "/api/runs/big")
        assert status == 200 and sorted(run["cut"]) == ["metric_names", "notes"]
        assert len(run["notes"]) == len(run["metric_names"]) == items
        assert run["notes"][-1]["text"] == f"note {items}"  # the latest kept

        status, answer = get_json(url, "/api/runs/big/metrics?names=" + ",".join(["m00001"] * 300))
        assert status == 200 and served == ["m00001"] and list(answer["series"]) == ["m00001"]
        assert len(answer["names"]) == items
        many = ",".join(f"m{index:05d}" for index in range(run_server.MAX_SERIES_NAMES + 1))
        assert get_json(url, f"/api/runs/big/metrics?names={many}")[0] == 400
        wide = ",".join(f"m{index:05d}" for index in range(20))
        assert get_json(url, f"/api/runs/big/metrics?names={wide}&max_points=100000")[0] == 400
        assert get_json(url, "/api/runs/big/metrics?max_points=100001")[0] == 400
        too_many = ",".join(f"n{index}" for index in range(run_server.MAX_CSV_NAMES + 1))
        assert get_json(url, f"/api/runs/big/metrics.csv?names={too_many}")[0] == 400

        assert get_json(url, f"/api/runs/big/samples?limit={app.MAX_SAMPLES + 1}")[0] == 400
        status, refused = get_json(url, "/api/runs/big/rows.json")
        assert status == 413 and "posttrain runs export" in refused["error"]["message"]
    finally:
        server.shutdown()
        server.server_close()
