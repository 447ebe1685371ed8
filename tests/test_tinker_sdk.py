"""`posttrain serve` driven by the unmodified tinker SDK (0.38) over its own wire protocol.

A server on 127.0.0.1 (port 0) in a thread with starter-2m, and `tinker.ServiceClient`
pointed at it with a `tml-` key: training (cross_entropy steps, forward, a custom loss),
snapshots and named sampler weights, sampling with logprobs and both kinds of stop,
compute_logprobs, save_state and both ways of resuming, sampling clients from a tinker://
path and from the base model, refusals (a loss, a sparse tensor, an unknown SDK version),
idempotent retries on the wire, 8 concurrent clients, a client that hangs up, and a
server restart resumed from a checkpoint path.
"""

from __future__ import annotations

import itertools
import json
import math
import socket
import threading
import urllib.error
import urllib.request

import pytest

torch = pytest.importorskip("torch")
tinker = pytest.importorskip("tinker")

from tinker import types  # noqa: E402

from posttrain.service.engine import Engine  # noqa: E402
from posttrain.service.engine.requests import Limits  # noqa: E402
from posttrain.service.server import start_server  # noqa: E402
from tests.tinker_wire import post_tinker, sdk_environment  # noqa: E402, F401 (fixture)

BASE = "starter-2m"
ADAM = types.AdamParams(learning_rate=5e-3, beta1=0.9, beta2=0.95, eps=1e-8,
                        weight_decay=0.0, grad_clip_norm=1.0)
SENTENCES = ["Where is my order ORD-4417? It has not arrived.",
             "Please refund order ORD-2231, the box was empty."]


@pytest.fixture(scope="module")
def server(policy, tmp_path_factory, one_torch_thread):
    # 2 datums per request at most: the client config tells the SDK so, and it splits a
    # bigger batch into chunks sent at once (first chunk last), as it does at 1024
    engine = Engine(BASE, tmp_path_factory.mktemp("state"), policy=policy,
                    torch_threads=one_torch_thread, limits=Limits(max_datums=2))
    running = start_server(engine, port=0)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def service(server):
    client = tinker.ServiceClient(base_url=server.url)
    yield client
    client.close("success").result()


@pytest.fixture(scope="module")
def tokenizer(service):
    # the SDK loads it from the folder get_info names: no hub involved
    return service.create_lora_training_client(base_model=BASE, rank=4).result().get_tokenizer()


@pytest.fixture(scope="module")
def batch(tokenizer):
    """A fixed cross_entropy batch: input = full[:-1], targets = full[1:], weight 1."""
    data = []
    for sentence in SENTENCES:
        ids = tokenizer.encode(sentence)
        data.append(types.Datum(
            model_input=types.ModelInput.from_ints(ids[:-1]),
            loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)}))
    return data


@pytest.fixture
def trainer(service):
    return service.create_lora_training_client(base_model=BASE, rank=8, seed=0).result()


def prompt_of(tokenizer, text="Where is my order"):
    return types.ModelInput.from_ints(tokenizer.encode(text))


# ---------------------------------------------------------------- training


def test_cross_entropy_steps_make_the_training_loss_fall(trainer, batch):
    losses = []
    for _ in range(5):
        step = trainer.forward_backward(batch, "cross_entropy")
        trainer.optim_step(ADAM).result()
        losses.append(step.result().metrics["loss:sum"])
    # one shared batch, Adam at lr 5e-3 on a fresh LoRA adapter: each step moves along
    # the gradient of the very loss it is measured on, so each lowers it. The claim is
    # the fall itself, not how far it goes on one CPU (0.78 of the start here, 0.82 on an
    # AVX2-only one): a fall beyond float32's rounding of the sum (~1e-6 relative) at
    # every step
    assert all(later < earlier * (1 - 1e-4)
               for earlier, later in itertools.pairwise(losses)), losses
    info = trainer.get_info()
    assert info.lora_rank == 8 and ":" not in info.model_data.tokenizer_id


def test_forward_returns_logprobs_and_the_loss_without_training(trainer, batch):
    first = trainer.forward(batch, "cross_entropy").result()
    again = trainer.forward(batch, "cross_entropy").result()
    assert first.metrics["loss:sum"] == again.metrics["loss:sum"]
    assert set(first.metrics) == {"loss:sum", "tokens:sum", "datums:sum"}
    logprobs = [output["logprobs"].tolist() for output in first.loss_fn_outputs]
    assert [len(lp) for lp in logprobs] == [d.model_input.length for d in batch]
    # cross_entropy with weight 1 is minus the sum of the target logprobs
    assert first.metrics["loss:sum"] == pytest.approx(-sum(map(sum, logprobs)), rel=1e-5)


def test_a_custom_loss_trains_through_cross_entropy_weights(trainer, batch):
    def mean_nll(data, logprobs_list):
        # per-datum mean negative log-likelihood: not a plain token sum, so the server can
        # only apply it as its gradient, sent as cross_entropy weights
        loss = sum(-lp.mean() for lp in logprobs_list)
        return loss, {"datums:sum": float(len(data))}

    before = trainer.forward(batch, "cross_entropy").result()
    result = trainer.forward_backward_custom(batch, mean_nll).result()
    trainer.optim_step(ADAM).result()
    expected = sum(-output["logprobs"].to_torch().mean().item()
                   for output in before.loss_fn_outputs)
    assert result.metrics["loss:sum"] == pytest.approx(expected, rel=1e-4)
    assert "surrogate_loss:sum" in result.metrics
    after = trainer.forward(batch, "cross_entropy").result()
    assert after.metrics["loss:sum"] < before.metrics["loss:sum"]


def test_a_batch_split_into_chunks_comes_back_whole_and_in_order(trainer, batch):
    whole_batch = [*batch, batch[0]]  # 3 datums: two requests of at most 2
    combined = trainer.forward(whole_batch, "cross_entropy").result()
    parts = [trainer.forward([datum], "cross_entropy").result() for datum in whole_batch]
    assert len(combined.loss_fn_outputs) == 3
    for output, part in zip(combined.loss_fn_outputs, parts, strict=True):
        # batched with padding or alone: other matrix shapes, float32 rounding (~2e-5 seen)
        assert output["logprobs"].tolist() == pytest.approx(
            part.loss_fn_outputs[0]["logprobs"].tolist(), abs=1e-4)
    assert combined.metrics["loss:sum"] == pytest.approx(
        sum(part.metrics["loss:sum"] for part in parts), rel=1e-5)
    assert combined.metrics["datums:sum"] == 3


@pytest.mark.parametrize("loss, config", [
    ("importance_sampling", None),
    ("ppo", {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}),
    ("cispo", {"clip_low_threshold": 0.0, "clip_high_threshold": 4.0}),
])
def test_policy_losses_on_fresh_samples_have_unit_importance_ratios(trainer, tokenizer, loss,
                                                                     config):
    sampler = trainer.save_weights_and_get_sampling_client().result()
    prompt = prompt_of(tokenizer).to_ints()
    sampled = sampler.sample(types.ModelInput.from_ints(prompt), 1,
                             types.SamplingParams(max_tokens=6, seed=2)).result().sequences[0]
    full, pad = prompt + sampled.tokens, [0.0] * (len(prompt) - 1)
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(full[:-1]),
        loss_fn_inputs={"target_tokens": full[1:], "logprobs": pad + sampled.logprobs,
                        "advantages": pad + [0.5] * len(sampled.tokens)})
    result = trainer.forward_backward([datum], loss, config).result()
    # the learner is the sampler (nothing stepped in between): every ratio is 1, so the
    # importance-weighted and clipped surrogates are all -A per token (cispo: -A * lp)
    per_token = [-0.5] * len(sampled.tokens) if loss != "cispo" else \
        [-0.5 * lp for lp in sampled.logprobs]
    assert result.metrics["loss:sum"] == pytest.approx(sum(per_token), rel=1e-4)


def test_a_loss_config_key_the_loss_does_not_take_is_refused(trainer, batch):
    with pytest.raises(tinker.RequestFailedError, match="'clip_low_threshold' are not accepted"):
        trainer.forward_backward(batch, "cross_entropy", {"clip_low_threshold": 0.5}).result()


# ---------------------------------------------------------------- sampling


def test_snapshot_sampling_is_seeded_and_its_logprobs_match_compute_logprobs(trainer, batch,
                                                                            tokenizer):
    trainer.forward_backward(batch, "cross_entropy")
    trainer.optim_step(ADAM).result()
    sampler = trainer.save_weights_and_get_sampling_client().result()
    prompt = prompt_of(tokenizer)
    params = types.SamplingParams(max_tokens=12, seed=3, temperature=1.0)
    first = sampler.sample(prompt, 2, params).result()
    second = sampler.sample(prompt, 2, params).result()
    assert [s.tokens for s in first.sequences] == [s.tokens for s in second.sequences]
    assert first.sequences[0].tokens != first.sequences[1].tokens  # seeds 3 and 4
    sequence = first.sequences[0]
    assert sequence.sequence_id and len(sequence.logprobs) == len(sequence.tokens)
    scored = sampler.compute_logprobs(
        types.ModelInput.from_ints(prompt.to_ints() + sequence.tokens)).result()
    assert scored[0] is None
    # the sampler reports raw-logit logprobs, the quantity a forward pass gives back
    assert scored[-len(sequence.tokens):] == pytest.approx(sequence.logprobs, abs=1e-4)


def test_string_and_token_id_stops_end_a_sequence(service, tokenizer):
    sampler = service.create_sampling_client(base_model=BASE).result()
    prompt = prompt_of(tokenizer, "Order ORD-1")
    free = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=8, seed=5)).result()
    tokens = free.sequences[0].tokens
    assert len(tokens) >= 3, tokens
    # stopping at the token the unstopped sample drew third: the same seed draws the same
    # tokens, so the sequence ends at its first occurrence, the stop token kept
    cut = tokens.index(tokens[2]) + 1
    by_id = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=8, seed=5,
                                                           stop=[tokens[2]])).result()
    assert by_id.sequences[0].tokens == tokens[:cut]
    assert by_id.sequences[0].stop_reason == "stop"
    text = tokenizer.decode(tokens[:2])
    by_text = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=8, seed=5,
                                                             stop=[text[-1]])).result()
    assert by_text.sequences[0].tokens == tokens[:len(by_text.sequences[0].tokens)]
    assert len(by_text.sequences[0].tokens) <= 2
    assert by_text.sequences[0].stop_reason == "stop"


def test_compute_logprobs_of_the_base_model_match_a_fresh_adapter(service, trainer, tokenizer):
    prompt = prompt_of(tokenizer, "Please refund my order")
    base = service.create_sampling_client(base_model=BASE).result()
    scored = base.compute_logprobs(prompt).result()
    ids = prompt.to_ints()
    datum = types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                        loss_fn_inputs={"target_tokens": ids[1:],
                                        "weights": [0.0] * (len(ids) - 1)})
    # LoRA's B starts at zero: an untrained adapter is the base model
    fresh = trainer.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"]
    assert scored[0] is None and len(scored) == len(ids)
    assert scored[1:] == pytest.approx(fresh.tolist(), abs=1e-5)
    last_two = base.compute_logprobs(prompt, prompt_logprobs_last_n=2).result()
    assert last_two[:-2] == [None] * (len(ids) - 2) and last_two[-2:] == pytest.approx(
        scored[-2:], abs=1e-6)


def test_sampling_clients_from_tinker_paths_and_the_base_model(service, trainer, batch,
                                                               tokenizer):
    trainer.forward_backward(batch, "cross_entropy")
    trainer.optim_step(ADAM).result()
    named = trainer.save_weights_for_sampler("after-one-step").result()
    state = trainer.save_state("after-one-step").result()
    snapshot = trainer.save_weights_and_get_sampling_client().result()
    assert named.path.endswith("/sampler_weights/after-one-step")
    assert state.path.endswith("/weights/after-one-step")
    prompt = prompt_of(tokenizer)
    params = types.SamplingParams(max_tokens=10, seed=11)
    expected = snapshot.sample(prompt, 1, params).result().sequences[0]
    for path in (named.path, state.path):  # the same weights, saved two ways
        sampler = service.create_sampling_client(model_path=path).result()
        assert sampler.get_base_model() == trainer.get_info().model_data.model_name
        got = sampler.sample(prompt, 1, params).result().sequences[0]
        assert got.tokens == expected.tokens
        assert got.logprobs == pytest.approx(expected.logprobs, abs=1e-5)


# ---------------------------------------------------------------- checkpoints


def test_save_state_resumes_with_and_without_the_optimizer(service, trainer, batch):
    for _ in range(2):
        trainer.forward_backward(batch, "cross_entropy")
        trainer.optim_step(ADAM).result()
    saved = trainer.save_state("two-steps").result()
    at_save = trainer.forward(batch, "cross_entropy").result().metrics["loss:sum"]
    trainer.forward_backward(batch, "cross_entropy")
    trainer.optim_step(ADAM).result()
    continued = trainer.forward(batch, "cross_entropy").result().metrics["loss:sum"]

    resumed = service.create_training_client_from_state_with_optimizer(saved.path).result()
    assert resumed.model_id != trainer.model_id
    assert resumed.forward(batch, "cross_entropy").result().metrics["loss:sum"] == \
        pytest.approx(at_save, rel=1e-6)
    resumed.forward_backward(batch, "cross_entropy")
    resumed.optim_step(ADAM).result()
    # same weights, same AdamW moments, same batch: the same next step
    assert resumed.forward(batch, "cross_entropy").result().metrics["loss:sum"] == \
        pytest.approx(continued, rel=1e-5)

    fresh_moments = service.create_training_client_from_state(saved.path).result()
    assert fresh_moments.forward(batch, "cross_entropy").result().metrics["loss:sum"] == \
        pytest.approx(at_save, rel=1e-6)
    fresh_moments.forward_backward(batch, "cross_entropy")
    fresh_moments.optim_step(ADAM).result()
    other = fresh_moments.forward(batch, "cross_entropy").result().metrics["loss:sum"]
    assert other != pytest.approx(continued, rel=1e-5)  # Adam started over: another step


def test_loading_a_state_into_a_live_client_brings_its_weights_back(trainer, batch):
    trainer.forward_backward(batch, "cross_entropy")
    trainer.optim_step(ADAM).result()
    saved = trainer.save_state("to-load").result()
    at_save = trainer.forward(batch, "cross_entropy").result().metrics["loss:sum"]
    trainer.forward_backward(batch, "cross_entropy")
    trainer.optim_step(ADAM).result()
    assert trainer.forward(batch, "cross_entropy").result().metrics["loss:sum"] != \
        pytest.approx(at_save, rel=1e-6)
    with pytest.warns(FutureWarning):  # the SDK deprecates the in-place form; it still works
        loading = trainer.load_state_with_optimizer(saved.path)
    assert loading.result().path == saved.path
    assert trainer.forward(batch, "cross_entropy").result().metrics["loss:sum"] == \
        pytest.approx(at_save, rel=1e-6)


def test_a_saved_state_name_is_not_overwritten_unless_asked(trainer):
    trainer.save_state("kept").result()
    with pytest.raises(tinker.RequestFailedError, match="already exists"):
        trainer.save_state("kept").result()
    assert trainer.save_state("kept", overwrite=True).result().path.endswith("/weights/kept")


# ---------------------------------------------------------------- refusals


@pytest.mark.parametrize("loss", ["stable_reinforce", "dro", "gspo"])
def test_losses_the_server_does_not_compute_are_refused_and_the_client_goes_on(
        trainer, batch, loss):
    with pytest.raises(tinker.RequestFailedError, match=f"loss_fn '{loss}' is not supported"):
        trainer.forward_backward(batch, loss).result()
    # the refusal took its sequence number: the next request is not left waiting for it
    assert trainer.forward(batch, "cross_entropy").result().metrics["loss:sum"] > 0


def test_sparse_loss_inputs_are_refused_with_the_field_named(trainer, batch):
    datum = batch[0]
    n = datum.model_input.length
    sparse = types.TensorData(data=[1.0], dtype="float32", shape=[n],
                              sparse_crow_indices=[0, 1], sparse_col_indices=[0])
    bad = types.Datum(model_input=datum.model_input,
                      loss_fn_inputs={"target_tokens": datum.loss_fn_inputs["target_tokens"],
                                      "weights": sparse})
    with pytest.raises(tinker.RequestFailedError, match=r"data\[0\].loss_fn_inputs.weights: "
                       "sparse"):
        trainer.forward_backward([bad], "cross_entropy").result()


def test_an_unknown_sdk_version_is_refused_with_both_versions_named(server, monkeypatch):
    import tinker.lib.internal_client_holder as holder

    monkeypatch.setattr(holder, "tinker_sdk_version", "0.41.2")
    client = tinker.ServiceClient(base_url=server.url)
    with pytest.raises(tinker.BadRequestError, match=r"tinker 0\.41\.2.*tinker==0\.38\.0"):
        client.create_lora_training_client(base_model=BASE, rank=4).result()


def test_the_rest_client_sees_the_served_model(server):
    capabilities = tinker.RestClient(base_url=server.url).get_server_capabilities().result()
    (model,) = capabilities.supported_models
    assert model.model_name == BASE and model.trainable and model.sampleable
    assert model.max_context_length == 1024  # starter-2m's context


def test_another_base_model_is_refused(service):
    with pytest.raises(tinker.BadRequestError, match="this server serves 'starter-2m'"):
        service.create_lora_training_client(base_model="Qwen/Qwen3-8B").result()


# ---------------------------------------------------------------- the wire itself


def test_a_retried_submission_is_the_same_future_and_a_changed_one_is_refused(server,
                                                                             trainer):
    body = {"model_id": trainer.model_id, "seq_id": 1, "type": "optim_step",
            "adam_params": ADAM.model_dump()}
    status, first = post_tinker(server.url, "/optim_step", body)
    _, again = post_tinker(server.url, "/optim_step", body)
    assert status == 200 and again["request_id"] == first["request_id"]
    changed = {**body, "adam_params": {**ADAM.model_dump(), "learning_rate": 0.5}}
    status, refused = post_tinker(server.url, "/optim_step", changed)
    assert status == 400 and "seq_id 1" in refused["error"]["message"]
    status, result = post_tinker(server.url, "/retrieve_future",
                                 {"request_id": first["request_id"]})
    assert status == 200 and result["metrics"]["step:max"] == 1


def test_a_session_finished_by_close_takes_its_training_clients(server, batch):
    client = tinker.ServiceClient(base_url=server.url)
    training = client.create_lora_training_client(base_model=BASE, rank=4).result()
    client.close("success").result()
    status, answer = post_tinker(server.url, "/optim_step", {
        "model_id": training.model_id, "seq_id": 1, "adam_params": ADAM.model_dump()})
    assert status == 400 and "its session was closed" in answer["error"]["message"]


def test_eight_concurrent_clients_train_their_own_runs(server, batch):
    results: dict[int, list[float]] = {}
    errors: list[BaseException] = []

    def client_loop(index: int) -> None:
        try:
            client = tinker.ServiceClient(base_url=server.url)
            training = client.create_lora_training_client(base_model=BASE, rank=4,
                                                          seed=index % 2).result()
            losses = []
            for _ in range(2):
                step = training.forward_backward(batch, "cross_entropy")
                training.optim_step(ADAM).result()
                losses.append(step.result().metrics["loss:sum"])
            results[index] = losses
            client.close("success").result()
        except BaseException as error:  # reported below, with the others
            errors.append(error)

    threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not errors, errors
    # runs with the same seed did the same work: nothing leaked between runs
    for index in range(2, 8):
        assert results[index] == pytest.approx(results[index % 2], rel=1e-6), index
    assert results[0][1] != pytest.approx(results[1][1], rel=1e-6)


def test_a_client_that_hangs_up_mid_request_leaves_the_server_serving(server, trainer, batch):
    host, port = server.http.server_address
    headers = b"Host: 127.0.0.1\r\nX-API-Key: tml-local\r\n"
    with socket.create_connection((host, port), timeout=10) as connection:  # half a body
        connection.sendall(b"POST /api/v1/forward_backward HTTP/1.1\r\n" + headers
                           + b"Content-Type: application/x-protobuf\r\n"
                           b"Content-Length: 4096\r\n\r\n\x0a\x05" + b"x" * 100)
    # a future that stays pending (seq 50 waits for 1-49), long-polled and abandoned
    _, waiting = post_tinker(server.url, "/optim_step", {"model_id": trainer.model_id, "seq_id": 50,
                                              "adam_params": ADAM.model_dump()})
    body = json.dumps({"request_id": waiting["request_id"]}).encode()
    with socket.create_connection((host, port), timeout=10) as connection:
        connection.sendall(b"POST /api/v1/retrieve_future HTTP/1.1\r\n" + headers
                           + b"Content-Type: application/json\r\n"
                           + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    assert trainer.forward(batch, "cross_entropy").result().metrics["loss:sum"] > 0
    with urllib.request.urlopen(server.url + "/api/v1/healthz", timeout=10) as answer:
        assert json.loads(answer.read()) == {"status": "ok"}


# ---------------------------------------------------------------- restart


def test_a_restarted_server_resumes_from_a_tinker_checkpoint_path(policy, tmp_path, batch,
                                                                  one_torch_thread):
    first = start_server(Engine(BASE, tmp_path, policy=policy,
                                torch_threads=one_torch_thread), port=0)
    client = tinker.ServiceClient(base_url=first.url)
    training = client.create_lora_training_client(base_model=BASE, rank=4, seed=1).result()
    training.forward_backward(batch, "cross_entropy")
    training.optim_step(ADAM).result()
    path = training.save_state("before-restart").result().path
    sampler_path = training.save_weights_for_sampler("before-restart").result().path
    at_save = training.forward(batch, "cross_entropy").result()
    client.close("success").result()
    first.stop()

    second = start_server(Engine(BASE, tmp_path, policy=policy,
                                 torch_threads=one_torch_thread), port=0)
    try:
        client = tinker.ServiceClient(base_url=second.url)
        resumed = client.create_training_client_from_state_with_optimizer(path).result()
        again = resumed.forward(batch, "cross_entropy").result()
        assert again.metrics["loss:sum"] == pytest.approx(at_save.metrics["loss:sum"], rel=1e-6)
        resumed.forward_backward(batch, "cross_entropy")
        assert math.isfinite(resumed.optim_step(ADAM).result().metrics["grad_norm:mean"])
        sampler = client.create_sampling_client(model_path=sampler_path).result()
        assert sampler.sample(types.ModelInput.from_ints([5, 6, 7]), 1,
                              types.SamplingParams(max_tokens=4, seed=0)).result().sequences
        client.close("success").result()
    finally:
        second.stop()
