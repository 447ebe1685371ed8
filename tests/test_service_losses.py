"""The service's built-in losses against references written out here with plain autograd.

Each test builds a tiny random Qwen2 (no download, no cache), computes the learner's
target logprobs, and checks that ``posttrain.service.engine.losses`` gives the same summed loss
and the same parameter gradients as an independent per-token reference.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from posttrain.service.engine import losses  # noqa: E402

VOCAB = 64


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """One intra-op thread: these tensors are tiny, and on a busy 2-core machine a 2-thread
    OpenMP team stalls at every barrier (seconds per test instead of milliseconds)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_model():
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    model = transformers.Qwen2ForCausalLM(config).float()
    model.eval()
    return model


def _datum(seed: int, length: int = 12, prompt: int = 4):
    """A datum in the wire convention: input = full[:-1], targets = full[1:]."""
    generator = torch.Generator().manual_seed(seed)
    full = torch.randint(0, VOCAB, (length + 1,), generator=generator)
    sampled = -torch.rand(length, generator=generator) * 3 - 0.5  # plausible sampler logprobs
    advantages = torch.randn(length, generator=generator)
    weights = torch.ones(length)
    sampled[: prompt - 1] = 0.0
    advantages[: prompt - 1] = 0.0
    weights[: prompt - 1] = 0.0
    return {
        "input": full[:-1],
        "target_tokens": full[1:],
        "logprobs": sampled,
        "advantages": advantages,
        "weights": weights,
    }


def _target_logprobs(model, datum):
    logits = model(input_ids=datum["input"][None]).logits[0].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, datum["target_tokens"][:, None])[:, 0]


def _grads(model):
    return [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]


def _run(model, datums, loss_of_datum):
    model.zero_grad(set_to_none=True)
    total = sum(loss_of_datum(_target_logprobs(model, d), d) for d in datums)
    total.backward()
    return total.detach(), _grads(model)


# ---- independent references: scalar loops over tokens, written from the formulas


def _ref_cross_entropy(lp, d, cfg):
    return sum(-d["weights"][t] * lp[t] for t in range(len(lp)))


def _ref_importance_sampling(lp, d, cfg):
    return sum(-torch.exp(lp[t] - d["logprobs"][t]) * d["advantages"][t] for t in range(len(lp)))


def _ref_ppo(lp, d, cfg):
    total = 0.0
    for t in range(len(lp)):
        ratio, adv = torch.exp(lp[t] - d["logprobs"][t]), d["advantages"][t]
        clipped = torch.clamp(ratio, cfg["clip_low_threshold"], cfg["clip_high_threshold"])
        total = total - torch.min(ratio * adv, clipped * adv)
    return total


def _ref_cispo(lp, d, cfg):
    total = 0.0
    for t in range(len(lp)):
        ratio = math.exp(float(lp[t].detach() - d["logprobs"][t]))  # a number: no gradient
        weight = min(max(ratio, cfg["clip_low_threshold"]), cfg["clip_high_threshold"])
        total = total - weight * lp[t] * d["advantages"][t]
    return total


def _ref_dro(lp, d, cfg):
    total = 0.0
    for t in range(len(lp)):
        gap = lp[t] - d["logprobs"][t]
        term = lp[t] * d["advantages"][t] - 0.5 * cfg["beta"] * gap**2
        total = total - d["weights"][t] * term
    return total


REFERENCES = {
    "cross_entropy": (_ref_cross_entropy, {}),
    "importance_sampling": (_ref_importance_sampling, {}),
    # tight thresholds so some tokens are really clipped by the random sampler logprobs
    "ppo": (_ref_ppo, {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}),
    "cispo": (_ref_cispo, {"clip_low_threshold": 0.5, "clip_high_threshold": 1.5}),
    "dro": (_ref_dro, {"beta": 0.3}),
}


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_loss_matches_autograd_reference(tiny_model, name):
    reference, overrides = REFERENCES[name]
    config = losses.resolve_config(name, overrides)
    spec = losses.LOSSES[name]
    datums = [_datum(seed) for seed in range(3)]

    def ours(lp, d):
        inputs = {key: d[key] for key in (*spec.required_inputs, *spec.optional_inputs)}
        return losses.datum_loss(name, lp, inputs, config)

    loss, grads = _run(tiny_model, datums, ours)
    expected_loss, expected_grads = _run(tiny_model, datums, lambda lp, d: reference(lp, d, config))
    assert loss.item() == pytest.approx(expected_loss.item(), rel=1e-5, abs=1e-6)
    assert len(grads) == len(expected_grads) > 0
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_loss_is_a_sum_over_datums_not_a_mean(tiny_model):
    # guards against a server-side mean creeping in: doubling the batch doubles the loss
    datum = _datum(5)
    config = losses.resolve_config("importance_sampling", {})
    inputs = {k: datum[k] for k in ("target_tokens", "logprobs", "advantages")}
    with torch.no_grad():
        lp = _target_logprobs(tiny_model, datum)
        one = losses.datum_loss("importance_sampling", lp, inputs, config)
    assert (one + one).item() == pytest.approx(2 * one.item())


def test_ppo_clipped_tokens_get_no_gradient():
    # r = e^1 > 1.2 with a positive advantage: the clipped branch is the min, gradient 0
    lp = torch.tensor([0.0, -1.0], requires_grad=True)
    inputs = {"logprobs": torch.tensor([-1.0, -1.0]), "advantages": torch.tensor([1.0, 1.0])}
    losses.datum_loss("ppo", lp, inputs, losses.resolve_config("ppo", {})).backward()
    assert lp.grad[0].item() == 0.0
    assert lp.grad[1].item() == pytest.approx(-1.0)  # r = 1: plain -A


def test_cispo_keeps_gradient_on_clipped_tokens():
    # same token as above: CISPO clips the weight (to 1.2) but the gradient stays, -1.2 * A
    lp = torch.tensor([0.0], requires_grad=True)
    inputs = {"logprobs": torch.tensor([-1.0]), "advantages": torch.tensor([1.0])}
    config = losses.resolve_config("cispo", {"clip_high_threshold": 1.2})
    losses.datum_loss("cispo", lp, inputs, config).backward()
    assert lp.grad[0].item() == pytest.approx(-1.2)


def test_defaults_are_the_published_ones():
    assert losses.resolve_config("ppo", None) == {
        "clip_low_threshold": 0.8,
        "clip_high_threshold": 1.2,
    }
    assert losses.resolve_config("cispo", {}) == {
        "clip_low_threshold": 0.0,
        "clip_high_threshold": 4.0,
    }
    assert losses.resolve_config("dro", {}) == {"beta": 0.05}


@pytest.mark.parametrize(
    ("name", "config", "message"),
    [
        ("gspo", {}, "not supported"),
        ("ppo", {"epsilon": 0.2}, "'epsilon' are not accepted"),
        ("importance_sampling", {"clip_low_threshold": 0.8}, "not accepted"),
        ("ppo", {"clip_low_threshold": 1.5, "clip_high_threshold": 1.2}, "<="),
        ("dro", {"beta": float("nan")}, "finite"),
        ("dro", {"beta": "0.1"}, "finite"),
        ("dro", {"beta": -1}, ">= 0"),
    ],
)
def test_bad_loss_requests_are_refused(name, config, message):
    with pytest.raises(losses.LossError, match=message):
        losses.resolve_config(name, config)


def test_inputs_are_checked_both_ways():
    with pytest.raises(losses.LossError, match="needs advantages"):
        losses.check_inputs("ppo", {"target_tokens", "logprobs"})
    with pytest.raises(losses.LossError, match="does not take mask"):
        keys = {"target_tokens", "logprobs", "advantages", "mask"}
        losses.check_inputs("importance_sampling", keys)
    losses.check_inputs("dro", {"target_tokens", "logprobs", "advantages", "weights"})


def test_capabilities_list_every_loss_with_defaults():
    served = losses.capabilities()
    assert set(served) == {"cross_entropy", "importance_sampling", "ppo", "cispo", "dro"}
    assert served["ppo"]["config_defaults"]["clip_high_threshold"] == 1.2
    assert served["cross_entropy"]["required_inputs"] == ["target_tokens", "weights"]


def test_one_pass_holds_a_bounded_number_of_tokens_whatever_the_vocabulary(tiny_model):
    """Issue #49, class 4: the micro-batches were bounded by logits alone, so a model with
    a small vocabulary took a whole 32k-token call in one pass (~12 GB of activations on the
    starter, benchmarks/serve_call_memory.py). Now a pass holds at most MICRO_BATCH_TOKENS
    padded tokens, and the logprobs are the same as one sequence at a time."""
    from posttrain.service.engine.lora_model import MICRO_BATCH_TOKENS, target_logprobs

    datums = [_datum(seed, length=60) for seed in range(2 * MICRO_BATCH_TOKENS // 60 + 1)]
    passes = []
    hook = tiny_model.register_forward_pre_hook(
        lambda module, args, kwargs: passes.append(kwargs["input_ids"].numel()),
        with_kwargs=True)
    seen = set()
    try:
        with torch.no_grad():
            for group, group_logprobs in target_logprobs(
                    tiny_model, [tuple(d["input"].tolist()) for d in datums],
                    [d["target_tokens"].tolist() for d in datums], pad_id=0):
                for index, logprobs in zip(group, group_logprobs, strict=True):
                    seen.add(index)
                    torch.testing.assert_close(
                        logprobs, _target_logprobs(tiny_model, datums[index]),
                        rtol=1e-4, atol=1e-5)
    finally:
        hook.remove()
    assert seen == set(range(len(datums)))
    # the hook also saw the one-at-a-time references: the batched passes are the big ones
    batched = [size for size in passes if size > 60]
    assert len(batched) >= 2 and max(batched) <= MICRO_BATCH_TOKENS
