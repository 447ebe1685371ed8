"""The shared prompt prefix run once per pass in GRPO's training forward
(posttrain.train.grpo.shared_prefix): where the prefix splits, what ``auto`` picks, and, on a real
TRL GRPOTrainer's batch, the same logprobs, entropies, loss and LoRA gradient as TRL's own
forward, on the starter (float32) and on SmolLM2 (bf16 autocast, as the recipe runs it)."""

from __future__ import annotations

import math
import tempfile
from copy import deepcopy
from dataclasses import replace

import pytest

from posttrain.errors import PosttrainError
from posttrain.train.grpo.shared_prefix import (
    MIN_SHARED_PREFIX,
    choose_shared_prefix,
    common_prefix,
    remainder_mask,
    share_prompt_prefix,
)
from tests.float_bounds import difference_bound, needs_native_bf16
from tests.grpo_rollouts import grpo_trainer, rollout_batch, short_smollm2

# The two forwards multiply the same numbers in other groupings (the prefix as one row
# instead of inside each row), so float32 sums differ in their last bits: measured here
# (AMD EPYC, AVX-512) largest logprob gap 4e-6 on starter-2m and 1.3e-5 on SmolLM2
# (entropies 2.7e-5), gradients 1.5e-5 of their largest entry. Held to what another
# grouping of the decoder's float32 sums can give (tests/float_bounds.py): logprobs,
# entropies and the loss at their own magnitude; a gradient goes through the chain twice
# (forward, then backward), relative to its largest entry.
# Under bf16 autocast (8-bit mantissas) a worst-case bound on the rounding is larger than
# the logprobs themselves, so there the shared prefix is held to what GRPO needs, as TRL's
# own bf16 forward is: a mean per-token gap from float32 inside the clip range,
# log(1 + epsilon). Measured here (AMD EPYC) on SmolLM2's first 8 layers: largest gap 0.158
# for the shared prefix against TRL's 0.149.


def left_padded(rows: list[list[int]], completion: list[list[int]]):
    import torch

    width = max(len(row) for row in rows)
    ids = torch.zeros((len(rows), width + len(completion[0])), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for n, (row, tail) in enumerate(zip(rows, completion, strict=True)):
        ids[n, width - len(row):width] = torch.tensor(row)
        mask[n, width - len(row):width] = 1
        ids[n, width:] = torch.tensor(tail)
        mask[n, width:] = 1
    return ids, mask, width


def test_the_prefix_is_what_every_prompt_starts_with():
    head = list(range(100, 100 + 40))
    rows = [[*head, 7, 8, 9], [*head, 5], [*head[:-2], 1, 2, 3, 4, 5, 6]]
    ids, mask, width = left_padded(rows, [[1, 1], [2, 2], [3, 3]])
    split = common_prefix(ids, mask, width)
    assert split is not None
    assert split.length == 38 and split.prompt_width == width
    # the longest remainder (row 2: 6 tokens after the prefix) fills the remainder columns
    assert split.rest_width == 6
    rest = remainder_mask(mask, split)
    assert rest[:, :split.rest_width].sum(dim=1).tolist() == [5, 3, 6]
    assert rest[:, split.rest_width:].eq(1).all()
    # what the mask keeps is each row's tokens after the prefix, in order
    first = width - split.rest_width
    kept = [ids[n, first:][rest[n] == 1].tolist() for n in range(3)]
    assert kept == [row[38:] + tail for row, tail in zip(rows, [[1, 1], [2, 2], [3, 3]],
                                                          strict=True)]


def test_every_row_keeps_a_prompt_token_and_short_prefixes_are_not_split():
    head = list(range(100, 100 + 30))
    ids, mask, width = left_padded([head, head], [[1], [2]])
    split = common_prefix(ids, mask, width)
    assert split is not None and split.length == 29 and split.rest_width == 1
    short = list(range(MIN_SHARED_PREFIX - 1))
    ids, mask, width = left_padded([[*short, 1, 2], [*short, 3]], [[1], [2]])
    assert common_prefix(ids, mask, width) is None
    # padding inside a prompt is not TRL's layout: left to TRL's function
    ids, mask, width = left_padded([[*head, 1], [*head, 2]], [[1], [2]])
    mask[0, width - 5] = 0
    assert common_prefix(ids, mask, width) is None


def test_auto_is_on_except_for_the_test_starters():
    assert choose_shared_prefix("auto", trl_recorded=False).on
    starter = choose_shared_prefix("auto", trl_recorded=True)
    assert not starter.on and "starter-2m" in starter.reason
    assert choose_shared_prefix("on", trl_recorded=True).on
    assert not choose_shared_prefix("off", trl_recorded=False).on
    assert not choose_shared_prefix("on", trl_recorded=False, world_size=2).on
    with pytest.raises(PosttrainError, match="expected one of auto, on, off"):
        choose_shared_prefix("always", trl_recorded=False)


def logps_loss_and_grads(trainer, output):
    """TRL's per-token logprobs and entropies of the batch (no gradient; in two passes, as a
    batch larger than TRL's pass is scored), then its GRPO loss on the batch and the LoRA
    weights' gradient."""
    import torch

    ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
    mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
    with torch.no_grad():
        logps, entropies, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, mask, output["completion_ids"].size(1),
            batch_size=len(ids) // 2, compute_entropy=True)
    trainer.model.zero_grad()
    trainer.current_gradient_accumulation_steps = 1  # what Trainer sets before a step
    loss = trainer.compute_loss(trainer.model, output)
    loss.backward()
    grads = {name: p.grad.detach().clone() for name, p in trainer.model.named_parameters()
             if p.requires_grad and p.grad is not None}
    return logps, entropies, loss.detach(), grads


def compare(policy, generations: int = 4) -> None:
    """TRL's forward against the shared prefix's, both in float32, on one GRPO batch of 4
    prompts x ``generations``."""
    from posttrain.train.precision import PrecisionChoice

    trainer, output, _ = rollout_batch(policy, completion_length=16, generations=generations,
                                       precision=PrecisionChoice(False, "float32 parity"))
    import torch

    # advantages of both signs, so the loss has a gradient to compare whatever the rewards
    # (a short model's replies may all score alike, which zeroes TRL's own)
    output["advantages"] = torch.linspace(-1.0, 1.0, output["advantages"].numel())
    completion_mask = output["completion_mask"].bool()
    reference = logps_loss_and_grads(trainer, output)
    config = policy.model.config
    magnitude = max(float(reference[0][completion_mask].abs().max()),
                    float(reference[1][completion_mask].abs().max()), abs(float(reference[2])))
    tolerance = difference_bound(config, magnitude)
    gradient_tolerance = 2 * difference_bound(config, 1.0)
    share_prompt_prefix(trainer)
    counted: list[int] = []
    model_forward = trainer.model.forward

    def counting(*args, **kwargs):  # the token positions each forward runs
        counted.append(int(kwargs["input_ids"].numel()))
        return model_forward(*args, **kwargs)

    trainer.model.forward = counting
    shared = logps_loss_and_grads(trainer, output)
    trainer.model.forward = model_forward
    # fewer positions ran in the two passes (the scoring one in two halves, the loss one
    # whole): the prompts' shared head once per pass, not once per row
    every = output["prompt_ids"].numel() + output["completion_ids"].numel()
    assert len(counted) == 6 and 0 < sum(counted) < 2 * every
    for ours, theirs in zip(shared[:2], reference[:2], strict=True):
        assert (ours - theirs)[completion_mask].abs().max() <= tolerance
        assert (ours[~completion_mask] == 0).all()
    assert shared[2] == pytest.approx(float(reference[2]), abs=tolerance)
    assert shared[3].keys() == reference[3].keys() and reference[3]
    for name, grad in reference[3].items():
        # (LoRA's B starts at zero, so A's gradient is zero both ways on a first step)
        scale = max(float(grad.abs().max()), 1e-8)
        assert (shared[3][name] - grad).abs().max() <= gradient_tolerance * scale, name


@pytest.mark.slow
def test_the_shared_prefix_gives_trls_logprobs_and_gradient_on_the_starter(starter_2m):
    compare(copied(starter_2m))


@pytest.fixture(scope="module")
def smollm2_head(smollm2_folder):
    """SmolLM2's first 8 layers (tests/grpo_rollouts.py), loaded once for this file's
    tests; each trains a copy (``copied``)."""
    return short_smollm2()


@pytest.mark.slow
def test_the_shared_prefix_gives_trls_logprobs_and_gradient_on_smollm2(smollm2_head):
    # 2 completions of each prompt: a row's logprobs and its share of the gradient do not
    # depend on how many rows share the head
    compare(copied(smollm2_head), generations=2)


def copied(policy):
    """A copy of ``policy`` a trainer may attach its LoRA adapter to (and change the
    tokenizer of)."""
    return replace(policy, model=deepcopy(policy.model), tokenizer=deepcopy(policy.tokenizer))


def completion_logps(trainer, output):
    import torch

    ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
    mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, mask, output["completion_ids"].size(1), batch_size=8)
    return logps[output["completion_mask"].bool()]


@pytest.mark.slow
@needs_native_bf16
def test_under_bf16_the_shared_prefix_stays_within_grpos_clip_range_as_trls_forward(
        smollm2_head):
    """On SmolLM2 under bf16 autocast (the recipe's choice on a CPU with native bf16): the
    shared prefix's logprobs are on average no further from TRL's float32 ones than GRPO's
    clip range allows, as TRL's own bf16 forward's are, on the same batch."""
    from posttrain.train.precision import PrecisionChoice

    float32_trainer, output, _ = rollout_batch(
        copied(smollm2_head), completion_length=16, generations=4,
        precision=PrecisionChoice(False, "float32 reference"))
    exact = completion_logps(float32_trainer, output)
    # a second trainer under bf16 autocast, scoring the first one's batch
    with tempfile.TemporaryDirectory(prefix="posttrain-test-grpo-") as scratch:
        bf16_trainer = grpo_trainer(copied(smollm2_head), completion_length=16, generations=4,
                                    output_dir=scratch,
                                    precision=PrecisionChoice(True, "bf16 autocast"))
        trl_bf16 = completion_logps(bf16_trainer, output)
        share_prompt_prefix(bf16_trainer)
        shared_bf16 = completion_logps(bf16_trainer, output)
    clip_gap = math.log1p(bf16_trainer.args.epsilon)
    trl_gap = float((trl_bf16 - exact).abs().mean())
    shared_gap = float((shared_bf16 - exact).abs().mean())
    assert 0 < trl_gap < clip_gap  # bf16 did round, as little as GRPO needs
    assert shared_gap < clip_gap, (shared_gap, trl_gap)
