"""TRL's fused LM head scoring only the labelled positions on a CPU
(posttrain.train.fused_head): the same logprobs and gradients as scoring every position, on
the starter and on SmolLM2, with the head's projection run over the labelled rows only."""

from __future__ import annotations

import pytest

from posttrain.envs import get_env
from posttrain.train.fused_head import compact_on, labelled_positions_only
from tests.float_bounds import difference_bound, head_logprob_bound, needs_native_bf16

# A row's projection does not depend on which other rows share the matrix product, up to
# how the BLAS kernel blocks it. Measured here (AMD EPYC, AVX-512): identical, logprobs and
# gradients, in float32 on the starter and under bf16 autocast on SmolLM2 (as the recipes
# run it there). Both ways run the same decoder on the same batch, so only the head's
# sums are grouped otherwise. In float32 the two are held to what another blocking of the
# decoder's sums can give (tests/float_bounds.py: difference_bound); under bf16 autocast to
# what another blocking of the head can give once its logits are rounded to bfloat16
# (tests/float_bounds.py: head_logprob_bound, at the batch's largest logit).


def test_compact_on_the_cpu_and_where_trl_would():
    assert compact_on("cpu", triton_choice=False)
    assert compact_on("cuda", triton_choice=True)
    assert not compact_on("xla", triton_choice=False)


def labelled_batch(tokenizer):
    """Two refund conversations as token ids, labels on the replies only (-100 on the
    prompts), right-padded: the shape of an SFT batch."""
    import torch

    env = get_env("refund")
    rows = []
    for record in env.write_prompts(6, seed=5)[:2]:
        prompt = tokenizer.apply_chat_template(env.messages_for(record["prompt"]), tokenize=False,
                                               add_generation_prompt=True)
        reply = "Let me look that order up for you, then I will tell you what I can do."
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        reply_ids = tokenizer(reply, add_special_tokens=False)["input_ids"]
        rows.append((prompt_ids, reply_ids))
    width = max(len(p) + len(r) for p, r in rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    input_ids = torch.full((len(rows), width), pad)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100)
    for n, (prompt_ids, reply_ids) in enumerate(rows):
        ids = prompt_ids + reply_ids
        input_ids[n, :len(ids)] = torch.tensor(ids)
        attention[n, :len(ids)] = 1
        labels[n, len(prompt_ids):len(ids)] = torch.tensor(reply_ids)
    return input_ids, attention, labels


def score(model, batch, compact: bool, autocast: bool):
    """Per-position logprobs, the LoRA-free model's gradient on its last layer's MLP, and
    how many rows the head projected."""
    import contextlib

    import torch
    from trl.trainer import utils as trl_utils

    input_ids, attention, labels = batch
    projected: list[int] = []
    chunked = trl_utils._ChunkedLogProbFunction

    class Counting(chunked):  # records the rows handed to TRL's kernel, runs it unchanged
        @staticmethod
        def forward(ctx, hidden, *rest):
            projected.append(hidden.shape[0])
            return chunked.forward(ctx, hidden, *rest)

    trl_utils._ChunkedLogProbFunction = Counting
    try:
        model.zero_grad()
        scope = labelled_positions_only() if compact else contextlib.nullcontext()
        precision = (torch.autocast("cpu", dtype=torch.bfloat16) if autocast
                     else contextlib.nullcontext())
        with scope, precision:
            out = model(input_ids=input_ids, attention_mask=attention, labels=labels,
                        fused_lm_head=True)
        out.loss.backward()
    finally:
        trl_utils._ChunkedLogProbFunction = chunked
    grad = model.model.layers[-1].mlp.down_proj.weight.grad.detach().clone()
    return out.log_probs.detach(), grad, projected[0]


def largest_logit(model, batch) -> float:
    """The largest |logit| the model gives this batch under bf16 autocast (the magnitude
    a bfloat16 ulp of the head's output is taken at)."""
    import torch

    input_ids, attention, _ = batch
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        hidden = model.model(input_ids=input_ids, attention_mask=attention).last_hidden_state
        return float(model.lm_head(hidden).float().abs().max())


def compare(model, tokenizer, autocast: bool) -> None:
    """Every position against the labelled ones only, held to the bound for the model's
    shape and the precision (tests/float_bounds.py)."""
    from trl.trainer.utils import add_fused_lm_head

    add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))
    batch = labelled_batch(tokenizer)
    labelled = int((batch[2][:, 1:] != -100).sum())
    every_logprobs, every_grad, every_rows = score(model, batch, compact=False,
                                                   autocast=autocast)
    only_logprobs, only_grad, only_rows = score(model, batch, compact=True, autocast=autocast)
    # the head ran over the replies only (a fraction of every position) ...
    assert every_rows == batch[0].shape[0] * (batch[0].shape[1] - 1)
    assert only_rows == labelled < every_rows / 3
    # ... and gave the same logprobs (zero off the labels both ways) and the same gradient
    if autocast:
        tolerance = head_logprob_bound(model.config.hidden_size, largest_logit(model, batch))
    else:
        tolerance = difference_bound(model.config, float(every_logprobs.abs().max()))
    assert (only_logprobs - every_logprobs).abs().max() <= tolerance
    assert (only_logprobs[batch[2][:, 1:] == -100] == 0).all()
    scale = every_grad.abs().max()
    assert scale > 0
    assert (only_grad - every_grad).abs().max() <= tolerance * max(1.0, float(scale))


def test_labelled_positions_only_matches_every_position_on_the_starter(starter_2m_folder):
    from posttrain.policy.loading import load_policy

    policy = load_policy("starter-2m", device="cpu", show_progress=False)
    compare(policy.model, policy.tokenizer, autocast=False)


@pytest.mark.slow
@needs_native_bf16
def test_labelled_positions_only_matches_every_position_on_smollm2(smollm2_folder):
    from posttrain.policy.loading import load_policy

    policy = load_policy("smollm2", show_progress=False)
    compare(policy.model, policy.tokenizer, autocast=True)


def test_the_device_test_is_put_back():
    from trl.trainer import utils as trl_utils

    before = trl_utils._use_triton
    with labelled_positions_only():
        assert trl_utils._use_triton is not before
    assert trl_utils._use_triton is before
    with pytest.raises(RuntimeError), labelled_positions_only():
        raise RuntimeError("a failed run")
    assert trl_utils._use_triton is before
