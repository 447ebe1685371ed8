"""RL algorithms as small ``build_loss`` variants over the same ordered loop.

Each function returns an ``rl.Algorithm``: the ``build_loss`` plus the loss it sends, so
``rl.check_expressible`` can refuse it before a session exists. ``reward(tokens, request)``
scores one completion (its token ids) for the group's request.

=====================  =====================================================================
algorithm              what changes against GRPO (``grpo``: r - mean over std, IS loss)
=====================  =====================================================================
dr_grpo                no std scaling (Dr. GRPO); the loss is already a token sum, so no
                       per-sequence length normalisation either
rloo                   leave-one-out baseline: r_i - mean of the others
ppo_clip               ``ppo`` loss, ratio clipped to [0.8, 1.2] by default
dapo                   ``ppo`` with clip-higher (0.8, 1.28) and uniform groups dropped
                       (DAPO's dynamic sampling) instead of failing the cycle
cispo                  ``cispo`` loss (clipped, detached ratio weight)
on_policy_distillation per-token advantage ``lp_teacher - lp_student`` (a reverse-KL
                       estimate per token; no reward), ``importance_sampling`` loss
dpo                    chosen = best, rejected = worst sample of the group; the DPO loss is
                       sent as its exact gradient at the current weights through
                       ``cross_entropy`` weights (w = -dL/dlp)
=====================  =====================================================================

Deviations kept on purpose: DAPO's token-level normalisation and overlong shaping are not
applied (the server sums; scale ``advantages`` to add them). DPO pairs are built on-policy
from the sampled group, and the reference is sampler version 0 (the weights before the
first update), read with the ``logprobs`` primitive.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from posttrain.service.client.rl import (
    Algorithm,
    LoopContext,
    all_zero,
    forward_backward_payload,
    group_mean_advantages,
    leave_one_out_advantages,
    rl_datum,
    uniform_group_error,
    weighted_datum,
)

Reward = Callable[[list[int], dict], float]


def _rewards(sample: dict, request: dict, reward: Reward, ctx: LoopContext) -> list[float]:
    rewards = [float(reward(sequence["tokens"], request)) for sequence in sample["sequences"]]
    ctx.note_rewards(rewards)
    return rewards


def _policy_gradient(
    name: str,
    reward: Reward,
    advantages_of: Callable[[list[float]], list[float]],
    loss_function: str,
    loss_config: dict[str, float] | None = None,
    *,
    skip_uniform_groups: bool = False,
    description: str = "",
) -> Algorithm:
    config = dict(loss_config or {})

    def build_loss(sample: dict, cycle: int, request: dict, ctx: LoopContext) -> dict:
        prompt_tokens = request["prompt"]["token_ids"]
        sequences = sample["sequences"]
        rewards = _rewards(sample, request, reward, ctx)
        advantages = advantages_of(rewards)
        if all_zero(advantages):
            raise uniform_group_error(cycle, rewards)
        data = [
            rl_datum(prompt_tokens, sequence["tokens"], sequence["logprobs"], advantage)
            for sequence, advantage in zip(sequences, advantages, strict=True)
        ]
        return forward_backward_payload(data, loss_function, config)

    return Algorithm(name, build_loss, loss_function, config,
                     skip_uniform_groups=skip_uniform_groups, description=description)


def grpo(reward: Reward, normalize_std: bool = True) -> Algorithm:
    """GRPO as in the seed: group-mean advantages (std-normalised), ``importance_sampling``."""
    return _policy_gradient(
        "grpo", reward, lambda r: group_mean_advantages(r, normalize_std=normalize_std),
        "importance_sampling", description="group mean (and std) baseline",
    )


def dr_grpo(reward: Reward) -> Algorithm:
    """Dr. GRPO: mean-centred advantages without the std division."""
    return _policy_gradient(
        "dr_grpo", reward, lambda r: group_mean_advantages(r, normalize_std=False),
        "importance_sampling", description="group mean baseline, no std scaling",
    )


def rloo(reward: Reward) -> Algorithm:
    """RLOO: each sample's baseline is the mean reward of the other samples."""
    return _policy_gradient("rloo", reward, leave_one_out_advantages, "importance_sampling",
                            description="leave-one-out baseline")


def ppo_clip(reward: Reward, clip_low: float = 0.8, clip_high: float = 1.2) -> Algorithm:
    """PPO's clipped surrogate with GRPO advantages."""
    return _policy_gradient(
        "ppo_clip", reward, group_mean_advantages, "ppo",
        {"clip_low_threshold": clip_low, "clip_high_threshold": clip_high},
        description="clipped ratio",
    )


def dapo(reward: Reward, clip_low: float = 0.8, clip_high: float = 1.28) -> Algorithm:
    """DAPO's clip-higher through the ``ppo`` config; uniform groups are dropped."""
    return _policy_gradient(
        "dapo", reward, group_mean_advantages, "ppo",
        {"clip_low_threshold": clip_low, "clip_high_threshold": clip_high},
        skip_uniform_groups=True, description="clip-higher, dynamic sampling",
    )


def cispo(reward: Reward, clip_low: float = 0.0, clip_high: float = 4.0) -> Algorithm:
    """CISPO: REINFORCE weighted by the clipped, detached importance ratio."""
    return _policy_gradient(
        "cispo", reward, group_mean_advantages, "cispo",
        {"clip_low_threshold": clip_low, "clip_high_threshold": clip_high},
        description="clipped importance-sampling weight",
    )


def on_policy_distillation(coefficient: float = 1.0) -> Algorithm:
    """On-policy distillation: the student samples, the teacher scores the same tokens, and
    each token's advantage is ``coefficient * (lp_teacher - lp_student)``.

    Needs ``teacher=`` in ``run_rl_loop`` (``rl.teacher_from_run`` for a second run).
    """

    def build_loss(sample: dict, cycle: int, request: dict, ctx: LoopContext) -> dict:
        prompt_tokens = list(request["prompt"]["token_ids"])
        sequences = sample["sequences"]
        teacher = ctx.teacher(
            [prompt_tokens + list(sequence["tokens"]) for sequence in sequences]
        )
        data = []
        gaps = []  # lp_student - lp_teacher per token: a reverse-KL estimate
        for sequence, teacher_logprobs in zip(sequences, teacher, strict=True):
            scored = [float(t) for t in teacher_logprobs[len(prompt_tokens):]]
            gap = [s - t for s, t in zip(sequence["logprobs"], scored, strict=True)]
            gaps.extend(gap)
            data.append(rl_datum(prompt_tokens, sequence["tokens"], sequence["logprobs"],
                                 [-coefficient * g for g in gap]))
        # noted as the cycle's "reward": minus the mean reverse-KL estimate (higher is better)
        ctx.note_rewards([-sum(gaps) / max(len(gaps), 1)])
        return forward_backward_payload(data, "importance_sampling")

    return Algorithm("on_policy_distillation", build_loss, "importance_sampling",
                     needs=("teacher",), description="per-token teacher logprob advantage")


def dpo(reward: Reward, beta: float = 0.1) -> Algorithm:
    """DPO over primitives with on-policy pairs (best vs worst sample of each group).

    The loss ``-log sigmoid(beta * ((S_c - R_c) - (S_r - R_r)))`` (S: summed policy logprob
    of the completion, R: the same under the reference, version 0) is not a built-in. Its
    gradient at the current weights is ``dL/dlp_t = -beta * sigmoid(-z)`` on every chosen
    token and ``+beta * sigmoid(-z)`` on every rejected one, so a ``cross_entropy`` call
    with weights ``w = -dL/dlp`` gives exactly that gradient. The policy logprobs are the
    sampled ones: they come from sampler version N, the current trainer weights.
    """

    def build_loss(sample: dict, cycle: int, request: dict, ctx: LoopContext) -> dict:
        prompt_tokens = list(request["prompt"]["token_ids"])
        sequences = sample["sequences"]
        rewards = _rewards(sample, request, reward, ctx)
        best = max(range(len(rewards)), key=lambda i: rewards[i])
        worst = min(range(len(rewards)), key=lambda i: rewards[i])
        if rewards[best] == rewards[worst]:
            raise uniform_group_error(cycle, rewards)
        chosen, rejected = sequences[best], sequences[worst]
        reference = ctx.logprobs(
            [prompt_tokens + list(chosen["tokens"]), prompt_tokens + list(rejected["tokens"])],
            version=ctx.reference_version,
        )
        start = len(prompt_tokens)
        margin = (sum(chosen["logprobs"]) - sum(reference[0][start:])) - (
            sum(rejected["logprobs"]) - sum(reference[1][start:])
        )
        z = beta * margin
        weight = beta / (1.0 + math.exp(z))  # beta * sigmoid(-z)
        data = [
            weighted_datum(prompt_tokens, chosen["tokens"], weight),
            weighted_datum(prompt_tokens, rejected["tokens"], -weight),
        ]
        return forward_backward_payload(data, "cross_entropy")

    return Algorithm("dpo", build_loss, "cross_entropy", needs=("logprobs",),
                     description="pairwise loss sent as its cross_entropy gradient")


# the algorithms driven by a reward function, by name (distillation needs a teacher instead)
REWARD_ALGORITHMS: dict[str, Callable[[Reward], Algorithm]] = {
    "grpo": grpo,
    "dr_grpo": dr_grpo,
    "rloo": rloo,
    "ppo_clip": ppo_clip,
    "dapo": dapo,
    "cispo": cispo,
    "dpo": dpo,
}
