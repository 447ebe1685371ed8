"""What other servers answer is input too (issue #32, classes 7 and 8 of the hostile probe).

Every client of another server (the endpoint agent, the judge and the prompt writer built
on it, the run store's sender) is held to one contract against real misbehaving servers
on 127.0.0.1 (``chat_servers.MISBEHAVIOURS``): a wrong status, a body that is not JSON,
JSON of the wrong shape, a truncated, huge, slow or hung-up answer ends in ONE line that
names the server and quotes what it sent (bounded), never a traceback. And the run
store's background sender fails loudly, once, while the run folder stays complete.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chat_servers import (
    MISBEHAVIOURS,
    SLOW,
    ChatHandler,
    Misbehaviour,
    completion,
    misbehaving,
    send_misbehaviour,
    serving,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from posttrain.envs import get_env
from posttrain.errors import PosttrainError
from posttrain.foreign_answers import QUOTE_CHARS, quoted
from posttrain.policy.endpoint_agent import EndpointAgent, EndpointSettings
from posttrain.policy.judge import endpoint_judge
from posttrain.runs.http_store import HttpRunStore
from posttrain.runs.store import METRICS_FILENAME, open_run

#: an error line's budget: the quote (QUOTE_CHARS and its escapes) plus the flag, URL,
#: what was wrong and what to do
MAX_LINE = 4 * QUOTE_CHARS + 300
MESSAGES = [{"role": "user", "content": "Refund order ORD-1, please."}]
BY_NAME = {answer.name: answer for answer in [*MISBEHAVIOURS, SLOW]}


def assert_one_named_line(text: str, url: str) -> None:
    """``text`` is one bounded line that names the server at ``url``."""
    assert len(text.splitlines()) == 1, text
    assert url in text, text
    assert len(text) <= MAX_LINE, len(text)
    assert "Traceback" not in text


def agent_at(url: str, **overrides: Any) -> EndpointAgent:
    """An agent that gives up fast: no retries, a 1 s timeout."""
    return EndpointAgent(EndpointSettings(url=url, max_retries=0, timeout_s=1.0,
                                          **overrides))


# ------------------------------------------------------------------ quoting an answer


def test_a_quoted_answer_is_one_line_cut_at_200_characters():
    assert quoted("") == "an empty body"
    assert quoted(b'{"a": 1}') == "'{\"a\": 1}'"
    line = quoted("<html>\n" + "x\u2028\x85\r" * 1000)
    assert len(line.splitlines()) == 1 and "first 200 of 4007 characters" in line


# ------------------------------------------------------------------ the endpoint agent


@pytest.mark.parametrize("answer", [*MISBEHAVIOURS, SLOW], ids=lambda answer: answer.name)
def test_a_chat_answer_that_is_no_reply_is_one_line_naming_the_endpoint(answer):
    # before #32: AttributeError/TypeError/JSONDecodeError from inside the openai
    # client's lenient models, or a reply of 42 (not text) handed to the grader
    with serving(misbehaving(answer)) as url:
        agent = agent_at(url)
        with pytest.raises(PosttrainError) as raised:
            agent(MESSAGES)
    assert_one_named_line(str(raised.value), f"--endpoint {url}")


@pytest.mark.parametrize("answer", MISBEHAVIOURS, ids=lambda answer: answer.name)
def test_a_model_listing_that_is_no_listing_is_one_line_naming_the_endpoint(answer):
    # the listing is asked first when no --endpoint-model is given
    with serving(misbehaving(answer, on_get=True)) as url:
        with pytest.raises(PosttrainError) as raised:
            agent_at(url)
    assert_one_named_line(str(raised.value), f"--endpoint {url}")


@pytest.mark.parametrize("name", ["200 html", "json list", "content a number"])
def test_the_line_quotes_the_start_of_what_the_endpoint_sent(name):
    answer = BY_NAME[name]
    with serving(misbehaving(answer)) as url, pytest.raises(PosttrainError) as raised:
        agent_at(url)(MESSAGES)
    assert answer.body.decode()[:60] in str(raised.value).replace('\\"', '"')


def test_a_huge_answer_is_quoted_only_in_part():
    with serving(misbehaving(BY_NAME["huge not json"])) as url:
        with pytest.raises(PosttrainError, match="first 200 of 8000000 characters") as raised:
            agent_at(url)(MESSAGES)
    assert len(str(raised.value)) <= MAX_LINE


def test_a_slow_endpoint_says_how_long_it_waited():
    with serving(misbehaving(SLOW)) as url:
        with pytest.raises(PosttrainError, match="no answer within 1 s"):
            agent_at(url)(MESSAGES)


def test_a_well_formed_answer_still_reads_as_before():
    class Fine(ChatHandler):
        def do_POST(self) -> None:
            self.body()
            self.send_json(completion(self.model, "Sure.", tool_calls=[{
                "id": "c", "type": "function",
                "function": {"name": "lookup_order", "arguments": '{"order_id": "ORD-1"}'}}]))

    with serving(Fine) as url:
        reply = agent_at(url)(MESSAGES)
    assert reply == ('Sure.\n<tool_call>\n{"name": "lookup_order", "arguments": '
                     '{"order_id": "ORD-1"}}\n</tool_call>')


# ------------------------------------------------------------------ the judge


@pytest.mark.parametrize("name", ["500", "200 html", "choices empty", "message null",
                                  "truncated"])
def test_a_judge_that_answers_no_verdict_is_one_line_naming_it(name):
    rows = [{"prompt": "Refund ORD-1", "reply": "Done.", "sample": 0}]
    with serving(misbehaving(BY_NAME[name])) as url:
        judge = endpoint_judge(url, "scripted", "OPENAI_API_KEY", get_env("refund"))
        judge.agent.client = judge.agent.client.with_options(max_retries=0)
        with pytest.raises(PosttrainError) as raised:
            judge.verdicts(rows)
    assert_one_named_line(str(raised.value), f"--judge-endpoint {url}")


# ------------------------------------------------------------------ any answer at all

#: statuses a server may send with a body (1xx, 204 and 304 carry none)
STATUSES = st.sampled_from([200, 201, 301, 302, 400, 401, 403, 404, 409, 418, 422, 429,
                            500, 502, 503])
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                 max_size=4),
    max_leaves=12)
MESSAGE_FIELDS = st.fixed_dictionaries({}, optional={
    "role": JSON_VALUES, "content": JSON_VALUES | st.text(max_size=50),
    "tool_calls": JSON_VALUES | st.lists(st.fixed_dictionaries({}, optional={
        "id": JSON_VALUES, "type": JSON_VALUES,
        "function": JSON_VALUES | st.fixed_dictionaries({}, optional={
            "name": JSON_VALUES | st.text(max_size=20),
            "arguments": JSON_VALUES | st.text(max_size=40)})}), max_size=3)})
COMPLETIONS = st.fixed_dictionaries({}, optional={
    "id": JSON_VALUES, "object": JSON_VALUES,
    "choices": JSON_VALUES | st.lists(JSON_VALUES | st.fixed_dictionaries({}, optional={
        "index": JSON_VALUES, "finish_reason": JSON_VALUES,
        "message": JSON_VALUES | MESSAGE_FIELDS}), max_size=3),
    "usage": JSON_VALUES})
BODIES = st.one_of(
    st.binary(max_size=300),
    st.text(max_size=300).map(str.encode),
    JSON_VALUES.map(lambda value: json.dumps(value).encode()),
    COMPLETIONS.map(lambda value: json.dumps(value).encode()),
)
CONTENT_TYPES = st.sampled_from(["application/json", "text/html", "text/plain", ""])


class Scripted:
    """The answer the property tests' one server gives next (set per example)."""

    answer = Misbehaviour("drawn")


class DrawnAnswer(ChatHandler):
    def do_POST(self) -> None:
        send_misbehaviour(self, Scripted.answer)


@pytest.fixture(scope="module")
def drawn_url() -> Iterator[str]:
    with serving(DrawnAnswer) as url:
        yield url


def reply_or_one_line(call: Any, url: str) -> None:
    """``call()`` returns, or raises PosttrainError as one line naming ``url``."""
    try:
        call()
    except PosttrainError as error:
        assert_one_named_line(str(error), url)


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(status=STATUSES, body=BODIES, content_type=CONTENT_TYPES)
def test_any_answer_to_the_endpoint_agent_is_a_reply_or_one_named_line(drawn_url, drawn_agent,
                                                                        status, body,
                                                                        content_type):
    # one agent for every example (as a run asks one agent again and again): each answer
    # is met by an agent that has already met the answers before it
    Scripted.answer = Misbehaviour("drawn", status, body, content_type)
    reply_or_one_line(lambda: _is_text(drawn_agent(MESSAGES)), f"--endpoint {drawn_url}")


@pytest.fixture
def drawn_agent(drawn_url: str) -> EndpointAgent:
    """The endpoint agent the property test asks (made once per test, not per example:
    an OpenAI client takes ~30 ms to make, as long as an answer here)."""
    return agent_at(drawn_url, model="scripted")


@pytest.fixture
def drawn_judge(drawn_url: str) -> Any:
    """The judge the property test asks, with its client's retries off (once per test)."""
    judge = endpoint_judge(drawn_url, "scripted", "OPENAI_API_KEY", get_env("refund"))
    judge.agent.client = judge.agent.client.with_options(max_retries=0)
    return judge


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(status=STATUSES, body=BODIES, content_type=CONTENT_TYPES)
def test_any_answer_to_the_judge_is_a_verdict_or_one_named_line(drawn_url, drawn_judge,
                                                                status, body, content_type):
    Scripted.answer = Misbehaviour("drawn", status, body, content_type)
    row = {"prompt": "Refund ORD-1", "reply": "Done.", "sample": 0}
    reply_or_one_line(lambda: _is_verdict(drawn_judge.verdicts([row])[0]),
                      f"--judge-endpoint {drawn_url}")


def _is_text(reply: Any) -> None:
    assert isinstance(reply, str), reply


def _is_verdict(verdict: Any) -> None:
    assert verdict in (True, False, None), verdict


# ------------------------------------------------------------------ through the CLI


def posttrain(*args: str, env: dict[str, str] | None = None,
              cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "posttrain", *args], capture_output=True,
                          text=True, timeout=180, cwd=cwd,
                          env={**os.environ, **(env or {})})


def assert_cli_error(done: subprocess.CompletedProcess[str], command: str,
                     server: str) -> None:
    """Exit 2 with one ``error:`` line naming ``server``, and no traceback."""
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, done.stderr[-2000:]
    assert errors[0].startswith(f"posttrain {command}: error: "), errors[0]
    assert_one_named_line(errors[0], server)


@pytest.mark.parametrize("name", ["200 html", "json list", "huge not json"])
def test_eval_against_an_endpoint_that_misbehaves_exits_with_one_line(name):
    with serving(misbehaving(BY_NAME[name])) as url:
        done = posttrain("eval", "--endpoint", url, "--endpoint-model", "scripted",
                         "--endpoint-retries", "0", "--prompts", "5", "--split", "all",
                         "--samples", "1")
    assert_cli_error(done, "eval", f"--endpoint {url}")


def test_eval_with_a_judge_that_misbehaves_exits_with_one_line():
    with serving(misbehaving(BY_NAME["choices a string"])) as url:
        done = posttrain("eval", "--judge-endpoint", url, "--judge-model", "scripted",
                         "--prompts", "5", "--split", "all", "--samples", "1")
    assert_cli_error(done, "eval", f"--judge-endpoint {url}")


def test_a_prompt_writer_that_misbehaves_exits_with_one_line(tmp_path):
    with serving(misbehaving(BY_NAME["not json"])) as url:
        done = posttrain("prompts", "write", str(tmp_path / "out.jsonl"), "--prompts", "2",
                         "--endpoint", url, "--endpoint-retries", "0", "--angles", "plain")
    assert_cli_error(done, "prompts", f"--endpoint {url}")
    assert not (tmp_path / "out.jsonl").exists()


# ------------------------------------------------------------------ the run store


def test_a_malformed_run_server_url_is_refused_before_anything_loads(tmp_path):
    # before #32: the run started, the sender thread died with a traceback on its first
    # post, and the run was recorded in no store
    started = time.monotonic()
    done = posttrain("grpo", "--runs-dir", str(tmp_path / "runs"), "--steps", "1",
                     env={"POSTTRAIN_SERVER": "::bad::"}, cwd=tmp_path)
    assert_cli_error(done, "grpo", "POSTTRAIN_SERVER='::bad::'")
    assert "http:// or https://" in done.stderr
    assert not (tmp_path / "runs").exists()  # no run folder, no model
    assert time.monotonic() - started < 120


@pytest.mark.parametrize("url", ["::bad::", "http://127.0.0.1:notaport", "http://",
                                 "ftp://127.0.0.1:8765", "http://[::1", "http://host:0",
                                 "http://host:70000", "http://a b:1", "http://h:1/?x=1"])
def test_a_run_store_refuses_a_url_that_is_not_a_servers(url):
    with pytest.raises(PosttrainError, match="server_url=") as raised:
        HttpRunStore(url)
    assert len(str(raised.value).splitlines()) == 1


class RunServerTurned(ChatHandler):
    """A run server that acknowledges every ingest until ``turn`` is set, then answers
    with ``garbage`` (class attributes: set by each test)."""

    turn = threading.Event()
    garbage = Misbehaviour("unset")

    def do_POST(self) -> None:
        if self.turn.is_set():
            send_misbehaviour(self, self.garbage)
            return
        self.body()
        self.send_json({"ok": True, "applied": 1, "duplicate": False})


@pytest.fixture
def thread_failures(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What any thread raised without catching (a traceback on stderr otherwise)."""
    failures: list[str] = []
    monkeypatch.setattr(threading, "excepthook",
                        lambda args: failures.append(f"{args.exc_type.__name__}: "
                                                     f"{args.exc_value}"))
    return failures


def wait_until(condition: Any, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)


def log_steps(run: Any, steps: range) -> None:
    for step in steps:
        run.log(step, {"reward": step / 10})


@pytest.mark.parametrize("name", ["200 html", "json list", "not http", "truncated"])
def test_a_run_server_that_starts_answering_garbage_is_said_once_and_the_folder_is_whole(
        name, tmp_path, thread_failures):
    RunServerTurned.turn = threading.Event()
    RunServerTurned.garbage = BY_NAME[name]
    warnings = io.StringIO()
    with serving(RunServerTurned) as api:
        server = api.removesuffix("/v1")
        store = HttpRunStore(server, flush_seconds=0.05, request_timeout=1.0,
                             max_backoff=0.2, close_timeout=1.0, warn_stream=warnings)
        run = open_run("garbled", {"recipe": "test"}, store=store, run_dir=tmp_path / "run",
                       heartbeat_seconds=None)
        log_steps(run, range(0, 5))
        wait_until(lambda: store.sent >= 6)
        assert store.sent >= 6 and not warnings.getvalue()  # a good server: silence
        RunServerTurned.turn.set()
        log_steps(run, range(5, 40))
        wait_until(lambda: store.errors >= 1)
        run.finish({"reward": 1.0})
        started = time.monotonic()
        store.close()
        assert time.monotonic() - started < 5
    lines = warnings.getvalue().splitlines()
    for line in lines:
        assert_one_named_line(line, server)
    # said once, however many batches went wrong (an answer cut short is retried, so
    # closing may add how many records were left undelivered)
    failures = [line for line in lines if "could not be delivered" not in line]
    assert len(failures) == 1, lines
    assert not thread_failures
    rows = (tmp_path / "run" / METRICS_FILENAME).read_text().splitlines()
    assert [json.loads(row)["step"] for row in rows] == list(range(40))


def test_a_run_server_that_goes_away_is_said_once(tmp_path, thread_failures):
    RunServerTurned.turn = threading.Event()
    warnings = io.StringIO()
    with serving(RunServerTurned) as api:
        server = api.removesuffix("/v1")
        store = HttpRunStore(server, flush_seconds=0.05, request_timeout=0.5,
                             max_backoff=0.2, close_timeout=0.5, warn_stream=warnings)
        run = open_run("gone", {}, store=store, run_dir=tmp_path / "run",
                       heartbeat_seconds=None)
        wait_until(lambda: store.sent >= 1)
    log_steps(run, range(20))  # the server is gone
    wait_until(lambda: store.errors >= 2)
    run.finish()
    store.close()
    assert "unreachable" in warnings.getvalue()
    assert sum("unreachable" in line for line in warnings.getvalue().splitlines()) == 1
    assert not thread_failures
    assert len((tmp_path / "run" / METRICS_FILENAME).read_text().splitlines()) == 20


def test_a_sender_that_fails_says_so_once_and_nothing_waits_on_it(tmp_path, monkeypatch,
                                                                 thread_failures):
    def broken(self: HttpRunStore, batch_id: str, ops: list[Any]) -> str:
        raise RuntimeError("a bug nobody foresaw")

    monkeypatch.setattr(HttpRunStore, "_post", broken)
    warnings = io.StringIO()
    store = HttpRunStore("http://127.0.0.1:9", flush_seconds=0.05, close_timeout=30.0,
                         warn_stream=warnings)
    run = open_run("broken", {}, store=store, run_dir=tmp_path / "run",
                   heartbeat_seconds=None)
    wait_until(lambda: bool(warnings.getvalue()))
    log_steps(run, range(10))
    run.finish()
    started = time.monotonic()
    store.close()
    assert time.monotonic() - started < 2  # not the 30 s close_timeout: the thread is gone
    lines = warnings.getvalue().splitlines()
    assert len(lines) == 1 and "the sender stopped (RuntimeError" in lines[0], lines
    assert store.pending == 0 and not thread_failures
    assert len((tmp_path / "run" / METRICS_FILENAME).read_text().splitlines()) == 10
