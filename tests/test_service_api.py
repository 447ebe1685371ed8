"""The primitives service over real HTTP: a server on 127.0.0.1 (port 0) in a thread, starter-2m.

Covers ordering, idempotent retries and 409, immutable sampler versions, gradient
accumulation, cancel, failures, restart-and-resume from save_state, session reaping,
malformed payloads (4xx, never 500), tokens, export to PEFT, and 8 concurrent clients.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from posttrain.errors import PosttrainError  # noqa: E402
from posttrain.service.client import (  # noqa: E402
    AdamParams,
    OperationCancelled,
    OperationFailed,
    ServiceClient,
    ServiceRequestError,
)
from posttrain.service.engine import PRIMITIVES, Engine  # noqa: E402
from posttrain.service.engine.requests import Limits  # noqa: E402
from posttrain.service.server import check_bind, start_server  # noqa: E402

BASE = "starter-2m"
ADAM = AdamParams(learning_rate=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.0,
                  grad_clip_norm=1.0)


@pytest.fixture(scope="module")
def server(policy, tmp_path_factory, one_torch_thread):
    engine = Engine(BASE, tmp_path_factory.mktemp("state"), policy=policy, reap_interval_s=0.1,
                    limits=Limits(max_body_bytes=1 << 20), torch_threads=one_torch_thread)
    running = start_server(engine, port=0)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server):
    return ServiceClient(server.url)


@pytest.fixture(scope="module")
def prompt(client):
    return client.tokenize(messages=[{"role": "user", "content": "Where is my order ORD-4417?"}])


@pytest.fixture
def session(client):
    with client.create_session() as opened:
        yield opened


def raw(server, method, path, body=None, *, data=None, headers=None):
    """(status, json) of one request, errors included."""
    if data is None and body is not None:
        data = json.dumps(body).encode()
    sent = {"Content-Type": "application/json", **(headers or {})}
    request = urllib.request.Request(server.url + "/v1/training" + path, data=data,
                                     method=method, headers=sent)
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def datum(prompt, completion, advantage=1.0):
    full = list(prompt) + list(completion)
    pad = [0.0] * (len(prompt) - 1)
    return {
        "model_input": {"token_ids": full[:-1]},
        "loss_fn_inputs": {
            "target_tokens": full[1:],
            "logprobs": pad + [-1.0] * len(completion),
            "advantages": pad + [advantage] * len(completion),
        },
    }


COMPLETION = [5, 17, 42, 99, 7]


# ---------------------------------------------------------------- capabilities


def test_capabilities_list_primitives_losses_model_and_limits(client):
    caps = client.capabilities()
    assert {"save_weights_for_sampler", "sample", "logprobs", "forward_backward", "optim_step",
            "save_state", "load_state", "export_lora", "finish"} <= set(caps["primitives"])
    assert caps["losses"]["ppo"]["config_defaults"] == {"clip_low_threshold": 0.8,
                                                        "clip_high_threshold": 1.2}
    assert caps["losses"]["cispo"]["config_defaults"]["clip_high_threshold"] == 4.0
    assert caps["losses"]["importance_sampling"]["required_inputs"] == [
        "target_tokens", "logprobs", "advantages"]
    assert caps["base_model"]["name"] == BASE
    assert caps["base_model"]["vocab_size"] > 1000
    assert caps["limits"]["max_body_bytes"] == 1 << 20
    assert caps["optimizer"]["required_params"] == [
        "learning_rate", "beta1", "beta2", "eps", "weight_decay", "grad_clip_norm"]


# ---------------------------------------------------------------- ordering and idempotency


def test_operations_run_in_sequence_order_whatever_the_arrival_order(server, session, prompt):
    run = session.create_run(rank=4, seed=0)
    base = f"/runs/{run.id}"
    # seq 3 and 2 arrive first; nothing may run until seq 1 is there
    _, third = raw(server, "POST", f"{base}/optim_step", {"seq": 3, "adam_params": ADAM.to_json()})
    _, second = raw(server, "POST", f"{base}/forward_backward", {
        "seq": 2, "data": [datum(prompt, COMPLETION)], "loss_function": "importance_sampling"})
    time.sleep(0.3)
    status = run.status()
    assert status["waiting_for_seq"] == 1
    assert raw(server, "GET", f"/operations/{third['operation_id']}")[1]["status"] == "queued"
    _, first = raw(server, "POST", f"{base}/save_weights_for_sampler", {"seq": 1, "version": 0})
    done = [raw(server, "GET", f"/operations/{op['operation_id']}?wait=30")[1]
            for op in (first, second, third)]
    assert [op["status"] for op in done] == ["succeeded"] * 3
    starts = [op["started_at"] for op in done]
    assert starts == sorted(starts)
    assert done[2]["result"]["forward_backward_calls"] == 1  # the step saw the gradient


def test_retry_with_same_seq_and_payload_returns_the_same_operation(server, session):
    run = session.create_run(rank=4)
    body = {"seq": 1, "version": 0}
    status_first, first = raw(server, "POST", f"/runs/{run.id}/save_weights_for_sampler", body)
    status_again, again = raw(server, "POST", f"/runs/{run.id}/save_weights_for_sampler", body)
    assert (status_first, status_again) == (202, 200)
    assert again["operation_id"] == first["operation_id"]
    # executed once: a second save of version 0 would have failed (versions are immutable)
    done = raw(server, "GET", f"/operations/{first['operation_id']}?wait=30")[1]
    assert done["status"] == "succeeded"
    status, answer = raw(server, "POST", f"/runs/{run.id}/save_weights_for_sampler",
                         {"seq": 1, "version": 7})
    assert status == 409
    assert "seq 1 was already used" in answer["error"]["message"]


# ---------------------------------------------------------------- sampler versions


def test_sampler_versions_are_immutable_snapshots(session, prompt):
    run = session.create_run(rank=8, seed=1)
    run.save_weights_for_sampler(0)
    before = run.sample(0, prompt, num_samples=2, max_tokens=8, seed=11).result()
    run.forward_backward([datum(prompt, COMPLETION)], "importance_sampling")
    run.optim_step(ADAM).result()
    run.save_weights_for_sampler(1)
    again = run.sample(0, prompt, num_samples=2, max_tokens=8, seed=11).result()
    after = run.sample(1, prompt, num_samples=2, max_tokens=8, seed=11).result()
    assert again["sequences"] == before["sequences"]  # version 0 still answers as before
    seq = list(prompt) + COMPLETION
    old, new = run.logprobs([seq], version=0).result(), run.logprobs([seq], version=1).result()
    assert old["logprobs"][0][0] is None
    assert max(abs(a - b) for a, b in zip(old["logprobs"][0][1:], new["logprobs"][0][1:],
                                          strict=True)) > 1e-4
    assert after["version"] == 1
    failed = run.sample(5, prompt, max_tokens=4).result
    with pytest.raises(OperationFailed, match="version 5 was not saved"):
        failed()
    assert run.status()["status"] == "active"  # a failed read-only op leaves the run alive


def test_sampled_logprobs_match_trainer_logprobs(session, prompt):
    run = session.create_run(rank=8, seed=2)
    run.save_weights_for_sampler(0)
    sample = run.sample(0, prompt, num_samples=3, max_tokens=12, seed=5).result()
    sequences = [list(prompt) + s["tokens"] for s in sample["sequences"]]
    trainer = run.logprobs(sequences).result()["logprobs"]
    diffs = [abs(a - b) for s, t in zip(sample["sequences"], trainer, strict=True)
             for a, b in zip(s["logprobs"], t[len(prompt):], strict=True)]
    assert sum(diffs) / len(diffs) < 1e-3  # the bar; float32 CPU gives ~1e-6
    seeds = {tuple(s["tokens"]) for s in sample["sequences"]}
    assert sample["seed"] == 5 and len(seeds) > 1  # per-sample seeds: not three copies


# ---------------------------------------------------------------- gradients and the optimizer


def test_gradients_accumulate_until_optim_step(session, prompt):
    # two forward_backward calls then one step == one call holding both datums
    split, joint = session.create_run(rank=4, seed=3), session.create_run(rank=4, seed=3)
    a, b = datum(prompt, COMPLETION, 1.0), datum(prompt, COMPLETION[:3], -0.5)
    first = split.forward_backward([a], "importance_sampling")
    second = split.forward_backward([b], "importance_sampling")
    step = split.optim_step(ADAM).result()
    both = joint.forward_backward([a, b], "importance_sampling").result()
    joint.optim_step(ADAM).result()
    assert step["forward_backward_calls"] == 2
    assert first.result()["loss"] + second.result()["loss"] == pytest.approx(both["loss"])
    seq = [list(prompt) + COMPLETION]
    left = split.logprobs(seq).result()["logprobs"][0][1:]
    right = joint.logprobs(seq).result()["logprobs"][0][1:]
    # two accumulated half-batches vs one batch: the same gradient summed in another order;
    # float32 rounding differs by CPU (AVX2, AVX-512, ARM), so the bound is relative
    assert left == pytest.approx(right, rel=1e-4, abs=1e-4)


def test_forward_reports_the_loss_without_changing_anything(session, prompt):
    run = session.create_run(rank=4, seed=4)
    data = [datum(prompt, COMPLETION)]
    loss = run.forward(data, "ppo", {"clip_high_threshold": 1.3}).result()["loss"]
    step = run.optim_step(ADAM).result()
    assert step["forward_backward_calls"] == 0 and step["grad_norm"] == 0.0
    assert run.forward(data, "ppo", {"clip_high_threshold": 1.3}).result()["loss"] == loss


# ---------------------------------------------------------------- cancel, failures, finish


def test_cancel_cancels_queued_operations_and_ends_the_run(session, prompt):
    run = session.create_run(rank=4)
    run.save_weights_for_sampler(0)
    ops = [run.sample(0, prompt, num_samples=4, max_tokens=16, seed=i) for i in range(6)]
    run.cancel()
    assert run.wait_terminal(60)["status"] == "cancelled"
    outcomes = []
    for op in ops:
        try:
            op.result(60)
            outcomes.append("succeeded")
        except OperationCancelled:
            outcomes.append("cancelled")
    assert outcomes[-1] == "cancelled"  # at most the one running when cancel came finished
    assert "succeeded" not in outcomes[outcomes.index("cancelled"):]
    with pytest.raises(ServiceRequestError) as refused:
        run.save_weights_for_sampler(1)
    assert refused.value.status == 409


def test_a_failed_training_operation_fails_the_run(session):
    run = session.create_run(rank=4)
    queued = run.submit("save_weights_for_sampler", {"version": 0}, seq=2)  # waits for seq 1
    load = run.submit("load_state", {"name": "never-saved"}, seq=1)
    with pytest.raises(OperationFailed, match="no saved state"):
        load.result()
    with pytest.raises(OperationCancelled):
        queued.result()
    assert run.wait_terminal(30)["status"] == "failed"


def test_an_overflowing_loss_fails_the_run_with_a_message(session, prompt):
    run = session.create_run(rank=4)
    extreme = datum(prompt, COMPLETION)
    extreme["loss_fn_inputs"]["logprobs"][-1] = -1e4  # exp(lp + 1e4) is inf in float32
    with pytest.raises(OperationFailed, match=r"the loss is -?inf"):
        run.forward_backward([extreme], "importance_sampling").result()
    assert run.wait_terminal(30)["status"] == "failed"


def test_a_step_that_would_make_weights_non_finite_fails_and_is_not_applied(session, prompt):
    run = session.create_run(rank=4, seed=9)
    run.forward_backward([datum(prompt, COMPLETION)], "importance_sampling").result()
    huge = AdamParams(learning_rate=1e30, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.0,
                      grad_clip_norm=0.0)
    with pytest.raises(OperationFailed, match="non-finite"):
        run.optim_step(huge).result()
    assert run.wait_terminal(30)["status"] == "failed"


def test_finish_ends_the_run_after_everything_before_it(session):
    run = session.create_run(rank=4)
    saved = run.save_weights_for_sampler(0)
    assert run.finish().result()["status"] == "finished"
    assert saved.result()["version"] == 0
    assert run.wait_terminal(30)["status"] == "finished"


def test_load_state_brings_back_adapter_and_step(session, prompt):
    run = session.create_run(rank=4, seed=8)
    run.forward_backward([datum(prompt, COMPLETION)], "importance_sampling")
    run.optim_step(ADAM)
    run.save_state("one")
    sequence = [list(prompt) + COMPLETION]
    saved = run.logprobs(sequence).result()["logprobs"]
    run.forward_backward([datum(prompt, COMPLETION)], "importance_sampling")
    assert run.optim_step(ADAM).result()["step"] == 2
    assert run.load_state("one").result()["step"] == 1
    assert run.logprobs(sequence).result()["logprobs"] == saved


def test_result_times_out_while_an_operation_waits_for_a_missing_seq(session):
    run = session.create_run(rank=4)
    waiting = run.submit("save_weights_for_sampler", {"version": 0}, seq=2)
    with pytest.raises(TimeoutError, match="still queued"):
        waiting.result(timeout_s=0.3)
    run.submit("save_weights_for_sampler", {"version": 1}, seq=1)
    assert waiting.result(timeout_s=30)["version"] == 0


# ---------------------------------------------------------------- restart and resume


def test_server_restart_resumes_a_run_from_its_last_save_state(
    policy, tmp_path, prompt, one_torch_thread
):
    def step_and_read(run):
        run.forward_backward([datum(prompt, COMPLETION)], "importance_sampling")
        run.optim_step(ADAM)
        return run.logprobs([list(prompt) + COMPLETION]).result()["logprobs"][0][1:]

    first = start_server(Engine(BASE, tmp_path, policy=policy, torch_threads=1), port=0)
    client = ServiceClient(first.url)
    session = client.create_session()
    run = session.create_run(rank=4, seed=9)
    step_and_read(run)
    saved = run.save_state("after-one").result()
    expected = step_and_read(run)  # what the step after the save gives, optimizer included
    session.stop_heartbeat()
    first.stop()  # the process "dies": the run never finished

    second = start_server(Engine(BASE, tmp_path, policy=policy, torch_threads=1), port=0)
    try:
        client = ServiceClient(second.url)
        assert client.request("GET", f"/runs/{run.id}")["status"] == "dormant"
        with client.create_session() as new_session:
            resumed = new_session.resume_run(run.id)
            assert resumed.next_seq == saved["seq"] + 1
            assert resumed.status()["step"] == 1
            got = step_and_read(resumed)
            assert max(abs(a - b) for a, b in zip(got, expected, strict=True)) < 1e-6
            with pytest.raises(ServiceRequestError) as old_seq:
                resumed.submit("save_weights_for_sampler", {"version": 0}, seq=1)
            assert old_seq.value.status == 409
    finally:
        second.stop()


# ---------------------------------------------------------------- sessions


def test_a_silent_session_is_reaped_and_its_runs_cancelled(client):
    session = client.create_session(heartbeat_timeout_s=1.0)
    run = session.create_run(rank=4)
    session.stop_heartbeat()  # the client "dies" here
    assert run.wait_terminal(15)["status"] == "cancelled"
    assert "missed its heartbeat" in run.status()["status_reason"]
    assert client.request("GET", f"/sessions/{session.id}")["status"] == "expired"
    with pytest.raises(ServiceRequestError) as lapsed:
        session.create_run(rank=4)
    assert lapsed.value.status == 409


def test_a_heartbeating_session_survives_its_timeout(client):
    with client.create_session(heartbeat_timeout_s=1.5) as session:  # beats every 0.5 s
        run = session.create_run(rank=4)
        time.sleep(3.0)
        assert run.status()["status"] == "active"


def test_closing_a_session_cancels_its_active_runs(client):
    session = client.create_session()
    run = session.create_run(rank=4)
    session.close()
    assert run.wait_terminal(10)["status"] == "cancelled"


# ---------------------------------------------------------------- malformed requests


def _fb(prompt, **changes):
    body = {"seq": 1, "data": [datum(prompt, COMPLETION)], "loss_function": "importance_sampling"}
    body.update(changes)
    return body


MALFORMED = {
    "not json": (b"{nope", "not valid JSON"),
    "a list body": ([1, 2], "expected a JSON object"),
    "unknown loss": ({"loss_function": "gspo"}, "not supported"),
    "unknown config key": ({"loss_config": {"epsilon": 0.2}}, "not accepted"),
    "unknown top-level field": ({"batch": 3}, "unknown field"),
    "nested token list": ({"data": [{"model_input": {"token_ids": [[1, 2]]},
                                     "loss_fn_inputs": {}}]}, "expected an integer token id"),
    "token out of vocabulary": ({"data": [{"model_input": {"token_ids": [1, 10**9]},
                                           "loss_fn_inputs": {}}]}, "outside the vocabulary"),
    "empty data": ({"data": []}, "non-empty list"),
    "bad seq": ({"seq": 0}, "seq: must be >= 1"),
    "boolean seq": ({"seq": True}, "expected an integer"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_forward_backward_is_refused_with_a_message(server, session, prompt, case):
    run = session.create_run(rank=4)
    change, message = MALFORMED[case]
    if isinstance(change, bytes):
        status, answer = raw(server, "POST", f"/runs/{run.id}/forward_backward", data=change)
    elif isinstance(change, list):
        status, answer = raw(server, "POST", f"/runs/{run.id}/forward_backward", change)
    else:
        status, answer = raw(server, "POST", f"/runs/{run.id}/forward_backward",
                             _fb(prompt, **change))
    assert 400 <= status < 500, answer
    assert message in answer["error"]["message"]
    assert run.status()["next_seq"] == 1  # nothing was queued


def test_lengths_that_do_not_match_are_refused(server, session, prompt):
    run = session.create_run(rank=4)
    bad = datum(prompt, COMPLETION)
    bad["loss_fn_inputs"]["advantages"] = bad["loss_fn_inputs"]["advantages"][:-1]
    status, answer = raw(server, "POST", f"/runs/{run.id}/forward_backward",
                         _fb(prompt, data=[bad]))
    assert status == 400
    assert "data[0].loss_fn_inputs.advantages" in answer["error"]["message"]
    bad = datum(prompt, COMPLETION)
    bad["loss_fn_inputs"]["target_tokens"].append(3)
    status, answer = raw(server, "POST", f"/runs/{run.id}/forward_backward",
                         _fb(prompt, data=[bad]))
    assert status == 400 and "shifted by one" in answer["error"]["message"]


def test_other_primitives_validate_their_bodies(server, session, prompt):
    run = session.create_run(rank=4)
    cases = [
        ("optim_step", {"adam_params": {"learning_rate": 1e-4}}, "every AdamW hyper-parameter"),
        ("sample", {"version": 0, "prompt": {"token_ids": prompt},
                    "sampling_params": {"max_tokens": 10**6}}, "max_tokens"),
        ("sample", {"version": 0, "prompt": {"token_ids": prompt}, "sampling_params": {}},
         "missing field 'max_tokens'"),
        ("logprobs", {"sequences": [[1, -3]]}, "outside the vocabulary"),
        ("save_state", {"name": "../escape"}, "expected a name"),
        ("finish", {"now": True}, "unknown field"),
    ]
    for primitive, body, message in cases:
        status, answer = raw(server, "POST", f"/runs/{run.id}/{primitive}", body)
        assert 400 <= status < 500 and message in answer["error"]["message"], (primitive, answer)


JUNK_BODIES = [b"null", b'"text"', b"[]", b'{"seq": "1"}', b'{"seq": 1, "extra": {}}',
               b'{"version": -1, "data": {}}', b'{"version": 1e309}', b"[" * 50_000,
               b"\xff\xfe", b'{"seq": 1.5}']


def test_junk_bodies_get_4xx_from_every_primitive(server, session):
    run = session.create_run(rank=4)
    for primitive in PRIMITIVES:
        for junk in JUNK_BODIES:
            status, answer = raw(server, "POST", f"/runs/{run.id}/{primitive}", data=junk)
            assert 400 <= status < 500, (primitive, junk[:20], answer)
            assert answer["error"]["message"]
    assert run.status()["next_seq"] == 1


def test_huge_bodies_are_refused_before_they_are_read(server, session):
    run = session.create_run(rank=4)
    data = b"[" + b"1," * (1 << 20) + b"1]"  # over the 1 MiB limit of this test server
    status, answer = raw(server, "POST", f"/runs/{run.id}/forward_backward", data=data)
    assert status == 413 and "over the limit" in answer["error"]["message"]
    assert raw(server, "GET", "/health")[0] == 200


def test_unknown_endpoints_and_ids_are_404(server):
    assert raw(server, "GET", "/nowhere")[0] == 404
    assert raw(server, "POST", "/runs/run-missing/finish", {})[0] == 404
    assert raw(server, "GET", "/operations/op-missing")[0] == 404
    assert raw(server, "DELETE", "/capabilities")[0] == 405


def test_binding_beyond_loopback_needs_a_token(policy, tmp_path):
    with pytest.raises(PosttrainError, match="--token"):
        check_bind("0.0.0.0", None)
    engine = Engine(BASE, tmp_path, policy=policy)
    running = start_server(engine, port=0, token="s3cret")
    try:
        status, answer = raw(running, "GET", "/capabilities")
        assert status == 401 and "Bearer" in answer["error"]["message"]
        assert ServiceClient(running.url, token="s3cret").health() == {"status": "ok"}
    finally:
        running.stop()


# ---------------------------------------------------------------- export


def test_export_lora_loads_in_peft_with_the_same_logprobs(session, prompt, policy):
    from peft import PeftModel

    from posttrain.policy.loading import load_policy

    run = session.create_run(rank=8, alpha=16, seed=6)
    run.forward_backward([datum(prompt, COMPLETION)], "importance_sampling")
    run.optim_step(ADAM)
    exported = run.export_lora("one-step").result()
    sequence = list(prompt) + COMPLETION
    served = run.logprobs([sequence]).result()["logprobs"][0][1:]
    assert {"adapter_model.safetensors", "adapter_config.json"} <= set(exported["files"])

    fresh = load_policy(BASE, device="cpu", show_progress=False)
    model = PeftModel.from_pretrained(fresh.model, exported["path"]).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([sequence[:-1]])).logits[0].float()
    local = torch.log_softmax(logits, -1).gather(-1, torch.tensor(sequence[1:])[:, None])[:, 0]
    # the served batch and this single forward round differently on some CPUs
    assert local.tolist() == pytest.approx(served, rel=1e-4, abs=1e-4)


# ---------------------------------------------------------------- concurrency


def test_eight_concurrent_clients_with_their_own_runs_do_not_interfere(server, prompt):
    # clients i and i + 4 do exactly the same work; if runs leaked into each other the
    # interleaving would make the twins differ
    results: dict[int, list] = {}
    errors: list[BaseException] = []

    def work(index: int) -> None:
        try:
            client = ServiceClient(server.url)
            with client.create_session() as session:
                run = session.create_run(rank=4, seed=index % 4)
                trace = []
                for cycle in range(2):
                    run.save_weights_for_sampler(cycle)
                    sample = run.sample(cycle, prompt, num_samples=2, max_tokens=6,
                                        seed=100 * (index % 4) + cycle).result()
                    data = [datum(prompt, s["tokens"], 1.0 if k else -1.0)
                            for k, s in enumerate(sample["sequences"])]
                    fb = run.forward_backward(data, "importance_sampling")
                    step = run.optim_step(ADAM)
                    trace.append((fb.result()["loss"], step.result()["grad_norm"]))
                run.finish().result()
                trace.append(run.wait_terminal(60)["status"])
                results[index] = trace
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(180)
    assert not errors, errors
    assert sorted(results) == list(range(8))
    for index in range(4):
        assert results[index][-1] == "finished"
        assert results[index + 4][-1] == "finished"
        for mine, twin in zip(results[index][:-1], results[index + 4][:-1], strict=True):
            assert mine == pytest.approx(twin, rel=1e-6)


@pytest.mark.parametrize("run_id", ["../../elsewhere", "/etc", "a/b", ".."])
def test_load_state_refuses_a_run_id_that_would_leave_the_state_folder(server, session, run_id):
    run = session.create_run(rank=4)
    status, answer = raw(server, "POST", f"/runs/{run.id}/load_state",
                         {"name": "saved", "run_id": run_id})
    assert status == 400, answer
    assert answer["error"]["message"].startswith("run_id: expected a name")
    assert run.status()["next_seq"] == 1  # nothing was queued


def test_a_missing_state_is_named_without_the_servers_paths(session):
    run = session.create_run(rank=4)
    with pytest.raises(OperationFailed) as failed:
        run.submit("load_state", {"name": "never-saved"}).result()
    assert "no saved state 'never-saved' in run" in str(failed.value)
    assert "/" not in str(failed.value).split("no saved state", 1)[1]


def test_a_refused_step_leaves_the_adapter_and_the_optimizer_as_they_were(policy):
    """LoraModel directly: the weights and Adam's moments after a refused step are the
    ones before it, and a sane step then works from there."""
    from copy import deepcopy

    from posttrain.service.engine import requests as typed
    from posttrain.service.engine.lora_model import LoraModel

    spec = typed.LoraSpec(rank=4, alpha=8.0, target_modules=("q_proj", "v_proj"), seed=1)
    model = LoraModel(deepcopy(policy.model), policy.tokenizer, spec)
    ids = tuple(policy.tokenizer("Refund ORD-4017 please.").input_ids)
    datum = typed.Datum(ids, {"target_tokens": (*ids[1:], ids[0]),
                              "logprobs": (0.0,) * len(ids), "advantages": (1.0,) * len(ids)})
    request = typed.ForwardBackward((datum,), "importance_sampling", {})
    sane = typed.AdamParams(1e-2, 0.9, 0.95, 1e-8, 0.0, 1.0)
    model.forward_backward(request)
    model.optim_step(sane)
    model.forward_backward(request)
    weights = model.adapter_tensors()
    moments = deepcopy(model.optimizer.state_dict()["state"])
    with pytest.raises(ValueError, match="non-finite or larger than"):
        model.optim_step(typed.AdamParams(1e30, 0.9, 0.95, 1e-8, 0.0, 0.0))
    assert model.step == 1
    for name, tensor in model.adapter_tensors().items():
        assert torch.equal(tensor, weights[name])
    after = model.optimizer.state_dict()["state"]
    for key, state in moments.items():
        for field_name, value in state.items():
            assert torch.equal(torch.as_tensor(after[key][field_name]), torch.as_tensor(value))
    assert model.optim_step(sane)["step"] == 2


@pytest.mark.parametrize(("headers", "status", "fragment"), [
    ({"Content-Type": "text/plain"}, 415, "application/json"),
    ({"Origin": "http://evil.example"}, 403, "another site"),
    ({"Host": "rebound.example:8400"}, 403, "is not this server's address"),
])
def test_requests_a_foreign_page_could_forge_are_refused(server, headers, status, fragment):
    answer_status, answer = raw(server, "POST", "/sessions", {}, headers=headers)
    assert answer_status == status and fragment in answer["error"]["message"]


def test_finished_operations_are_forgotten_after_the_retention_time(policy, tmp_path,
                                                                     one_torch_thread):
    """A long-lived server must not keep every result forever: after
    ``operation_retention_s`` an operation is dropped (404 that says why), and a retry of
    its seq is refused, never executed twice."""
    engine = Engine(BASE, tmp_path / "state", policy=policy, reap_interval_s=0.05,
                    limits=Limits(operation_retention_s=0.3), torch_threads=one_torch_thread)
    running = start_server(engine, port=0)
    try:
        client = ServiceClient(running.url)
        with client.create_session() as opened:
            run = opened.create_run(rank=4)
            body = {"seq": 1, "version": 0}
            status, first = raw(running, "POST", f"/runs/{run.id}/save_weights_for_sampler",
                                body)
            assert status == 202
            done = raw(running, "GET", f"/operations/{first['operation_id']}?wait=30")[1]
            assert done["status"] == "succeeded"
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # the reaper runs every 0.05 s
                status, answer = raw(running, "GET", f"/operations/{first['operation_id']}")
                if status == 404:
                    break
                time.sleep(0.1)
            assert status == 404 and "kept for 0.3 s" in answer["error"]["message"]
            status, answer = raw(running, "POST", f"/runs/{run.id}/save_weights_for_sampler",
                                 body)
            assert status == 409 and "already executed" in answer["error"]["message"]
            assert engine.get_run(run.id)["sampler_versions"] == [0]  # saved once
            # the run goes on: the next seq works as before
            status, second = raw(running, "POST", f"/runs/{run.id}/save_weights_for_sampler",
                                 {"seq": 2, "version": 1})
            assert status == 202
            done = raw(running, "GET", f"/operations/{second['operation_id']}?wait=30")[1]
            assert done["status"] == "succeeded"
    finally:
        running.stop()
