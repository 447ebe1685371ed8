"""Building the pairs and running TRL's DPOTrainer for a posttrain run.

Kept apart from the recipe flow (``posttrain.train.recipe``) and the settings
(``posttrain.train.dpo.settings``) so the TRL-specific parts sit in one place. The training
step ``train_dpo``:

1. on ``--from-run``, saves the merged policy it starts from under ``merged/`` (the
   shared flow already merged the adapter; a later round stacks on this folder);
2. gets the pairs: sampled from the policy on the train prompts (evaluation
   temperature and top-p, a seed of its own), or read from ``--pairs``; writes
   them to ``pairs.jsonl`` and the pair report to the run store and summary;
3. trains a fresh LoRA adapter with ``DPOTrainer(ref_model=None)``: with a PEFT
   model TRL uses the adapter switched off as the reference, i.e. the policy the
   run started from (the merged one in round two);
4. saves ``adapter/`` and hands the trained policy back for the after-evaluation.
"""

from __future__ import annotations

import tempfile
from typing import Any

from posttrain.errors import PosttrainError
from posttrain.policy.model_agent import ModelAgent, default_max_new_tokens
from posttrain.policy.models import Policy, lora_config, parameter_count, save_policy
from posttrain.policy.sampler import SamplingParams
from posttrain.progress import progress_bar
from posttrain.train.callbacks import TrainerCallback
from posttrain.train.console import ConsoleProgress
from posttrain.train.context import RecipeContext, TrainOutcome
from posttrain.train.distributed import Ranks, gather_all, shard
from posttrain.train.dpo.settings import DPOSettings, dpo_config_kwargs
from posttrain.train.plan import TrainerPlan
from posttrain.train.precision import PrecisionChoice
from posttrain.train.training_data.pairs import (
    Pair,
    PairReport,
    build_preference_pairs,
    export_preference,
    load_pairs,
    prompt_key,
    sample_pair_rows,
    summarize_pairs,
)
from posttrain.train.trl_run import quiet_transformers_warnings, train_and_save, trainer_outcome


def dpo_dataset(pairs: list[Pair]) -> Any:
    """A ``datasets.Dataset`` with the three columns DPOTrainer reads (conversational)."""
    from datasets import Dataset

    return Dataset.from_list(
        [{"prompt": p["prompt"], "chosen": p["chosen"], "rejected": p["rejected"]} for p in pairs]
    )


def policy_agent(context: Any) -> Any:
    """The policy being trained as a sampling agent, at the evaluation temperature and top-p."""
    settings: DPOSettings = context.settings
    params = SamplingParams(
        temperature=settings.eval_temperature,
        top_p=settings.eval_top_p,
        max_new_tokens=default_max_new_tokens(context.policy),
    )
    context.policy.model.eval()
    return ModelAgent(context.policy, params)


def sample_pairs(context: Any, agent: Any) -> tuple[list[Pair], PairReport]:
    """On-policy pairs: ``--pair-samples`` replies per train prompt from ``agent``.

    ``context`` needs ``settings``, ``env``, ``data.train`` and ``say``. Raises
    ``PosttrainError`` when no prompt had contrast, saying to raise ``--pair-samples``.
    """
    settings: DPOSettings = context.settings
    ranks: Ranks = getattr(context, "ranks", Ranks())
    train = context.data.train
    total = settings.pair_samples * len(train)
    context.say(
        f"pairs: sampling {settings.pair_samples} replies per train prompt "
        f"({len({record['prompt'] for record in train})} distinct prompts, {total} replies"
        + (f", split over {ranks.world} processes" if ranks.distributed else "") + ")"
    )
    # launched as several processes, each samples the replies of its share of the distinct
    # prompts (a sample's seed depends on its prompt and index, not on the process), and
    # every process then builds the same pairs from all the rows
    order = {key: position for position, key in
             enumerate(dict.fromkeys(prompt_key(record["prompt"]) for record in train))}
    mine_keys = set(shard(list(order), ranks))
    mine = [record for record in train if prompt_key(record["prompt"]) in mine_keys]
    with progress_bar("pairs: sampling", settings.pair_samples * len(mine),
                      enabled=ranks.is_main) as update:
        rows = sample_pair_rows(
            context.env,
            mine,
            agent,
            settings.pair_samples,
            seed=settings.seed,
            progress=lambda done, _total: update(done),
        )
    if ranks.distributed:
        rows = sorted(gather_all(rows, ranks),
                      key=lambda row: (order[prompt_key(row["prompt"])], row["sample"]))
    pairs, report = build_preference_pairs(
        rows,
        env=context.env,
        min_margin=settings.min_margin,
        max_pairs_per_prompt=settings.max_pairs_per_prompt,
        constructed_share=(settings.constructed_share
                           if settings.resolved_constructed_negatives(context.env) else None),
    )
    if report.sampled_pairs == 0:
        raise PosttrainError(
            f"no train prompt had contrast: in {settings.pair_samples} samples each, every one "
            f"of the {report.prompts_seen} prompts scored within {settings.min_margin} of "
            "itself (all pass or all fail), so there is no pair to learn from. Raise "
            f"--pair-samples (e.g. --pair-samples {settings.pair_samples * 2}), or give "
            "--pairs FILE"
        )
    return pairs, report


def file_pairs(settings: DPOSettings) -> tuple[list[Pair], PairReport]:
    """Pairs read from ``--pairs`` (already checked by ``check_dpo_settings``)."""
    assert settings.pairs is not None, "called only when --pairs was given"
    pairs, skipped = load_pairs(settings.pairs, skip_invalid=settings.skip_invalid)
    report = summarize_pairs(pairs, source=str(settings.pairs))
    report.skipped_lines = len(skipped)
    if skipped:
        report.warnings.append(f"{len(skipped)} invalid line(s) skipped, first: {skipped[0]}")
    return pairs, report


def build_dpo_trainer(
    policy: Policy,
    pairs: list[Pair],
    settings: DPOSettings,
    learning_rate: float,
    callbacks: list[Any],
    output_dir: str | None = None,
    world_size: int = 1,
    precision: PrecisionChoice | None = None,
) -> Any:
    """A ready-to-train ``trl.DPOTrainer`` with a fresh LoRA adapter on ``policy.model``
    (``precision``: bf16 autocast or float32; default the runtime's, ``trainer_runtime_
    kwargs``)."""
    from transformers import PrinterCallback
    from trl import DPOConfig, DPOTrainer

    output_dir = output_dir or tempfile.mkdtemp(prefix="posttrain-dpo-")
    lora = lora_config(policy.model, settings.lora_rank, settings.lora_alpha)
    policy.model.train()
    with quiet_transformers_warnings():
        config = DPOConfig(**dpo_config_kwargs(settings, learning_rate, output_dir, policy.device,
                                               parameters=parameter_count(policy.model),
                                               world_size=world_size,
                                               bf16=precision.bf16 if precision else None))
        trainer = DPOTrainer(
            model=policy.model,
            ref_model=None,  # with peft_config: the reference is the adapter switched off
            args=config,
            train_dataset=dpo_dataset(pairs),
            processing_class=policy.tokenizer,
            peft_config=lora,
            callbacks=callbacks,
        )
    # our console progress and the run store replace the raw log dicts printed to stdout
    trainer.remove_callback(PrinterCallback)
    return trainer


def train_dpo(context: RecipeContext[DPOSettings], plan: TrainerPlan[DPOSettings]
              ) -> TrainOutcome:
    """The DPO recipe's own step (phase 4 of ``posttrain.train.recipe``): the preference
    pairs (from ``--pairs`` or sampled from the base policy), the DPO trainer run on them
    in the plan's precision, the adapter saved."""
    settings, precision = plan.settings, plan.precision
    learning_rate = context.learning_rate
    if settings.from_run:
        # the policy is the earlier run's adapter merged into its base: keep it, so a
        # third round (or serving) can load it without redoing the merge
        merged = save_policy(context.policy, context.folder.file("merged"))
        context.say(f"round two: merged starting policy saved to {merged}")
    if settings.pairs:
        pairs, report = file_pairs(settings)
    else:
        pairs, report = sample_pairs(context, policy_agent(context))
    export_preference(pairs, context.folder.file("pairs.jsonl"))
    for line in report.describe().splitlines():
        context.say(line)
    context.run.log(0, {"pairs": report.pairs, "constructed_pairs": report.constructed_pairs})
    if report.pairs < settings.batch_size:
        context.say(
            f"! only {report.pairs} pairs for batches of {settings.batch_size}: every step "
            "sees all of them, so expect the adapter to memorise them"
        )
    epochs = settings.steps * settings.batch_size / report.pairs
    sft_weight = settings.resolved_sft_weight()
    sft = f" + {sft_weight:g} x sft" if sft_weight else ""
    context.say(
        f"training: DPO, {settings.steps} steps x {settings.batch_size} pairs "
        f"(~{epochs:.1f} passes over {report.pairs} pairs), loss {settings.loss_type}{sft}, "
        f"beta {settings.resolved_beta(parameter_count(context.policy.model)):g}"
    )
    callbacks = [
        TrainerCallback(context.run, total_steps=settings.steps),
        ConsoleProgress("training", enabled=context.ranks.is_main),
    ]
    trainer = build_dpo_trainer(context.policy, pairs, settings, learning_rate, callbacks,
                                output_dir=settings.trainer_output_dir(context.folder),
                                world_size=context.ranks.world, precision=precision)
    trained = train_and_save(trainer, context)
    return trainer_outcome(trainer, trained,
                           {"pair_report": report.to_dict(), "pairs": report.pairs,
                            "precision": precision.to_dict()})
