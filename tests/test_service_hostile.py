"""`posttrain serve` against the hostile probe of issue #32, over real HTTP on 127.0.0.1.

Each test pins one finding: long polls that held every request thread (``/health`` took
29 s), query parameters that were not bounded, a chat prompt longer than the context
answered with a negative ``max_tokens``, errors that showed the server's folders, and a
run whose ``run.json`` was damaged vanishing after a restart.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from posttrain.service.client import ServiceClient
from posttrain.service.engine import Engine
from posttrain.service.protocols.tinker.routes import tinker_available
from posttrain.service.server import start_server

BASE = "starter-2m"
# values of a numeric query parameter the probe sent; each must be a 400 naming it
HOSTILE_NUMBERS = ["abc", "-1", "nan", "NaN", "inf", "-inf", "1e400", "99999999999999999999",
                   "1_0", "\u0661", "0x10", "1e", "--1", "5 s"]


@pytest.fixture(scope="module")
def server(policy, tmp_path_factory, one_torch_thread):
    """A server with the default limits: the long-poll cap the probe ran into."""
    engine = Engine(BASE, tmp_path_factory.mktemp("state"), policy=policy,
                    torch_threads=one_torch_thread)
    running = start_server(engine, port=0)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def session(server):
    with ServiceClient(server.url).create_session() as opened:
        yield opened


@pytest.fixture(scope="module")
def finished_operation(server, session):
    """The id of an operation that has succeeded (a poll of it never waits)."""
    run = session.create_run(rank=4)
    operation = run.submit("save_weights_for_sampler", {"version": 0})
    operation.result(timeout_s=60)
    return operation.id


def call(server, method, path, body=None, *, timeout=60.0):
    """(status, parsed JSON) of one request; ``path`` is the whole path with its query."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(server.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def queued_operation(server, session):
    """(run id, operation id) of an operation that stays queued: seq 2 of a run waits for
    a seq 1 that is never sent."""
    run = session.create_run(rank=4)
    status, operation = call(server, "POST", f"/v1/training/runs/{run.id}/save_weights_for_sampler",
                             {"seq": 2, "version": 0})
    assert status == 202 and operation["status"] == "queued"
    return run.id, operation["operation_id"]


def poll_in_thread(server, path, answers):
    """Start a thread that sends GET ``path`` and appends (status, seconds) to ``answers``."""
    def poll():
        started = time.monotonic()
        try:
            status, _ = call(server, "GET", path, timeout=90)
        except OSError as error:  # a reset or a timeout: recorded, the test then fails
            status = repr(error)
        answers.append((status, time.monotonic() - started))

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    return thread


# ---------------------------------------------------------------- 1. long polls


def test_many_long_polls_leave_health_answering_and_the_excess_answered_at_once(server,
                                                                               session):
    """The probe: 45 waits of 30 s on a queued operation made /health take 29 s (all 40
    request threads held). Now 24 (``max_long_polls``) hold their wait, the other 21 get
    the operation as it is (still queued) within ``crowded_poll_s``, and /health answers."""
    limits = server.engine.limits
    run_id, operation_id = queued_operation(server, session)
    answers: list[tuple[object, float]] = []
    threads = [poll_in_thread(server, f"/v1/training/operations/{operation_id}?wait=30",
                              answers) for _ in range(45)]
    time.sleep(2.0)  # every poll has arrived
    started = time.monotonic()
    status, health = call(server, "GET", "/v1/training/health", timeout=20)
    assert status == 200 and health == {"status": "ok"}
    assert time.monotonic() - started < 5.0
    excess = 45 - limits.max_long_polls
    deadline = time.monotonic() + 10
    while len(answers) < excess and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(answers) == excess  # the held ones are still waiting
    assert all(status == 200 for status, _ in answers)
    # 1 s each; the ones past the 40 threads waited for a thread first
    assert max(seconds for _, seconds in answers) < 2 * limits.crowded_poll_s + 5
    call(server, "POST", f"/v1/training/runs/{run_id}/cancel")  # ends the held polls
    for thread in threads:
        thread.join(30)
    assert len(answers) == 45 and all(status == 200 for status, _ in answers)


@pytest.mark.skipif(not tinker_available(), reason="the tinker routes need the tinker package")
def test_the_tinker_route_shares_the_cap_with_the_native_route(server, session):
    """With the native route's waits filling the cap, a tinker retrieve_future of a pending
    future is answered 408 try-again within ``crowded_poll_s``, not after its 25 s."""
    from posttrain.service.protocols.tinker.requests import TESTED_SDK_VERSION

    status, tinker_session = call(server, "POST", "/api/v1/create_session",
                                  {"sdk_version": TESTED_SDK_VERSION})
    assert status == 200, tinker_session
    session_id = tinker_session["session_id"]
    status, created = call(server, "POST", "/api/v1/create_model",
                           {"session_id": session_id, "model_seq_id": 0, "base_model": BASE,
                            "lora_config": {"rank": 4}})
    assert status == 200, created
    status, model = call(server, "POST", "/api/v1/retrieve_future",
                         {"request_id": created["request_id"]})
    assert status == 200, model
    adam = {"learning_rate": 1e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8,
            "weight_decay": 0.0, "grad_clip_norm": 1.0}
    status, pending = call(server, "POST", "/api/v1/optim_step",  # seq_id 1 never comes
                           {"model_id": model["model_id"], "seq_id": 2, "adam_params": adam})
    assert status == 200, pending

    limits = server.engine.limits
    run_id, operation_id = queued_operation(server, session)
    answers: list[tuple[object, float]] = []
    threads = [poll_in_thread(server, f"/v1/training/operations/{operation_id}?wait=30",
                              answers) for _ in range(limits.max_long_polls)]
    time.sleep(2.0)
    started = time.monotonic()
    status, answer = call(server, "POST", "/api/v1/retrieve_future",
                          {"request_id": pending["request_id"]})
    assert status == 408 and answer["type"] == "try_again"
    assert time.monotonic() - started < limits.crowded_poll_s + 3
    call(server, "POST", f"/v1/training/runs/{run_id}/cancel")
    call(server, "POST", f"/api/v1/sessions/{session_id}/finish")
    for thread in threads:
        thread.join(30)


# ---------------------------------------------------------------- 2. query parameters


@pytest.mark.parametrize("value", HOSTILE_NUMBERS)
def test_a_wait_that_is_not_a_sane_number_is_a_400_naming_it(server, finished_operation,
                                                             value):
    query = urllib.parse.urlencode({"wait": value})
    status, answer = call(server, "GET", f"/v1/training/operations/{finished_operation}?{query}")
    assert status == 400, answer
    message = answer["error"]["message"]
    assert message.startswith("query parameter 'wait' must be") and "\n" not in message


def test_a_sane_wait_still_polls(server, finished_operation):
    for value in ("0", "0.5", "30", "3600", "", "1e1"):
        status, answer = call(server, "GET",
                              f"/v1/training/operations/{finished_operation}?wait={value}")
        assert status == 200 and answer["status"] == "succeeded", (value, answer)


def service_get_routes(server, session, finished_operation):
    """Every GET route of the service (with real ids, and an unknown one) and the query
    parameters it reads."""
    run_id = session.create_run(rank=4).id
    routes = [
        ("/v1/training/health", ()), ("/v1/training/capabilities", ()),
        (f"/v1/training/sessions/{session.id}", ()), (f"/v1/training/runs/{run_id}", ()),
        (f"/v1/training/operations/{finished_operation}", ("wait",)),
        ("/v1/training/operations/op-unknown", ("wait",)),
        ("/v1/models", ()), (f"/v1/models/{BASE}", ()),
    ]
    if tinker_available():
        routes += [("/api/v1/healthz", ()), ("/api/v1/get_server_capabilities", ()),
                   ("/api/v1/samplers/samp-unknown", ())]
    return routes


def test_any_query_string_on_any_route_is_an_answer_never_a_500(server, session,
                                                                 finished_operation):
    """Hypothesis: 400 drawn query strings over every GET route (the parameters each reads,
    names the probe tried, any name; the probe's values, any text): a status under 500,
    a JSON body, and an error message of one short line that names a refused parameter."""
    routes = service_get_routes(server, session, finished_operation)
    names = st.sampled_from(["wait", "limit", "after", "page", "cursor"]) | st.text(max_size=12)
    values = st.sampled_from(HOSTILE_NUMBERS) | st.text(max_size=200)

    @settings(max_examples=400, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(route=st.sampled_from(routes), extra_name=names, value=values,
           data=st.data())
    def holds(route, extra_name, value, data):
        path, parameters = route
        name = data.draw(st.sampled_from(parameters)) if parameters else extra_name
        query = urllib.parse.urlencode({name: value})
        status, answer = call(server, "GET", f"{path}?{query}")
        assert status < 500, (path, query, answer)
        if status >= 400:
            message = answer["error"]["message"]
            assert "\n" not in message and len(message) < 300, message
            if name in parameters:
                assert f"query parameter {name!r}" in message or status == 404, message

    holds()


# ---------------------------------------------------------------- 3. a prompt over the context


def test_a_prompt_longer_than_the_context_says_so_in_tokens(server):
    marker = "ZQXJ-secret "
    body = {"model": BASE, "messages": [{"role": "user", "content": marker * 20_000}]}
    status, answer = call(server, "POST", "/v1/chat/completions", body)
    assert status == 400
    message = answer["error"]["message"]
    context = server.engine.limits.max_sequence_tokens
    assert message.startswith("messages: the prompt is ")
    assert f"longer than the model's context of {context} tokens" in message
    assert "max_tokens" not in message and "ZQXJ" not in message and len(message) < 300


def test_max_tokens_past_the_room_left_names_the_room(server):
    body = {"model": BASE, "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": server.engine.limits.max_sequence_tokens}
    status, answer = call(server, "POST", "/v1/chat/completions", body)
    assert status == 400
    assert answer["error"]["message"].startswith("max_tokens: the prompt is ")
    assert "more fit the model's context of" in answer["error"]["message"]


# ---------------------------------------------------------------- 4. server paths


def server_folders(server):
    engine = server.engine
    folders = {str(engine.state_dir), str(engine.state_dir.resolve())}
    if getattr(engine.policy, "source", None):
        folders.add(str(engine.policy.source))
    return folders


@pytest.mark.skipif(not tinker_available(), reason="the tinker routes need the tinker package")
def test_another_base_model_is_refused_without_the_models_folder(server):
    from posttrain.service.protocols.tinker.requests import TESTED_SDK_VERSION

    _, tinker_session = call(server, "POST", "/api/v1/create_session",
                             {"sdk_version": TESTED_SDK_VERSION})
    status, answer = call(server, "POST", "/api/v1/create_model",
                          {"session_id": tinker_session["session_id"], "model_seq_id": 0,
                           "base_model": "Qwen/Qwen3-8B", "lora_config": {"rank": 4}})
    assert status == 400
    message = answer["error"]["message"]
    assert "this server serves 'starter-2m', not 'Qwen/Qwen3-8B'" in message
    assert "base_model='starter-2m'" in message
    assert not any(folder in message for folder in server_folders(server)), message


def test_a_damaged_export_fails_without_the_state_folder_in_the_message(server, session):
    """An exception from a file under the state folder (here PEFT's, for an export whose
    weights are gone) reaches the client with the path relative to that folder."""
    run = session.create_run(rank=4)
    run.submit("export_lora", {"name": "broken"}).result(timeout_s=60)
    export = server.engine.state_dir / "runs" / run.id / "exports" / "broken"
    for weights in export.glob("adapter_model.*"):
        weights.unlink()
    body = {"model": f"{run.id}/broken", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2}
    status, answer = call(server, "POST", "/v1/chat/completions", body)
    assert status >= 400
    message = answer["error"]["message"]
    assert not any(folder in message for folder in server_folders(server)), message


# ---------------------------------------------------------------- 5. a damaged run.json


@pytest.mark.parametrize(("content", "problem"), [
    (b"\x00\xffgarbage{", "not UTF-8 JSON"),
    (b"[1, 2, 3]", "expected a JSON object, got list"),
    (b'{"status": "active"}', "run_id None is not its folder's name"),
])
def test_a_damaged_run_record_is_named_after_a_restart_not_dropped(policy, tmp_path,
                                                                   one_torch_thread, capsys,
                                                                   content, problem):
    first = start_server(Engine(BASE, tmp_path, policy=policy, torch_threads=one_torch_thread),
                         port=0)
    try:
        with ServiceClient(first.url).create_session() as opened:
            run_id = opened.create_run(rank=4).id
            kept_id = opened.create_run(rank=4).id
    finally:
        first.stop()
    (tmp_path / "runs" / run_id / "run.json").write_bytes(content)
    capsys.readouterr()

    second = start_server(Engine(BASE, tmp_path, policy=policy,
                                 torch_threads=one_torch_thread), port=0)
    try:
        logged = capsys.readouterr().err
        status, answer = call(second, "GET", f"/v1/training/runs/{run_id}")
        assert status == 409, answer
        message = answer["error"]["message"]
        assert message.startswith(f"run {run_id}'s state file runs/{run_id}/run.json is "
                                  f"damaged: {problem}")
        assert str(tmp_path) not in message and "\n" not in message
        assert logged.count(f"run {run_id}'s state file") == 1  # logged once, at start-up
        assert second.engine.damaged_runs()[0]["run_id"] == run_id
        status, answer = call(second, "POST", f"/v1/training/runs/{run_id}/resume",
                              {"session_id": "s"})
        assert status == 409 and "is damaged" in answer["error"]["message"]
        status, kept = call(second, "GET", f"/v1/training/runs/{kept_id}")
        assert status == 200 and kept["run_id"] == kept_id  # its neighbour reads as before
    finally:
        second.stop()
