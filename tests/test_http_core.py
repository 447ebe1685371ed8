"""The one HTTP core under both servers: the run server (dashboard) and the training
service answer errors in the same envelope, refuse a request without the token or with a
body over the limit before reading the body, treat lengths, chunked bodies, loopback
names and stalled clients the same way. Real servers on 127.0.0.1, raw sockets where the
exact bytes matter."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request

import pytest

from posttrain.errors import PosttrainError
from posttrain.http_core import check_bind

TOKEN = "core-secret"
LIMIT = 1 << 20  # the service's body limit in these tests; the run server's is 32 MiB


@pytest.fixture(scope="module")
def service_policy(starter_2m_folder):
    pytest.importorskip("torch")
    from posttrain.policy.loading import load_policy

    return load_policy("starter-2m", device="cpu", show_progress=False)


class Target:
    """One server under test: its base URL, a path that takes a JSON write, a path that
    reads, its body limit, and how to stop it."""

    def __init__(self, url, address, write_path, read_path, limit, stop):
        self.url, self.address = url, address
        self.write_path, self.read_path, self.limit, self.stop = (write_path, read_path,
                                                                  limit, stop)


def run_server_target(tmp_path, read_timeout_s=30.0):
    from posttrain.runs.server import RunServer, start_in_thread
    from posttrain.runs.sqlite_store import SqliteRunStore

    server = RunServer(("127.0.0.1", 0), SqliteRunStore(tmp_path / "posttrain.db"), TOKEN,
                       read_timeout_s=read_timeout_s)
    start_in_thread(server)

    def stop():
        server.shutdown()
        server.server_close()

    return Target(server.url, server.server_address, "/api/ingest", "/api/runs",
                  32 * 1024 * 1024, stop)


def service_target(tmp_path, policy):
    from posttrain.service.engine import Engine
    from posttrain.service.engine.requests import Limits
    from posttrain.service.server import start_server

    engine = Engine("starter-2m", tmp_path / "state", policy=policy,
                    limits=Limits(max_body_bytes=LIMIT), torch_threads=1)
    running = start_server(engine, port=0, token=TOKEN)
    return Target(running.url, running.http.server_address, "/v1/training/sessions",
                  "/v1/training/health", LIMIT, running.stop)


@pytest.fixture(params=["run server", "service"])
def target(request, tmp_path):
    if request.param == "run server":
        made = run_server_target(tmp_path)
    else:
        made = service_target(tmp_path, request.getfixturevalue("service_policy"))
    yield made
    made.stop()


def call(target, method, path, *, body=None, token=TOKEN, headers=None):
    """(status, parsed JSON, headers) of one request; errors are answers, not raised."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    sent = {"Content-Type": "application/json", **(headers or {})}
    if token:
        sent["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(target.url + path, data=data, method=method, headers=sent)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read() or b"null"), answer.headers
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null"), error.headers


def raw(target, payload: bytes, wait: float = 10.0) -> tuple[bytes, float]:
    """Send bytes, read until one whole answer (headers + Content-Length body) or the
    server hangs up; (answer, seconds until it was whole)."""
    started = time.monotonic()
    with socket.create_connection(target.address, timeout=wait) as connection:
        connection.sendall(payload)
        answer = b""
        while True:
            head, _, body = answer.partition(b"\r\n\r\n")
            if _:
                length = [int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:")]
                if length and len(body) >= length[0]:
                    return answer, time.monotonic() - started
            try:
                chunk = connection.recv(65536)
            except TimeoutError:
                return answer, time.monotonic() - started
            if not chunk:
                return answer, time.monotonic() - started
            answer += chunk


def envelope(payload, status):
    assert set(payload) == {"error"}, payload
    assert payload["error"]["status"] == status and payload["error"]["message"], payload
    return payload["error"]["message"]


def test_every_error_comes_in_one_envelope(target):
    status, payload, _ = call(target, "GET", "/nowhere")
    assert status == 404 and "/nowhere" in envelope(payload, 404)
    status, payload, _ = call(target, "DELETE", target.read_path)
    assert status == 405 and "not allowed" in envelope(payload, 405)
    status, payload, _ = call(target, "POST", target.write_path, body=b"{not json")
    assert status == 400 and "JSON" in envelope(payload, 400)
    status, payload, _ = call(target, "POST", target.write_path, body={}, token="wrong")
    assert status == 401 and "Bearer" in envelope(payload, 401)
    status, payload, _ = call(target, "POST", target.write_path, body={},
                              headers={"Origin": "http://evil.example"})
    assert status == 403 and "another site" in envelope(payload, 403)
    status, payload, _ = call(target, "POST", target.write_path, body=b"{}",
                              headers={"Content-Type": "text/plain"})
    assert status == 415 and "application/json" in envelope(payload, 415)


def test_a_request_without_the_token_is_refused_before_its_body_is_read(target):
    # 30 MB announced, none sent: the 401 must come at once
    answer, seconds = raw(target, (
        f"POST {target.write_path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: application/json\r\nContent-Length: 30000000\r\n\r\n").encode())
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
    assert seconds < 5
    envelope(json.loads(answer.partition(b"\r\n\r\n")[2]), 401)


def test_a_body_over_the_limit_is_refused_before_it_is_read(target):
    too_big = target.limit + 1
    answer, seconds = raw(target, (
        f"POST {target.write_path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {too_big}\r\n\r\n").encode())
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert seconds < 5  # not one byte of the body was sent
    assert "over the limit" in envelope(json.loads(answer.partition(b"\r\n\r\n")[2]), 413)


def test_a_client_sending_a_refused_body_reads_the_413_not_a_reset(target):
    data = b"[" + b"1," * (LIMIT // 2 + 10) + b"1]"  # just over 1 MiB
    if len(data) <= target.limit:
        data = b" " * (target.limit + 1)
    status, payload, _ = call(target, "POST", target.write_path, body=data)
    assert status == 413
    envelope(payload, 413)
    assert call(target, "GET", target.read_path)[0] == 200  # still serving


def test_lengths_and_chunked_bodies_are_treated_alike(target):
    # no Content-Length and no chunking: no body (RFC 9112), the endpoint decides
    answer, _ = raw(target, (
        f"POST {target.write_path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n\r\n").encode())
    assert answer.split(b" ")[1] in (b"200", b"400"), answer[:200]
    # a chunked body is refused: send a length
    answer, _ = raw(target, (
        f"POST {target.write_path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n").encode())
    assert answer.startswith(b"HTTP/1.1 411"), answer[:200]
    assert "Content-Length" in envelope(json.loads(answer.partition(b"\r\n\r\n")[2]), 411)
    answer, _ = raw(target, (
        f"POST {target.write_path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
        "Content-Length: lots\r\n\r\n").encode())
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]


def test_both_servers_share_one_loopback_rule():
    for host in ("127.0.0.1", "127.0.1.1", "localhost", "::1"):
        check_bind(host, None)  # loopback: no token needed
    for host in ("0.0.0.0", "192.168.1.5", "::"):
        with pytest.raises(PosttrainError, match="--token"):
            check_bind(host, None)
        check_bind(host, "secret")
    from posttrain.service.server import check_bind as service_bind

    service_bind("127.0.1.1", None)  # the service used to refuse this one
    with pytest.raises(PosttrainError, match="--token"):
        service_bind("0.0.0.0", None)


def test_the_service_drops_a_client_stalled_mid_body(tmp_path, service_policy):
    from posttrain.service.engine import Engine
    from posttrain.service.server import start_server

    engine = Engine("starter-2m", tmp_path / "state", policy=service_policy, torch_threads=1)
    running = start_server(engine, port=0, read_timeout_s=0.5)
    try:
        target = Target(running.url, running.http.server_address, "", "", 0, None)
        answer, seconds = raw(target, (
            b"POST /v1/training/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 50\r\n\r\n{\"heart"))
        assert answer.startswith(b"HTTP/1.1 408") and seconds < 5
    finally:
        running.stop()
