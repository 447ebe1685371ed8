"""Building the demonstrations and running TRL's SFTTrainer for a posttrain run.

The training step ``train_sft``:

1. gets the demonstrations: the environment's reference agent on the *train* prompts
   (``--demos reference``), or ``--demos FILE``; drops every demonstration of a holdout
   scenario or prompt; writes the kept ones to ``demos.jsonl``;
2. trains a fresh LoRA adapter with ``SFTTrainer`` on prompt-completion records (the
   loss is on the replies only);
3. saves ``adapter/`` and hands the trained policy back for the after-evaluation.
"""

from __future__ import annotations

import json
import tempfile
from typing import Any

from posttrain.atomic import write_text_atomic
from posttrain.errors import PosttrainError
from posttrain.policy.model_agent import is_large_model
from posttrain.policy.models import Policy, lora_config
from posttrain.progress import progress_bar
from posttrain.train.callbacks import TrainerCallback
from posttrain.train.console import ConsoleProgress
from posttrain.train.context import RecipeContext, TrainOutcome
from posttrain.train.plan import TrainerPlan
from posttrain.train.precision import PrecisionChoice
from posttrain.train.sft.settings import SFTSettings, sft_config_kwargs
from posttrain.train.training_data.demos import (
    Demo,
    DemoReport,
    distinct_prompts,
    drop_holdout_leaks,
    load_demos,
    reference_demos,
)
from posttrain.train.trl_run import quiet_transformers_warnings, train_and_save, trainer_outcome


def sft_dataset(demos: list[Demo]) -> Any:
    """A ``datasets.Dataset`` of conversational prompt-completion records."""
    from datasets import Dataset

    return Dataset.from_list(
        [{"prompt": demo["prompt"], "completion": demo["completion"]} for demo in demos])


def gather_demos(context: Any, settings: SFTSettings,
                 train: list[dict[str, Any]] | None = None) -> tuple[list[Demo], DemoReport]:
    """The demonstrations this run trains on, holdout leaks removed (see module doc); from
    the reference agent on ``train`` (default: the run's train split)."""
    if settings.uses_reference():
        train = context.data.train if train is None else train
        total = len(train) * settings.demos_per_prompt
        with progress_bar("demos: reference agent", total) as update:
            demos, report = reference_demos(
                context.env, train, settings.demos_per_prompt, seed=settings.seed,
                progress=lambda done, _total: update(done))
    else:
        demos = load_demos(settings.demos)
        report = DemoReport(source=str(settings.demos), read=len(demos))
    demos, report.holdout_leaks = drop_holdout_leaks(demos, context.data.holdout)
    report.kept, report.prompts = len(demos), distinct_prompts(demos)
    if not demos:
        raise PosttrainError(
            f"no demonstration left to train on ({report.describe()}): "
            + ("the reference agent passed none of the train prompts"
               if settings.uses_reference() else
               "give demonstrations of prompts outside the holdout")
        )
    if report.holdout_leaks:
        report.warnings.append(
            f"{report.holdout_leaks} demonstration(s) of holdout prompts were left out")
    return demos, report


def write_demos(demos: list[Demo], path: Any) -> None:
    """The demonstrations as JSONL (atomically): what exactly was trained on."""
    write_text_atomic(path, "".join(json.dumps(demo, ensure_ascii=False) + "\n"
                                    for demo in demos))


def build_sft_trainer(policy: Policy, demos: list[Demo], settings: SFTSettings,
                      learning_rate: float, callbacks: list[Any],
                      output_dir: str | None = None, world_size: int = 1,
                      precision: PrecisionChoice | None = None) -> Any:
    """A ready-to-train ``trl.SFTTrainer`` with a fresh LoRA adapter on ``policy.model``."""
    from transformers import PrinterCallback
    from trl import SFTConfig, SFTTrainer

    output_dir = output_dir or tempfile.mkdtemp(prefix="posttrain-sft-")
    lora = lora_config(policy.model, settings.lora_rank, settings.lora_alpha)
    policy.model.train()
    with quiet_transformers_warnings():
        config = SFTConfig(**sft_config_kwargs(
            settings, learning_rate, output_dir, policy.device, world_size,
            bf16=precision.bf16 if precision else None,
            micro_batch=settings.micro_batch_for(is_large_model(policy), world_size)))
        trainer = SFTTrainer(
            model=policy.model,
            args=config,
            train_dataset=sft_dataset(demos),
            processing_class=policy.tokenizer,
            peft_config=lora,
            callbacks=callbacks,
        )
    trainer.remove_callback(PrinterCallback)
    return trainer


def train_sft(context: RecipeContext[SFTSettings], plan: TrainerPlan[SFTSettings]
              ) -> TrainOutcome:
    """The SFT recipe's own step (phase 4 of ``posttrain.train.recipe``): the
    demonstrations (a file or the environment's reference agent), the SFT trainer run on
    them in the plan's precision, the adapter saved."""
    settings, precision = plan.settings, plan.precision
    demos, report = gather_demos(context, settings)
    write_demos(demos, context.folder.file("demos.jsonl"))
    context.say(report.describe())
    for warning in report.warnings:
        context.run.note(f"demonstrations: {warning}")
    context.run.log(0, {"demos": report.kept, "demo_prompts": report.prompts})
    epochs = settings.steps * settings.batch_size / len(demos)
    micro = settings.micro_batch_for(is_large_model(context.policy), context.ranks.world)
    share = settings.batch_size // context.ranks.world
    in_passes = f"; {micro} per forward/backward pass" if micro < share else ""
    context.say(
        f"training: SFT, {settings.steps} steps x {settings.batch_size} demonstrations "
        f"(~{epochs:.1f} passes over {len(demos)}{in_passes}), loss on the replies only"
    )
    callbacks = [TrainerCallback(context.run, total_steps=settings.steps),
                 ConsoleProgress("training", enabled=context.ranks.is_main)]
    trainer = build_sft_trainer(context.policy, demos, settings, context.learning_rate,
                                callbacks, output_dir=settings.trainer_output_dir(context.folder),
                                world_size=context.ranks.world, precision=precision)
    trained = train_and_save(trainer, context)
    return trainer_outcome(trainer, trained,
                           {"demo_report": report.to_dict(), "demos": report.kept,
                            "precision": precision.to_dict()})
