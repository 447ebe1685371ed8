"""The GRPO step: TRL's GRPOTrainer built and run for a posttrain run (``train_grpo``).

The route that calls it is ``run.py`` (the recipe's phases, ``posttrain.train.recipe``);
kept apart so the route stays readable and the TRL-specific parts (dataset columns,
config, callbacks, rollouts, the hack monitor) sit in one place.
"""

from __future__ import annotations

import json
import tempfile
from typing import Any

from posttrain.envs.base import Env, case_of, is_multi_turn, reads_records
from posttrain.policy.model_agent import default_batch_size, is_large_model
from posttrain.policy.models import Policy, lora_config
from posttrain.policy.tool_turns import enable_tool_turns
from posttrain.train.callbacks import TrainerCallback
from posttrain.train.console import ConsoleProgress
from posttrain.train.context import RecipeContext, TrainOutcome
from posttrain.train.grpo.monitor import HackMonitor, MonitorSettings
from posttrain.train.grpo.plan import GRPOPlan
from posttrain.train.grpo.rollout import DeadGroupRedraw, RolloutChoice, posttrain_rollout
from posttrain.train.grpo.settings import (
    GRPOSettings,
    gold_judge,
    grpo_config_kwargs,
)
from posttrain.train.grpo.shared_prefix import SharedPrefixChoice, share_prompt_prefix
from posttrain.train.grpo.signal_watch import SignalWatch
from posttrain.train.grpo.step_phases import phase_shares, phases_line, time_phases
from posttrain.train.measure import evaluation_sampling
from posttrain.train.precision import PrecisionChoice
from posttrain.train.rewards import RuleReward
from posttrain.train.trl_run import quiet_transformers_warnings, train_and_save, trainer_outcome


def grpo_dataset(env: Env, records: list[dict[str, Any]]) -> Any:
    """A ``datasets.Dataset`` of conversational prompts plus the columns the reward reads."""
    from datasets import Dataset

    return Dataset.from_list(
        [
            {
                "prompt": env.messages_for(record["prompt"]),
                "prompt_text": record["prompt"],
                "scenario_id": str(record["scenario_id"]),
                # ground truth from prompt-file columns, for the reward, and the episode's
                # for a multi-turn environment's desk (JSON text: one column type)
                **({"case": json.dumps(case_of(env, record))}
                   if reads_records(env) or is_multi_turn(env) else {}),
            }
            for record in records
        ]
    )


def build_grpo_trainer(
    policy: Policy,
    env: Env,
    train_records: list[dict[str, Any]],
    settings: GRPOSettings,
    learning_rate: float,
    callbacks: list[Any],
    reward: RuleReward,
    output_dir: str | None = None,
    world_size: int = 1,
    rollout: RolloutChoice | None = None,
    precision: PrecisionChoice | None = None,
    shared_prefix: SharedPrefixChoice | None = None,
    redraw: DeadGroupRedraw | None = None,
) -> Any:
    """A ready-to-train ``trl.GRPOTrainer`` with a fresh LoRA adapter on ``policy.model``;
    ``rollout`` says what samples its completions (TRL's generate by default),
    ``shared_prefix`` whether its update runs the prompts' shared head once per pass
    (``posttrain.train.grpo.shared_prefix``; off by default), ``redraw`` whether
    posttrain's rollout draws dead groups again (``--resample-dead-groups``)."""
    from transformers import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    output_dir = output_dir or tempfile.mkdtemp(prefix="posttrain-grpo-")
    episode_kwargs: dict[str, Any] = {}
    max_turns = None
    if is_multi_turn(env):
        # TRL's own tool loop plays the episodes: the desk class as environment_factory,
        # tool results masked out of the loss (reference/multiturn-spike.md)
        enable_tool_turns(policy.tokenizer, policy.name)
        episode_kwargs["environment_factory"] = env.trl_environment()
        max_turns = env.max_turns
    elif rollout is not None and rollout.name == "posttrain":
        episode_kwargs["rollout_func"] = posttrain_rollout(
            policy, temperature=settings.temperature, top_p=settings.top_p,
            max_completion_length=settings.completion_budget(), seed=settings.seed,
            batch_size=default_batch_size(policy), redraw=redraw)
    with quiet_transformers_warnings():  # the config itself warns about checkpointing
        config = GRPOConfig(
            **grpo_config_kwargs(settings, learning_rate, output_dir, policy.device,
                                 max_turns=max_turns,
                                 world_size=world_size,
                                 micro_batch=settings.micro_batch_for(
                                     is_large_model(policy), world_size,
                                     shared_prefix=bool(shared_prefix and shared_prefix.on)),
                                 bf16=precision.bf16 if precision else None)
        )
    lora = lora_config(policy.model, settings.lora_rank, settings.lora_alpha)
    # the sampler pads on the left for generation; TRL handles its own padding
    policy.model.train()
    with quiet_transformers_warnings():
        trainer = GRPOTrainer(
            model=policy.model,
            reward_funcs=reward,
            args=config,
            train_dataset=grpo_dataset(env, train_records),
            processing_class=policy.tokenizer,
            peft_config=lora,
            callbacks=callbacks,
            **episode_kwargs,
        )
    # our console progress and the run store replace the raw log dicts printed to stdout
    trainer.remove_callback(PrinterCallback)
    # generation_time and the other phases beside TRL's step_time: generation dominates a
    # GRPO step (the field's first complaint, and the reason for --use-vllm), and TRL
    # reports its own profiling only to wandb/mlflow/trackio
    time_phases(trainer)
    if shared_prefix is not None and shared_prefix.on:
        share_prompt_prefix(trainer)
    return trainer


def generation_share(history: list[dict[str, Any]]) -> float | None:
    """Seconds generating over seconds stepping, over the whole run (None if not logged)."""
    generating = sum(entry["generation_time"] for entry in history
                     if isinstance(entry.get("generation_time"), (int, float)))
    stepping = sum(entry["step_time"] for entry in history
                   if isinstance(entry.get("step_time"), (int, float)))
    return round(generating / stepping, 4) if generating and stepping else None


def train_grpo(context: RecipeContext[GRPOSettings], plan: GRPOPlan) -> TrainOutcome:
    """The GRPO recipe's own step (phase 4 of ``posttrain.train.recipe``): the GRPO
    trainer built on the policy as the run's plan says (``plan.py``: its settings, its
    train prompts, its rollouts, precision and shared prefix), run with the console, the
    run store, the no-signal watch and the hack monitor; the adapter saved; what the run
    measured about its steps."""
    settings, reward = plan.settings, context.reward
    train = list(plan.train)
    store_callback = TrainerCallback(context.run, total_steps=settings.steps)
    signal_watch = SignalWatch(context.run, reward=reward,
                               stop_when_solved=settings.stop_when_solved, ranks=context.ranks,
                               trained_before=(plan.cold_start.run
                                               or settings.from_run is not None),
                               categories=frozenset(
                                   str(context.env.category(case_of(context.env, record)))
                                   for record in train))
    main = context.ranks.is_main
    callbacks: list[Any] = [store_callback, ConsoleProgress("training", enabled=main),
                            signal_watch]
    monitor = None
    # the monitor samples the holdout on the main process only (local work, no collective:
    # the other processes wait for it at the next step's gather)
    if settings.monitor_every > 0 and main:
        monitor = HackMonitor(
            env=context.env,
            policy=context.policy,
            holdout=context.data.holdout,
            reward=reward,
            run=context.run,
            settings=MonitorSettings(
                every=settings.monitor_every,
                stop_on=settings.stop_on_alarms(),
                seed=settings.seed,
                eval_seed=settings.eval_seed,
            ),
            sampling=evaluation_sampling(settings, context.policy),
            baseline_rows=context.before_rows,
            gold=gold_judge(settings, context.env) if settings.gold_endpoint else None,
        )
        callbacks.append(monitor)
    redraw = (DeadGroupRedraw.for_run(settings.resample_dead_groups, context.env, train,
                                      reward.score_reply)
              if settings.resample_dead_groups else None)
    context.say(
        f"training: GRPO, {settings.steps} steps x {settings.completions_per_step()} completions "
        f"({settings.num_generations} per prompt), loss {settings.loss_type}, beta {settings.beta}"
    )
    trainer = build_grpo_trainer(
        context.policy,
        context.env,
        train,
        settings,
        context.learning_rate,
        callbacks,
        reward,
        output_dir=settings.trainer_output_dir(context.folder),
        world_size=context.ranks.world,
        rollout=plan.rollout,
        precision=plan.precision,
        shared_prefix=plan.shared_prefix,
        redraw=redraw,
    )
    trained = train_and_save(trainer, context)
    stopped_by = monitor.stopped_by if monitor else None
    stop_line = signal_watch.stop_line(settings.steps)
    if stop_line:
        context.say(stop_line)
        context.run.note(stop_line)
    signal_line = signal_watch.describe()
    if signal_line:
        context.say(signal_line)
    if redraw is not None:
        context.say(redraw.count.words())
    history = trainer.state.log_history
    share = generation_share(history)
    if share is not None:
        context.say(f"generation took {share:.0%} of the training steps' time"
                    + ("" if settings.use_vllm else " (--use-vllm speeds it up on a GPU)"))
    shares = phase_shares(history)
    if shares is not None:
        context.say(phases_line(shares))
    # what TRL saw goes in too (trainer_outcome): 2 under torchrun, or the launch fell
    # apart into copies
    return trainer_outcome(
        trainer,
        trained,
        {"monitor": monitor.summary() if monitor else None,
         "signal": signal_watch.summary(),
         "generation_share": share,
         "step_phases": shares,
         "rollout": {"sampler": plan.rollout.name, "reason": plan.rollout.reason},
         "precision": plan.precision.to_dict(),
         "shared_prefix": {"on": plan.shared_prefix.on, "reason": plan.shared_prefix.reason},
         "dynamic_sampling": redraw.count.to_dict() if redraw is not None else None},
        stop_reason=stopped_by,
        alarms=[*(monitor.alarms if monitor else []), *signal_watch.alarms],
    )
