"""`posttrain eval --endpoint`: a model behind an OpenAI-compatible API, graded like one
loaded here. Against a live `posttrain serve` (its OpenAI route) on the tiny starter, and
against a small HTTP server of the test's own that answers 429 before it answers, or
nothing at all; the error paths (wrong key, unknown model, server down) say what to do."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from chat_servers import ChatHandler, completion, serving

from posttrain.cli import main
from posttrain.errors import PosttrainError
from posttrain.foreign_answers import chat_reply
from posttrain.policy.endpoint_agent import EndpointAgent, EndpointSettings, to_openai_messages

BASE = "starter-2m"
COMMON = ["--prompts", "40", "--samples", "2", "--max-new-tokens", "64"]


# ------------------------------------------------------------------ a live posttrain serve


@pytest.fixture(scope="module")
def policy(starter_2m_folder):
    pytest.importorskip("torch")
    from posttrain.policy.loading import load_policy

    return load_policy(BASE, device="cpu", show_progress=False)


@pytest.fixture(scope="module")
def served(policy, tmp_path_factory):
    from posttrain.service.engine import Engine
    from posttrain.service.server import start_server

    engine = Engine(BASE, tmp_path_factory.mktemp("state"), policy=policy, torch_threads=1)
    running = start_server(engine, port=0)
    yield running.url + "/v1"
    running.stop()


@pytest.fixture(scope="module")
def served_with_token(policy, tmp_path_factory):
    from posttrain.service.engine import Engine
    from posttrain.service.server import start_server

    engine = Engine(BASE, tmp_path_factory.mktemp("state"), policy=policy, torch_threads=1)
    running = start_server(engine, port=0, token="s3cret")
    yield running.url + "/v1"
    running.stop()


def read_rows(path):
    return [json.loads(line) for line in open(path)]


def test_an_endpoint_scores_what_the_same_model_scores_here(served, tmp_path, capsys):
    remote, local = tmp_path / "endpoint.jsonl", tmp_path / "local.jsonl"
    assert main(["eval", "--endpoint", served, "--endpoint-model", BASE, *COMMON,
                 "--out", str(remote)]) == 0
    printed = capsys.readouterr().out
    assert f"endpoint={served}" in printed and f"endpoint_model={BASE}" in printed
    assert main(["eval", "--base-model", BASE, *COMMON, "--out", str(local)]) == 0
    remote_rows, local_rows = read_rows(remote), read_rows(local)
    key = lambda row: (row["scenario_id"], row["prompt"], row["sample"])  # noqa: E731
    assert sorted(map(key, remote_rows)) == sorted(map(key, local_rows))
    assert {row["policy"]["endpoint_model"] for row in remote_rows} == {BASE}
    assert {row["policy"]["endpoint"] for row in remote_rows} == {served}
    # the same prompt tokens, seeds and sampling: the same replies, but for a token that
    # float rounding may flip where batch shapes differ (one request vs a batch of 64)
    local_by_key = {key(row): row for row in local_rows}
    same = sum(row["score"] == local_by_key[key(row)]["score"] for row in remote_rows)
    assert same >= 0.9 * len(remote_rows)
    mean = lambda rows: sum(row["score"] for row in rows) / len(rows)  # noqa: E731
    assert abs(mean(remote_rows) - mean(local_rows)) <= 0.05
    # and --compare pairs the two agents by scenario
    assert main(["eval", "--compare", str(local), str(remote)]) in (0, 1)
    assert "paired" in capsys.readouterr().out


def test_a_refused_key_names_the_variable_it_came_from(served_with_token, monkeypatch,
                                                       capsys):
    monkeypatch.setenv("MY_ENDPOINT_KEY", "wrong")
    code = main(["eval", "--endpoint", served_with_token, "--endpoint-key-env",
                 "MY_ENDPOINT_KEY", "--prompts", "30", "--samples", "1"])
    assert code == 2
    error = capsys.readouterr().err
    assert "refused the API key (HTTP 401" in error and "$MY_ENDPOINT_KEY" in error
    monkeypatch.setenv("MY_ENDPOINT_KEY", "s3cret")
    assert main(["eval", "--endpoint", served_with_token, "--endpoint-key-env",
                 "MY_ENDPOINT_KEY", "--prompts", "30", "--samples", "1",
                 "--max-new-tokens", "32"]) == 0


def test_an_unknown_model_lists_what_the_endpoint_serves(served, capsys):
    code = main(["eval", "--endpoint", served, "--endpoint-model", "gpt-nothing",
                 "--prompts", "30", "--samples", "1"])
    assert code == 2
    error = capsys.readouterr().err
    assert "gpt-nothing" in error and f"it serves: {BASE}" in error


def test_a_server_that_is_down_is_named(capsys):
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code = main(["eval", "--endpoint", f"http://127.0.0.1:{port}/v1", "--endpoint-model", "m",
                 "--endpoint-retries", "0", "--prompts", "30", "--samples", "1"])
    assert code == 2
    assert "cannot reach it" in capsys.readouterr().err


# ------------------------------------------------------------------ a server of our own


class Scripted(ChatHandler):
    """429 for the first ``busy`` chat requests, then a reply with a tool call."""

    busy = 2
    seen: list[dict]

    def do_POST(self):
        body = self.body()
        type(self).seen.append(body)
        if len(type(self).seen) <= type(self).busy:
            self.send_json({"error": {"message": "slow down", "type": "rate_limit"}}, 429,
                           {"Retry-After": "0"})
            return
        self.send_json(completion(body["model"], tool_calls=[{
            "id": "call_1", "type": "function", "function": {
                "name": "lookup_order", "arguments": '{"order_id": "ORD-4417"}'}}]))


@pytest.fixture
def scripted():
    Scripted.seen = []
    Scripted.busy = 2
    with serving(Scripted) as url:
        yield url


def test_429_is_retried_with_backoff_then_the_reply_is_graded(scripted):
    from posttrain.envs import get_env

    env = get_env("refund")
    agent = EndpointAgent(EndpointSettings(url=scripted, max_retries=3), tools=env.tools)
    assert agent.model == "scripted"  # the endpoint's only model
    messages = env.messages_for("Where is my order ORD-4417?")
    reply = agent.reply_batch([messages], [123])[0]
    assert len(Scripted.seen) == 3  # two 429s, then the answer
    sent = Scripted.seen[-1]
    assert sent["seed"] == 123 and sent["model"] == "scripted"
    assert [tool["function"]["name"] for tool in sent["tools"]] == [
        tool["function"]["name"] for tool in env.tools]
    assert reply == ('<tool_call>\n{"name": "lookup_order", "arguments": '
                     '{"order_id": "ORD-4417"}}\n</tool_call>')


def test_a_server_that_keeps_answering_429_stops_with_what_to_do(scripted):
    Scripted.busy = 100
    agent = EndpointAgent(EndpointSettings(url=scripted, model="scripted", max_retries=1))
    with pytest.raises(PosttrainError, match="still answered 429 after 1 retries"):
        agent.reply_batch([[{"role": "user", "content": "hi"}]], [0])
    assert len(Scripted.seen) == 2


def test_an_endpoint_eval_needs_no_torch(scripted, tmp_path):
    """The base install (numpy, rich) plus the openai client is enough to grade an endpoint."""
    Scripted.busy = 0
    code = ("import sys; from posttrain.cli import main; "
            f"code = main(['eval', '--endpoint', '{scripted}', '--prompts', '30', "
            "'--samples', '1', '--endpoint-concurrency', '2']); "
            "assert 'torch' not in sys.modules, 'torch was imported'; sys.exit(code)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "endpoint_model=scripted" in done.stdout


# ------------------------------------------------------------------ the wire, both ways


def test_a_tool_call_in_text_and_as_tool_calls_grade_the_same():
    from posttrain.envs import get_env

    env = get_env("refund")
    prompt = "Refund order ORD-4417, it arrived broken."
    in_text = ('<tool_call>\n{"name": "lookup_order", "arguments": {"order_id": "ORD-4417"}}'
               "\n</tool_call>")
    structured = completion("m", tool_calls=[{"id": "c", "type": "function", "function": {
        "name": "lookup_order", "arguments": '{"order_id": "ORD-4417"}'}}])
    case = env.case_for(prompt)
    assert env.score(chat_reply(json.dumps(structured), "test"), case) \
        == env.score(in_text, case)


def test_an_episode_history_goes_out_as_structured_tool_calls():
    history = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "Where is ORD-1?"},
        {"role": "assistant", "content": 'Looking.\n<tool_call>\n{"name": "lookup_order", '
                                         '"arguments": {"order_id": "ORD-1"}}\n</tool_call>'},
        {"role": "tool", "name": "lookup_order", "content": '{"status": "shipped"}'},
    ]
    sent = to_openai_messages(history)
    assert sent[2]["content"] == "Looking."
    call = sent[2]["tool_calls"][0]
    assert call["function"] == {"name": "lookup_order", "arguments": '{"order_id": "ORD-1"}'}
    assert sent[3] == {"role": "tool", "content": '{"status": "shipped"}',
                       "tool_call_id": call["id"]}


def test_bad_endpoint_flags_are_refused(capsys):
    assert main(["eval", "--endpoint", "ftp://x", "--prompts", "30"]) == 2
    assert "http:// or https://" in capsys.readouterr().err
    assert main(["eval", "--endpoint", "http://127.0.0.1:9/v1", "--base-model", BASE]) == 2
    assert "leave out" in capsys.readouterr().err
    assert main(["eval", "--agent", "endpoint"]) == 2
    assert "needs --endpoint URL" in capsys.readouterr().err
