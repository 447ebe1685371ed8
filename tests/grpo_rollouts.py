"""What the GRPO rollout tests share: a real TRL GRPOTrainer with posttrain's rollouts, one
step's batch scored by TRL with what the rollout function handed it, the distance between
the sampler's logprobs and the trainer's over the same tokens, and SmolLM2 cut to its
first layers for the parity checks."""

from __future__ import annotations

import tempfile
from typing import Any

from posttrain.envs import get_env

ENV = get_env("refund")


def grpo_trainer(policy: Any, completion_length: int, generations: int, output_dir: str,
                 precision: Any = None, records: list[dict] | None = None) -> Any:
    """A real TRL GRPOTrainer with posttrain's rollouts over ``records`` (default
    ``grpo_records()``) x ``generations``; ``precision`` a ``PrecisionChoice`` (default the
    runtime's)."""
    from posttrain.train.grpo.rollout import RolloutChoice
    from posttrain.train.grpo.settings import GRPOSettings
    from posttrain.train.grpo.trainer import build_grpo_trainer
    from posttrain.train.rewards import RuleReward

    records = records if records is not None else grpo_records()
    # temperature 1: TRL's trainer scores tokens at the sampling temperature, the sampler's
    # logprobs are the raw ones (posttrain.policy.sampler); at 1 the two are the same thing
    settings = GRPOSettings(steps=1, num_generations=generations,
                            batch_size=generations * len(records), monitor_every=0,
                            max_completion_length=completion_length, temperature=1.0)
    return build_grpo_trainer(policy, ENV, records, settings, 3e-4, [], RuleReward(ENV),
                              output_dir=output_dir,
                              rollout=RolloutChoice("posttrain", "test"), precision=precision)


def grpo_records() -> list[dict]:
    """The 4 refund prompts the rollout tests train on."""
    return ENV.write_prompts(40, seed=3)[:4]


def rollout_batch(policy: Any, completion_length: int, generations: int,
                  precision: Any = None) -> tuple[Any, dict, dict]:
    """(trainer, TRL's scored batch, what the rollout function handed TRL) for 4 refund
    prompts x ``generations`` (``grpo_trainer``)."""
    from posttrain.train.grpo.trainer import grpo_dataset

    records = grpo_records()
    # the trainer writes nothing while it scores one batch: its folder goes with the call
    with tempfile.TemporaryDirectory(prefix="posttrain-test-grpo-") as scratch:
        trainer = grpo_trainer(policy, completion_length, generations, scratch,
                               precision=precision, records=records)
        handed: dict = {}
        sample = trainer.rollout_func

        def kept(prompts: list, the_trainer: Any) -> dict:
            handed.update(sample(prompts, the_trainer))
            return handed

        trainer.rollout_func = kept
        batch = [row for row in grpo_dataset(ENV, records) for _ in range(generations)]
        return trainer, trainer._generate_and_score_completions(batch), handed


def trainer_logprobs(trainer: Any, output: dict) -> Any:
    """TRL's own logprob forward over the batch's completion tokens (no gradient)."""
    import torch

    completion_ids = output["completion_ids"]
    with torch.no_grad():
        reference, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, torch.cat([output["prompt_ids"], completion_ids], dim=1),
            torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1),
            completion_ids.size(1))
    return reference


def float32_logprobs(trainer: Any, output: dict) -> Any:
    """``trainer_logprobs`` with the trainer's bf16 autocast off (TRL enters it through
    ``accelerator.autocast()``, a no-op without native mixed precision)."""
    amp = trainer.accelerator.native_amp
    trainer.accelerator.native_amp = False
    try:
        return trainer_logprobs(trainer, output)
    finally:
        trainer.accelerator.native_amp = amp


def logprob_gaps(reference: Any, handed: dict) -> list[float]:
    """Per token, |trainer logprob - sampler logprob| over every handed completion."""
    import torch

    gaps: list[float] = []
    for row, sampled in enumerate(handed["logprobs"]):
        trainer_side = reference[row, :len(sampled)].float()
        gaps += (trainer_side - torch.tensor(sampled)).abs().tolist()
    return gaps


#: SmolLM2's decoder layers kept by ``short_smollm2`` (of 30): 56.6M parameters, so still a
#: model of 50M or more to every ``auto`` choice (posttrain.policy.model_agent.is_large_model)
SHORT_SMOLLM2_LAYERS = 8


def short_smollm2() -> Any:
    """SmolLM2 with its first ``SHORT_SMOLLM2_LAYERS`` decoder layers: the same architecture
    (grouped-query attention, rotary positions, tied 49k-token head), tokenizer and chat
    template at about 40% of a forward's arithmetic. A parity check between two ways of
    running one model (the shared prefix against TRL's forward, the sampler against the
    trainer) holds at any depth; the full model's numbers are benchmarks/real_path.py's."""
    from posttrain.policy.loading import load_policy
    from posttrain.policy.model_agent import is_large_model

    policy = load_policy("smollm2", show_progress=False)
    model = policy.model
    model.model.layers = model.model.layers[:SHORT_SMOLLM2_LAYERS]
    model.config.num_hidden_layers = SHORT_SMOLLM2_LAYERS
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = model.config.layer_types[:SHORT_SMOLLM2_LAYERS]
    assert is_large_model(policy), "the short SmolLM2 must still count as a real model"
    return policy
