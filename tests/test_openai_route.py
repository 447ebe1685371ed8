"""`posttrain serve` as an OpenAI endpoint, driven by the official `openai` client: the
base model, a run's sampler versions and an exported adapter by name; tools rendered and
tool calls parsed back; n, seed, temperature, top_p, max_tokens, stop and logprobs; the
refusals (unknown model, streaming, top_logprobs, bad fields) in OpenAI's error shape."""

from __future__ import annotations

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("torch")

from posttrain.service.client import AdamParams, ServiceClient  # noqa: E402
from posttrain.service.engine import Engine  # noqa: E402
from posttrain.service.server import start_server  # noqa: E402

BASE = "starter-2m"
TOOLS = [
    {"type": "function", "function": {
        "name": "lookup_order", "description": "Fetch an order by id.",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}},
                       "required": ["order_id"]}}},
    {"type": "function", "function": {
        "name": "create_refund", "description": "Refund an amount on an order.",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "string"},
                                                        "amount": {"type": "number"}},
                       "required": ["order_id", "amount"]}}},
]


@pytest.fixture(scope="module")
def server(starter_2m_folder, tmp_path_factory):
    from posttrain.policy.loading import load_policy

    policy = load_policy(BASE, device="cpu", show_progress=False)
    engine = Engine(BASE, tmp_path_factory.mktemp("state"), policy=policy, torch_threads=1)
    running = start_server(engine, port=0)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="anything", max_retries=0)


@pytest.fixture(scope="module")
def refund_prompts():
    """With-id refund prompts as the environment writes them (its system prompt lists the
    tools in the format the starter was trained on)."""
    from posttrain.data.prepare import DataConfig, prepare_data
    from posttrain.envs import get_env

    env = get_env("refund")
    data = prepare_data(DataConfig(prompts=30, seed=0), env)
    return [env.messages_for(r["prompt"]) for r in data.holdout if r["category"] == "with_id"]


@pytest.fixture(scope="module")
def refund_messages(refund_prompts):
    return refund_prompts[0], None


def test_the_base_model_is_listed_and_answers(client, refund_messages):
    assert [model.id for model in client.models.list()] == [BASE]
    assert client.models.retrieve(BASE).id == BASE
    messages, _ = refund_messages
    reply = client.chat.completions.create(model=BASE, messages=messages, max_tokens=32,
                                           seed=7)
    assert reply.object == "chat.completion" and reply.model == BASE
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
    assert reply.usage.prompt_tokens > 0
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_a_tool_call_comes_back_as_tool_calls_and_the_result_goes_back_in(client,
                                                                        refund_prompts):
    # the tiny starter writes a clean call in about 3 of 4 samples at temperature 0.3 (5
    # of 6 with-id prompts greedily): look through up to 4 prompts x 8 samples for one
    calls, seen = [], []
    for messages in refund_prompts[:4]:
        reply = client.chat.completions.create(model=BASE, messages=messages, tools=TOOLS,
                                               n=8, seed=11, temperature=0.3, max_tokens=48)
        seen += [choice.message.content for choice in reply.choices]
        calls = [choice for choice in reply.choices if choice.finish_reason == "tool_calls"]
        if calls:
            break
    assert calls, seen
    call = calls[0].message.tool_calls[0]
    assert call.type == "function" and call.function.name == "lookup_order"
    import json

    arguments = json.loads(call.function.arguments)
    assert set(arguments) == {"order_id"} and arguments["order_id"].startswith("ORD-")
    assert calls[0].message.content is None  # nothing before the call
    # the call and its result go back in as the next turn's history
    follow = client.chat.completions.create(
        model=BASE, tools=TOOLS, max_tokens=32, seed=3,
        messages=[*messages, calls[0].message.model_dump(exclude_none=True),
                  {"role": "tool", "tool_call_id": call.id,
                   "content": json.dumps({"order_id": arguments["order_id"],
                                          "status": "delivered", "total": 40.0})}])
    assert follow.choices[0].message.role == "assistant"


def test_seed_n_stop_and_logprobs(client, refund_messages):
    messages, _ = refund_messages
    first = client.chat.completions.create(model=BASE, messages=messages, n=3, seed=5,
                                           temperature=1.0, top_p=0.9, max_tokens=24,
                                           logprobs=True)
    again = client.chat.completions.create(model=BASE, messages=messages, n=3, seed=5,
                                           temperature=1.0, top_p=0.9, max_tokens=24,
                                           logprobs=True)
    assert len(first.choices) == 3 and [c.index for c in first.choices] == [0, 1, 2]
    assert [c.message.content for c in first.choices] == [c.message.content
                                                         for c in again.choices]
    for choice in first.choices:
        tokens = choice.logprobs.content
        assert tokens and all(entry.logprob <= 0 for entry in tokens)
        assert sum(1 for _ in tokens) <= 24
    short = client.chat.completions.create(model=BASE, messages=messages, max_tokens=2, seed=5)
    assert short.choices[0].finish_reason == "length" and short.usage.completion_tokens == 2
    # a stop string ends the reply and is left out of it, as OpenAI does: the same seeds
    # draw the same tokens up to the stop
    longest = max(first.choices, key=lambda choice: len(choice.message.content or ""))
    text = longest.message.content
    assert len(text) >= 6, text
    stop = text[3:6]
    stopped = client.chat.completions.create(model=BASE, messages=messages, n=3, seed=5,
                                             temperature=1.0, top_p=0.9, max_tokens=24,
                                             stop=[stop])
    cut = stopped.choices[longest.index]
    assert cut.message.content == text[: text.index(stop)]
    assert cut.finish_reason == "stop"


def test_a_runs_sampler_versions_and_exported_adapters_are_models(server, client,
                                                                 refund_messages):
    service = ServiceClient(server.url)
    messages, _ = refund_messages
    with service.create_session() as session:
        run = session.create_run(rank=4)
        prompt = service.tokenize(messages=messages)
        run.save_weights_for_sampler(1).result(timeout_s=60)
        # one training step moves the adapter, then it is saved again and exported
        sampled = run.sample(1, prompt, num_samples=2, max_tokens=8,
                             seed=1).result(timeout_s=60)["sequences"]
        datum = {"model_input": {"token_ids": prompt + sampled[0]["tokens"][:-1]},
                 "loss_fn_inputs": {
                     "target_tokens": (prompt + sampled[0]["tokens"])[1:],
                     "weights": [0.0] * (len(prompt) - 1) + [1.0] * len(sampled[0]["tokens"])}}
        run.forward_backward([datum], "cross_entropy").result(timeout_s=60)
        run.optim_step(AdamParams(learning_rate=1e-2, beta1=0.9, beta2=0.95, eps=1e-8,
                                  weight_decay=0.0, grad_clip_norm=1.0)).result(timeout_s=60)
        run.save_weights_for_sampler(2).result(timeout_s=60)
        run.export_lora("one-step").result(timeout_s=60)
        names = {model.id for model in client.models.list()}
        assert {f"{run.id}:1", f"{run.id}:2", run.id, f"{run.id}/one-step"} <= names
        for name in (f"{run.id}:1", run.id, f"{run.id}/one-step"):
            reply = client.chat.completions.create(model=name, messages=messages, seed=2,
                                                   max_tokens=8)
            assert reply.model == name and reply.choices[0].message.role == "assistant"
    # the exported adapter outlives the session and its run
    assert f"{run.id}/one-step" in {model.id for model in client.models.list()}


@pytest.mark.parametrize(("changes", "status", "fragment"), [
    ({"model": "no-such-model"}, 404, "GET /v1/models lists them"),
    ({"stream": True}, 400, "stream"),
    ({"logprobs": True, "top_logprobs": 3}, 400, "top_logprobs"),
    ({"n": 0}, 400, "n:"),
    ({"temperature": 9}, 400, "temperature:"),
    ({"messages": []}, 400, "messages:"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0].role"),
    ({"stop": ["a", "b", "c", "d", "e"]}, 400, "stop:"),
    ({"tool_choice": {"type": "function", "function": {"name": "x"}}}, 400, "tool_choice"),
])
def test_refusals_come_back_as_openai_errors(client, changes, status, fragment):
    body = {"model": BASE, "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 4, **changes}
    with pytest.raises(openai.APIStatusError) as refused:
        client.chat.completions.create(**body)
    assert refused.value.status_code == status
    assert fragment in refused.value.message
