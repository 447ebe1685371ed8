"""Measuring a recipe's policies: ``evaluate_policy`` samples the holdout with the run's
evaluation settings (``PolicyEvaluation``: its rows per evaluation). What the run makes
of the measurements at its end is ``summary.py``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from posttrain.policy.model_agent import ModelAgent, default_max_new_tokens
from posttrain.policy.models import Policy
from posttrain.policy.sampler import SamplingParams
from posttrain.policy.vllm_sampler import VllmAgent
from posttrain.score.evaluate import evaluate
from posttrain.score.passat import PassAt, pass_at
from posttrain.train.context import RecipeContext
from posttrain.train.distributed import gather_in_order, shard


@dataclass
class PolicyEvaluation:
    """One policy's holdout rows per evaluation run; ``rows`` pools every run."""

    runs: list[list[dict[str, Any]]]
    seconds: float

    @property
    def rows(self) -> list[dict[str, Any]]:
        return [row for rows in self.runs for row in rows]

    def pass_at(self, seed: int = 0) -> PassAt:
        return pass_at(self.rows, seed=seed)

    def joined(self, more: PolicyEvaluation) -> PolicyEvaluation:
        """This policy's evaluations followed by ``more`` of its later repeats."""
        return PolicyEvaluation(runs=[*self.runs, *more.runs],
                                seconds=self.seconds + more.seconds)

    def describe(self) -> str:
        line = str(self.pass_at())
        if len(self.runs) > 1:
            rates = [pass_at(rows).pass_at_1 for rows in self.runs]
            line += "; repeats " + ", ".join(f"{rate:.3f}" for rate in rates)
        return line


def evaluation_sampling(settings: Any, policy: Policy) -> SamplingParams:
    """How the holdout is sampled: the run's evaluation temperature and top-p, and the
    reply cap that fits the model. The hack monitor samples the same way."""
    return SamplingParams(
        temperature=settings.eval_temperature,
        top_p=settings.eval_top_p,
        max_new_tokens=default_max_new_tokens(policy),
    )


def evaluation_agent(settings: Any, policy: Policy, params: SamplingParams) -> Any:
    """What samples the holdout: the policy in memory through posttrain's own sampler, or
    with ``--sampler vllm`` a vLLM engine on the base model and the adapter saved on disk
    (the after-evaluation runs once the trainer wrote ``adapter/``)."""
    if getattr(settings, "sampler", "transformers") != "vllm":
        return ModelAgent(policy, params)
    return VllmAgent(settings.base_model or policy.name, policy.adapter, params)


def evaluate_policy(
    context: RecipeContext, policy: Policy, *, repeats: int, label: str,
    first_repeat: int = 0,
) -> PolicyEvaluation:
    """Sample ``eval_samples`` replies per holdout prompt, ``repeats`` times (seeded; the
    evaluation runs from ``first_repeat`` on, see ``posttrain.score.evaluate``).

    Launched as several processes, each samples its share of the prompts and the rows are
    gathered back in the holdout's order on every process (``posttrain.train.distributed``).
    """
    settings = context.settings
    ranks = context.ranks
    holdout = context.data.holdout
    mine = shard(holdout, ranks)
    params = evaluation_sampling(settings, policy)
    was_training = policy.model.training
    policy.model.eval()
    agent = None
    try:
        agent = evaluation_agent(settings, policy, params)
        evaluation = evaluate(
            context.env,
            mine,
            agent,
            samples=settings.eval_samples,
            seed=settings.eval_seed,
            repeats=repeats,
            first_repeat=first_repeat,
            label=label,
            show_progress=ranks.is_main,
        )
    finally:
        if was_training:
            policy.model.train()
        if hasattr(agent, "close"):  # a vLLM engine gives its GPU memory back
            agent.close()
    samples = settings.eval_samples
    runs = [
        # rows come in prompt order, `samples` per prompt: one group per prompt of my share
        gather_in_order([rows[i * samples:(i + 1) * samples] for i in range(len(mine))],
                        len(holdout), ranks)
        for rows in evaluation.runs
    ]
    return PolicyEvaluation(runs=runs, seconds=evaluation.seconds)
