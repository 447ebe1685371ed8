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

With ``--resample-dead-groups N`` the rollout also scores its groups with the run's reward
and draws a dead group again, up to N times (``dynamic_sampling.py``): the only place
where a group can be redrawn before TRL computes its advantages.

``--rollout auto`` (the default) picks TRL's sampling, with the reason, where this path
cannot run (vLLM, a multi-turn environment, whose tool loop is TRL's) or where it was not
measured faster (``choose_rollout``).
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from posttrain.envs.base import Env, case_of
from posttrain.errors import PosttrainError
from posttrain.policy.sampler import Completion, Sampler, SamplingParams
from posttrain.train.grpo.dynamic_sampling import ResampleCount, resample_dead

ROLLOUTS = ("auto", "trl", "posttrain")


@dataclass(frozen=True)
class RolloutChoice:
    """Which sampler a GRPO run's rollouts use, and why (said, and kept in the summary)."""

    name: str  # "trl" | "posttrain"
    reason: str


def choose_rollout(asked: str, *, use_vllm: bool, multi_turn: bool,
                   trl_recorded: bool, redraws: bool = False) -> RolloutChoice:
    """The rollout sampler for ``--rollout asked``; ``PosttrainError`` when ``posttrain``
    is asked where it cannot run. ``auto`` takes posttrain's (the faster: 25% off the
    9.1M starter's main job with the shared prefix, benchmarks/RESULTS.md) or, when dead
    groups are redrawn (``redraws``), must; it keeps TRL's for a test starter
    (``trl_recorded``: under 5M parameters, ``model_agent.keeps_trl_numbers``), whose
    recorded numbers come from it."""
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
    if redraws:
        return RolloutChoice("posttrain", "auto: --resample-dead-groups redraws groups in "
                             "posttrain's rollout")
    if trl_recorded:
        return RolloutChoice("trl", "auto: a model under 5M parameters, like the test "
                             "starter starter-2m, whose recorded numbers come from TRL's "
                             "sampling")
    return RolloutChoice("posttrain", "auto: a model of 5M parameters or more (the "
                         "prompts' shared system prompt runs once per batch)")


def rollout_seed(seed: int, process: int, call: int, row: int) -> int:
    """The seed of one completion: the same run draws the same, rows and calls apart."""
    text = f"{seed}:{process}:{call}:{row}".encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "big") % 2**62


@dataclass
class DeadGroupRedraw:
    """What the rollout needs to redraw dead groups (``--resample-dead-groups``): the
    budget, the reward that scores a reply, the case of each train prompt (keyed by its
    messages, the form TRL hands the rollout), and the running count."""

    rounds: int
    score: Callable[[str, dict[str, Any]], float]
    cases: dict[str, dict[str, Any]]
    count: ResampleCount

    @classmethod
    def for_run(cls, rounds: int, env: Env, records: list[dict[str, Any]],
                score: Callable[[str, dict[str, Any]], float]) -> DeadGroupRedraw:
        cases = {prompt_key(env.messages_for(record["prompt"])): case_of(env, record)
                 for record in records}
        return cls(rounds, score, cases, ResampleCount(rounds))


def prompt_key(messages: Any) -> str:
    return json.dumps(messages, sort_keys=True, ensure_ascii=False)


def posttrain_rollout(policy: Any, *, temperature: float, top_p: float,
                      max_completion_length: int, seed: int, batch_size: int,
                      redraw: DeadGroupRedraw | None = None,
                      ) -> Callable[[list[Any], Any], dict[str, Any]]:
    """A TRL ``rollout_func`` sampling ``policy.model`` (the model TRL trains: its LoRA
    layers sit in the same modules) with posttrain's sampler (module docstring); with
    ``redraw``, dead groups drawn again within its budget."""
    calls = itertools.count()
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=0,
                            max_new_tokens=max_completion_length, stop_strings=())

    def rollout(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        sampler = Sampler(SimpleNamespace(model=policy.model, tokenizer=policy.tokenizer),
                          batch_size=batch_size, end_ids=frozenset(trainer.eos_token_ids))
        encoded = sampler.encode(prompts)
        call = next(calls)
        process = int(getattr(trainer.accelerator, "process_index", 0))
        model = policy.model
        training = model.training
        model.eval()  # no dropout while sampling; TRL's own generate does the same

        def draw(rows: list[int], attempt: int) -> list[Completion]:
            # attempt 0 is the step's draw; a redraw's rows take seeds no other row has
            seeds = [rollout_seed(seed, process, call, attempt * len(prompts) + row)
                     for row in rows]
            return sampler.sample_tokens([encoded[row] for row in rows], seeds, params)

        try:
            completions = draw(list(range(len(prompts))), 0)
            if redraw is not None and redraw.rounds:
                completions = _redraw_dead(completions, prompts, trainer.num_generations,
                                           redraw, draw, policy.tokenizer)
        finally:
            model.train(training)
        return {"prompt_ids": encoded,
                "completion_ids": [completion.token_ids for completion in completions],
                "logprobs": [completion.logprobs for completion in completions]}

    return rollout


def _redraw_dead(completions: list[Completion], prompts: list[Any], group_size: int,
                 redraw: DeadGroupRedraw, draw: Callable[[list[int], int], list[Completion]],
                 tokenizer: Any) -> list[Completion]:
    """The step's completions with its dead groups drawn again (``resample_dead``),
    scored as TRL's reward will score them: the run's reward on the decoded reply."""
    keys = [prompt_key(prompt) for prompt in prompts]
    if any(key not in redraw.cases for key in keys):
        raise PosttrainError("--resample-dead-groups: a training prompt the rollout cannot "
                             "match to its case (the dataset's prompts changed under it)")
    if len(keys) % group_size or any(
            len(set(keys[start:start + group_size])) != 1
            for start in range(0, len(keys), group_size)):
        raise PosttrainError("--resample-dead-groups: the rollout's prompts do not come in "
                             f"whole groups of {group_size} (this TRL batches otherwise)")
    cases = [redraw.cases[key] for key in keys]

    def scores(rows: list[int], drawn: list[Completion]) -> list[float]:
        return [float(redraw.score(tokenizer.decode(completion.token_ids,
                                                    skip_special_tokens=True), cases[row]))
                for row, completion in zip(rows, drawn, strict=True)]

    def again(groups: list[int], attempt: int) -> dict[int, tuple[list[Any], list[float]]]:
        rows = [group * group_size + member for group in groups for member in range(group_size)]
        drawn = draw(rows, attempt)
        got = scores(rows, drawn)
        return {group: (drawn[i * group_size:(i + 1) * group_size],
                        got[i * group_size:(i + 1) * group_size])
                for i, group in enumerate(groups)}

    everything = list(range(len(completions)))
    kept, _ = resample_dead(completions, scores(everything, completions), group_size,
                            redraw.rounds, again, redraw.count)
    return kept
