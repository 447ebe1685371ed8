"""The supervised cold start a GRPO run may begin with (``--cold-start none|auto|sft``).

GRPO learns only from groups whose replies score differently. A real model that never
does what the rule pays for on some kind of prompt (SmolLM2-135M never calls the refund
tool: none of its with-id replies pass, every group scores alike) gives RL nothing to
reinforce there. The field's answer, and ours, is a short supervised run on the
environment's reference agent first, in the same run:

1. ``cold_start_choice.choose_cold_start`` reads the base policy's first holdout
   evaluation and says whether to cold-start, and why: part of the run's plan
   (``plan.py``), with the shape (``cold_start_shape``) and the precision;
2. ``run_cold_start(context, plan)``: SFT with a fresh LoRA adapter on the reference agent's passing
   replies to the *train* prompts (``posttrain.train.sft``'s trainer and data), the
   adapter merged into the policy (saved as ``merged/``, where ``--from-run`` looks), the
   merged policy evaluated on the holdout like the base was. RL then starts from it, and
   the report gives each phase its own delta (base -> cold start, cold start -> after RL).
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field, replace
from typing import Any

from posttrain.data.prompts import balance
from posttrain.policy.models import merge_adapter, parameter_count, save_policy
from posttrain.train.console import ConsoleProgress
from posttrain.train.context import RecipeContext
from posttrain.train.fused_head import labelled_positions_only
from posttrain.train.grpo.cold_start_check import ColdStartCheck, check_prompts, first_check_step
from posttrain.train.grpo.cold_start_hint import tool_openings
from posttrain.train.grpo.cold_start_self import (
    SelfMining,
    SelfRound,
    anchor_categories,
    anchored,
    keep_passing,
    mined_categories,
    mining_prompts,
    round_steps,
    sample_round,
    unfound,
)
from posttrain.train.grpo.plan import GRPOPlan
from posttrain.train.measure import PolicyEvaluation, evaluate_policy, evaluation_sampling
from posttrain.train.recipe import say_guards
from posttrain.train.settings import rate_for_size
from posttrain.train.sft.settings import SFTSettings
from posttrain.train.sft.trainer import build_sft_trainer, gather_demos, write_demos
from posttrain.train.training_data.demos import Demo
from posttrain.train.trl_run import quiet_transformers_warnings

#: The cold start's LoRA rates by model size. Measured on SmolLM2-135M (refund rule, 60
#: steps x 8 of the reference agent's replies): at SFT's 2e-4 it learned *to* call the
#: tool, not *when* (76% of no-id prompts call it), and RL from there drifted the one
#: shared habit; at 5e-4 it learned when (0.99 after 60 steps; 40 steps leave RL room:
#: with_id 0.61, no_id 0.55 calling the tool on 7% of them). The starters keep SFT's 1e-3;
#: the larger sizes are SFT's rates, not measured for a cold start (benchmarks/RESULTS.md,
#: "RL that moves real weights").
COLD_START_LEARNING_RATE_BY_SIZE = ((10e6, 1e-3), (50e6, 5e-4), (300e6, 5e-4), (1e9, 5e-5))
COLD_START_LARGE_MODEL_LEARNING_RATE = 2e-5


def cold_start_learning_rate(settings: Any, parameters: int) -> float:
    """``--cold-start-learning-rate``, else the rate for the model's size (table above)."""
    return settings.cold_start_learning_rate or rate_for_size(
        COLD_START_LEARNING_RATE_BY_SIZE, COLD_START_LARGE_MODEL_LEARNING_RATE, parameters)


def cold_start_settings(settings: Any) -> SFTSettings:
    """The SFT settings of a GRPO run's cold start: SFT's defaults (two reference replies
    per train prompt, steps of 8), the run's own environment, seed and precision,
    ``--cold-start-steps`` steps. The data is the run's own (its train prompts)."""
    return SFTSettings(steps=settings.cold_start_steps, env=settings.env, seed=settings.seed,
                       precision=settings.precision, base_model=settings.base_model,
                       report_to=settings.report_to)


@dataclass
class ColdStart:
    """What the cold start did: its evaluation (RL's baseline), what it trained on, and
    its checks of ``--cold-start-until`` (``cold_start_check``)."""

    evaluation: PolicyEvaluation
    demos: int
    steps: int
    learning_rate: float
    loss: float | None
    check: dict[str, Any] | None = None
    #: ``--cold-start self``'s rounds (``SelfMining.to_dict``)
    mining: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"demos": self.demos, "steps": self.steps, "learning_rate": self.learning_rate,
                "final_loss": self.loss, **({"check": self.check} if self.check else {}),
                **({"self": self.mining} if self.mining else {})}


def until_check(context: RecipeContext[Any], settings: Any) -> ColdStartCheck:
    """The callback that ends the cold start once the train sample passes at the mark."""
    return ColdStartCheck(
        env=context.env, prompts=check_prompts(context.env, context.data.train, settings.seed),
        policy=context.policy, sampling=evaluation_sampling(settings, context.policy),
        steps=settings.cold_start_steps, until=settings.cold_start_until,
        every=settings.cold_start_check_every, seed=settings.eval_seed, ranks=context.ranks,
        say=context.say)


def run_cold_start(context: RecipeContext[Any], plan: GRPOPlan,
                   base: PolicyEvaluation) -> ColdStart:
    """The plan's cold start: SFT on the reference agent's replies to the train prompts,
    or (``--cold-start self``) on the policy's own passing replies, round by round
    (``cold_start_self``); merged into ``context.policy`` (saved as ``merged/``), then
    evaluated on the holdout ``eval_repeats`` times; ``context.before_rows`` becomes those
    rows, RL's baseline. The settings (steps, early stop, balance, rate) and the precision
    are the plan's. ``base`` is the base's evaluation: a self cold start that keeps
    nothing leaves the policy as it was, and the base's rows stand for its own."""
    if plan.cold_start.source == "self":
        return self_cold_start(context, plan, base)
    settings = plan.settings
    sft = cold_start_settings(settings)
    train = context.data.train
    if settings.cold_start_balance > 0:  # the demonstrations only: RL's mix is --balance's
        train = balance(train, settings.cold_start_balance)
    # then SFT's own parts: the demonstrations, the trainer's arithmetic, the trainer
    demos, report = gather_demos(context, sft, train)
    write_demos(demos, context.folder.file("cold_start_demos.jsonl"))
    context.say(f"cold start: {report.describe()}")
    tuned = fine_tune(context, plan, demos, sft.steps)
    return finish_cold_start(context, report.kept, tuned, repeats=settings.eval_repeats,
                             learning_rate=tuned.learning_rate or 0.0)


def self_cold_start(context: RecipeContext[Any], plan: GRPOPlan,
                    base: PolicyEvaluation) -> ColdStart:
    """``--cold-start self`` (``cold_start_self``): rounds of sampling the train prompts
    of the categories the base does not pass, keeping what the rule passes and
    fine-tuning on it, while a round finds replies it had not."""
    settings = plan.settings
    categories = mined_categories(plan.cold_start.signal)
    records = mining_prompts(list(context.data.train), categories, settings.cold_start_prompts)
    openings = tool_openings(context.env) if settings.cold_start_hint == "tools" else []
    hint = (f"; where none passes in a category, as many again with the reply opened by a "
            f"call of one of its {len(openings)} tools" if openings else "")
    context.say(f"cold start (self): {settings.cold_start_samples} samples at temperature "
                f"{settings.cold_start_temperature:g} of each of {len(records)} train prompts "
                f"({', '.join(categories)}) a round, up to {settings.cold_start_rounds} rounds"
                f"{hint}")
    mining = SelfMining(categories)
    demos: list[Demo] = []
    seen: set[tuple[str, str]] = set()
    anchors = find_anchors(context, settings, plan, categories, seen, mining)
    tuned = FineTuning()
    batch = cold_start_settings(settings).batch_size
    for index in range(1, settings.cold_start_rounds + 1):
        rows = sample_round(context, settings, records, index)
        # a category the plain samples found nothing in is sampled again, each reply
        # opened by a call of one of the environment's tools (cold_start_hint)
        empty = unfound(rows, categories) if openings else []
        if empty:
            rows += sample_round(context, settings, [record for record in records
                                                     if record.get("category") in empty],
                                 index, openings)
        finds = keep_passing(context, rows, categories, seen, demos)
        entry = SelfRound(index, finds)
        mining.rounds.append(entry)
        context.say(f"cold start (self): round {index}: "
                    + "; ".join(find.words() for find in finds))
        if not any(find.new for find in finds):
            break  # the policy finds nothing it had not: more rounds would add nothing
        trained = anchored(demos, anchors, len(categories))
        entry.kept, entry.steps = len(trained), round_steps(settings, len(trained), batch)
        tuned = tuned.then(fine_tune(context, plan, trained, entry.steps))
    trained = anchored(demos, anchors, len(categories))  # what the last round trained on
    write_demos(trained, context.folder.file("cold_start_demos.jsonl"))
    nothing = mining.nothing_in()
    if not demos:
        context.say("cold start (self): no reply passed in any category: the policy is "
                    "unchanged, and RL runs from the base")
        # nothing trained, nothing to save: the base's evaluations are this policy's, and
        # only the repeats the base did not take are sampled (minutes of a real model)
        cold = settle_cold_start(context, unchanged_evaluation(
            context, base, repeats=settings.eval_repeats), demos=0, tuned=tuned,
            learning_rate=cold_start_learning_rate(settings,
                                                   parameter_count(context.policy.model)))
        cold.mining = mining.to_dict()
        return cold
    if nothing:
        context.say(f"cold start (self): nothing passed in the budget for "
                    f"{', '.join(nothing)}; RL trains on the rest")
    cold = finish_cold_start(context, len(trained), tuned, repeats=settings.eval_repeats,
                             learning_rate=tuned.learning_rate or 0.0)
    cold.mining = mining.to_dict()
    return cold


def find_anchors(context: RecipeContext[Any], settings: Any, plan: GRPOPlan,
                 mined: list[str], seen: set[tuple[str, str]], mining: SelfMining
                 ) -> list[Demo]:
    """The anchors (``cold_start_self``): ``--cold-start-anchor-samples`` replies to each
    of up to ``--cold-start-prompts`` train prompts of every category the base passes,
    sampled once from the base, the passing ones kept (said, and noted in ``mining``)."""
    names = anchor_categories(plan.cold_start.signal, mined)
    if not names or not settings.cold_start_anchor_samples:
        return []
    records = mining_prompts(list(context.data.train), names, settings.cold_start_prompts)
    rows = sample_round(context, replace(settings,
                                         cold_start_samples=settings.cold_start_anchor_samples),
                        records, 0)
    found: list[Demo] = []
    mining.anchors = keep_passing(context, rows, names, seen, found)
    context.say("cold start (self): anchors, to hold what the base passes: "
                + "; ".join(find.words() for find in mining.anchors)
                + " (as many a category as a mined category has join each round's "
                "demonstrations)")
    return found


@dataclass
class FineTuning:
    """What the cold start's fine-tuning did (every round of it, for ``self``)."""

    steps: int = 0
    losses: list[float] = field(default_factory=list)
    learning_rate: float | None = None
    check: ColdStartCheck | None = None

    def then(self, later: FineTuning) -> FineTuning:
        return FineTuning(self.steps + later.steps, self.losses + later.losses,
                          later.learning_rate, later.check)


def fine_tune(context: RecipeContext[Any], plan: GRPOPlan, demos: list[Demo],
              steps: int) -> FineTuning:
    """SFT with a fresh LoRA adapter on ``demos`` for ``steps`` steps (fewer when the
    ``--cold-start-until`` check stops it), merged into ``context.policy``."""
    settings = plan.settings
    sft = replace(cold_start_settings(settings), steps=steps)
    learning_rate = cold_start_learning_rate(settings, parameter_count(context.policy.model))
    check = until_check(context, replace(settings, cold_start_steps=steps))
    precision = plan.precision
    until = (f"; stops once a train sample passes at {check.until:g} in every category "
             f"(checked every {check.every} steps from step "
             f"{first_check_step(check.steps, check.every)})" if check.active else "")
    context.say(f"cold start: SFT, {'up to ' if check.active else ''}{sft.steps} steps x "
                f"{sft.batch_size} demonstrations, "
                f"learning rate {learning_rate:g}, trainer in {precision.words()}{until}")
    scratch = tempfile.mkdtemp(prefix="posttrain-cold-start-")
    try:
        trainer = build_sft_trainer(
            context.policy, demos, sft, learning_rate,
            [ConsoleProgress("cold start", enabled=context.ranks.is_main), check],
            output_dir=scratch, world_size=context.ranks.world, precision=precision)
        with quiet_transformers_warnings(), labelled_positions_only():
            trainer.train()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    # the adapter merged into the weights: RL's fresh adapter trains on top of it, and its
    # KL reference (the adapter switched off) is the cold-started policy
    context.policy = merge_adapter(replace(context.policy, model=trainer.model,
                                           adapter="cold start"))
    return FineTuning(check.stopped_at or sft.steps, losses, learning_rate,
                      check if check.active else None)


def finish_cold_start(context: RecipeContext[Any], demos: int, tuned: FineTuning, *,
                      repeats: int, learning_rate: float) -> ColdStart:
    """The cold-started policy saved (``merged/``) and evaluated on the holdout
    ``repeats`` times: RL's baseline, and the guards read on it. (Handed what it needs of
    the settings, not the settings: the route from the run to its step stays short.)"""
    trained = context.policy
    if context.ranks.is_main:
        save_policy(trained, context.folder.file("merged"))
    evaluation = evaluate_policy(context, trained, repeats=repeats,
                                 label="cold start: evaluating holdout")
    return settle_cold_start(context, evaluation, demos=demos, tuned=tuned,
                             learning_rate=learning_rate)


def unchanged_evaluation(context: RecipeContext[Any], base: PolicyEvaluation, *,
                         repeats: int) -> PolicyEvaluation:
    """``repeats`` holdout evaluations of a policy the cold start left as it was: the
    base's own (the same policy and seeds give the same rows), and the later repeats the
    base did not take (GRPO's plan takes one when it cold-starts) sampled from where its
    own stopped. ``seconds`` is the new sampling's alone."""
    kept = base.runs[:repeats]
    if len(kept) >= repeats:
        return PolicyEvaluation(runs=kept, seconds=0.0)
    more = evaluate_policy(context, context.policy, repeats=repeats - len(kept),
                           first_repeat=len(kept),
                           label="cold start: evaluating holdout (the base's later repeats)")
    return PolicyEvaluation(runs=[*kept, *more.runs], seconds=more.seconds)


def settle_cold_start(context: RecipeContext[Any], evaluation: PolicyEvaluation, *,
                      demos: int, tuned: FineTuning, learning_rate: float) -> ColdStart:
    """The cold start's evaluation made RL's baseline (``context.before_rows``, written as
    ``holdout_cold_start.jsonl``), said with the guards it allows."""
    context.before_rows = evaluation.rows
    context.folder.write_rows("holdout_cold_start.jsonl", evaluation.rows)
    context.say(f"cold start  {evaluation.describe()}")
    say_guards(context, evaluation.rows)  # RL's verdict guards against these rows
    return ColdStart(evaluation, demos=demos, steps=tuned.steps, learning_rate=learning_rate,
                     loss=tuned.losses[-1] if tuned.losses else None,
                     check=tuned.check.to_dict() if tuned.check is not None else None)
