"""GRPO's training rollouts through posttrain's batched sampler instead of TRL's generate.

TRL samples the completions of a GRPO step with ``model.generate`` (or vLLM on a GPU).
On a CPU two things of posttrain's sampler (``posttrain.policy.sampler``) matter: the
tokens every prompt starts with (the environment's system prompt and tool list, most of a
prompt) are run through the model once per micro-batch instead of once per completion,
and its decode loop is a plain loop over the KV cache. ``--rollout posttrain`` hands TRL
a ``rollout_func`` that samples with it; the rest of TRL's step (rewards, advantages, the
loss and its logprobs, the update) is unchanged.

What is kept the same as TRL's own sampling: the prompts through the same chat template,
the training temperature and top-p, no top-k, ``--max-completion-length``, and a
completion ends only at one of the trainer's own end-of-sequence tokens (so TRL's
truncation mask reads it as it reads its own). What differs: the random numbers (each
completion has its own seed, derived from ``--seed``, the call and its row), so a run
does not repeat a ``--rollout trl`` run token for token.

``--rollout auto`` (the default) picks TRL's sampling, with the reason, where this path
cannot run (vLLM, a multi-turn environment, whose tool loop is TRL's) or where it was not
measured faster (``choose_rollout``).
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from posttrain.errors import PosttrainError
from posttrain.policy.sampler import Sampler, SamplingParams

ROLLOUTS = ("auto", "trl", "posttrain")


@dataclass(frozen=True)
class RolloutChoice:
    """Which sampler a GRPO run's rollouts use, and why (said, and kept in the summary)."""

    name: str  # "trl" | "posttrain"
    reason: str


def choose_rollout(asked: str, *, use_vllm: bool, multi_turn: bool,
                   large_model: bool) -> RolloutChoice:
    """The rollout sampler for ``--rollout asked``; ``PosttrainError`` when ``posttrain``
    is asked where it cannot run. ``auto`` takes posttrain's for a model of real size
    (``large_model``: 50M parameters or more) and keeps TRL's for small ones, the embedded
    starters, whose recipes' recorded numbers come from it."""
    if asked not in ROLLOUTS:
        raise PosttrainError(f"--rollout {asked!r}: expected one of {', '.join(ROLLOUTS)}")
    blocker = ("--use-vllm samples with vLLM" if use_vllm else
               "a multi-turn environment's tool loop is TRL's" if multi_turn else None)
    if asked == "posttrain" and blocker:
        raise PosttrainError(f"--rollout posttrain cannot run here: {blocker}; leave "
                             "--rollout at auto or set it to trl")
    if asked == "trl":
        return RolloutChoice("trl", "asked for (--rollout trl)")
    if asked == "posttrain":
        return RolloutChoice("posttrain", "asked for (--rollout posttrain)")
    if blocker:
        return RolloutChoice("trl", f"auto: {blocker}")
    if not large_model:
        return RolloutChoice("trl", "auto: a model under 50M parameters, like the embedded "
                             "starters, whose recorded numbers come from TRL's sampling")
    return RolloutChoice("posttrain", "auto: a model of 50M parameters or more (the "
                         "prompts' shared system prompt runs once per batch)")


def rollout_seed(seed: int, process: int, call: int, row: int) -> int:
    """The seed of one completion: the same run draws the same, rows and calls apart."""
    text = f"{seed}:{process}:{call}:{row}".encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "big") % 2**62


def posttrain_rollout(policy: Any, *, temperature: float, top_p: float,
                      max_completion_length: int, seed: int, batch_size: int
                      ) -> Callable[[list[Any], Any], dict[str, Any]]:
    """A TRL ``rollout_func`` sampling ``policy.model`` (the model TRL trains: its LoRA
    layers sit in the same modules) with posttrain's sampler (module docstring)."""
    calls = itertools.count()
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=0,
                            max_new_tokens=max_completion_length, stop_strings=())

    def rollout(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        sampler = Sampler(SimpleNamespace(model=policy.model, tokenizer=policy.tokenizer),
                          batch_size=batch_size, end_ids=frozenset(trainer.eos_token_ids))
        encoded = sampler.encode(prompts)
        call = next(calls)
        process = int(getattr(trainer.accelerator, "process_index", 0))
        seeds = [rollout_seed(seed, process, call, row) for row in range(len(prompts))]
        model = policy.model
        training = model.training
        model.eval()  # no dropout while sampling; TRL's own generate does the same
        try:
            completions = sampler.sample_tokens(encoded, seeds, params)
        finally:
            model.train(training)
        return {"prompt_ids": encoded,
                "completion_ids": [completion.token_ids for completion in completions],
                "logprobs": [completion.logprobs for completion in completions]}

    return rollout
