"""From flags to train and holdout prompts: the data step every recipe shares.

The same seed gives the same prompts and the same holdout (the simulator is
reproducible and the split hashes scenario ids), so two runs that differ only
in training knobs are evaluated on one holdout and compare paired.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from posttrain.data.prompts import (
    balance,
    load_prompts,
    split_holdout,
    split_holdout_stratified,
    summary,
)
from posttrain.envs.base import Env, PromptSets, PromptWriter, env_label, require_hook
from posttrain.errors import PosttrainError
from posttrain.text import folded

# Template situations every command writes by default: ~520 prompts from ~390
# scenarios, so the 20% holdout has ~78 scenarios (at 200 it had 38 and the main
# job's noise band was about ±0.07-0.10; docs/statistics.md).
DEFAULT_SITUATIONS = 400


@dataclass(frozen=True)
class DataConfig:
    """Where prompts come from and how they are split (the data step's input; the flags
    that fill it are ``DataFlags``)."""

    prompts: int = DEFAULT_SITUATIONS  # template situations to write prompts from
    prompts_file: str | None = None  # a JSONL prompt set instead
    seed: int = 0  # the template writer's seed (the flag is --data-seed)
    holdout: float = 0.2  # share of scenarios held out
    holdout_set: str | None = None  # a prompt set the environment ships, held out whole
    balance: float = 0.0  # repeat minority train categories up to this share
    stratify: bool | None = None  # split within each category; default: only for a file


@dataclass
class DataFlags:
    """The data flags, declared once: every recipe's settings inherit them, and ``posttrain
    eval`` and ``posttrain pairs build`` generate the same flags from this class
    (``posttrain.commands.dataclass_args``). Fields with ``help`` become flags."""

    prompts: int = field(
        default=DEFAULT_SITUATIONS,
        metadata={"help": "template situations to write prompts from",
                  "range": (None, 10_000_000)},
    )
    prompts_file: str | None = field(
        default=None, metadata={"help": "a JSONL prompt set instead of the template writer"}
    )
    holdout: float = field(
        default=0.2,
        metadata={
            "help": "share of scenarios held out; stratified by category when --prompts-file "
            "is given"
        },
    )
    holdout_set: str | None = field(
        default=None,
        metadata={
            "help": "evaluate on a prompt set the environment ships, by name, instead of a "
            "share of the prompts (refund: refund-holdout, 477 prompts); every written "
            "prompt then trains",
            "metavar": "NAME",
        },
    )
    balance: float = field(
        default=0.0,
        metadata={"help": "repeat minority-category train prompts up to this share"},
    )
    data_seed: int = field(
        default=0,
        metadata={
            "help": "data seed: the prompts the template writer writes and so the holdout; "
            "runs with the same data seed are evaluated on the same holdout prompts"
        },
    )

    def data_config(self) -> DataConfig:
        """The data step's input from these flags."""
        return DataConfig(
            prompts=self.prompts,
            prompts_file=self.prompts_file,
            seed=self.data_seed,
            holdout=self.holdout,
            holdout_set=self.holdout_set,
            balance=self.balance,
        )


@dataclass
class PreparedData:
    """Train and holdout prompt records plus what a person needs to check them."""

    train: list[dict[str, Any]]
    holdout: list[dict[str, Any]]
    source: str
    split: str

    def counts(self) -> dict[str, dict[str, int]]:
        """``{"train": summary, "holdout": summary}`` (prompts, scenarios, per category)."""
        return {"train": summary(self.train), "holdout": summary(self.holdout)}

    def describe(self, categories: tuple[str, ...] = ()) -> str:
        """Two readable lines: the source and the split with counts per category
        (``categories`` first, in their order: the environment's; then any other)."""
        lines = [f"prompts: {self.source}"]
        for side, records in (("train", self.train), ("holdout", self.holdout)):
            counts = summary(records)
            present = {r["category"] for r in records}
            order = [*[c for c in categories if c in present],
                     *sorted(present.difference(categories))]
            per_category = ", ".join(f"{name} {counts[name]}" for name in order)
            lines.append(
                f"  {side:<8}{counts['prompts']:>5} prompts, {counts['scenarios']:>4} scenarios"
                f"  ({per_category})"
            )
        return "\n".join(lines)


#: the seeds numpy (and so transformers' set_seed) accepts
MAX_SEED = 2**32 - 1


def check_seed(flag: str, value: object) -> None:
    """Refuse a seed numpy cannot take (it would stop a run after the model loaded)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SEED:
        raise PosttrainError(f"{flag} must be an integer from 0 to 2**32 - 1, got {value}")


def check_data_config(config: DataConfig) -> None:
    """Refuse data flags no split can use, before anything loads or is written."""
    if not (math.isfinite(config.balance) and 0 <= config.balance < 1):
        raise PosttrainError(f"--balance must be a share in [0, 1), got {config.balance}")
    if not config.prompts_file and config.prompts < 1:
        raise PosttrainError(f"--prompts must be at least 1, got {config.prompts}")
    if not 0.0 < config.holdout < 1.0:
        raise PosttrainError(f"--holdout must be between 0 and 1, got {config.holdout}")
    check_seed("--data-seed", config.seed)


def prepare_data(config: DataConfig, env: Env, need_holdout: bool = True) -> PreparedData:
    """Build or load the prompt set, split a holdout by scenario, balance the train side.

    Raises ``PosttrainError`` for a flag out of range (``check_data_config``) and when
    the holdout (unless ``need_holdout`` is False: ``eval --split all`` of a small set) or
    the train side comes out empty, naming the flag to change.
    """
    check_data_config(config)
    named = None if config.holdout_set is None else named_prompt_set(env, config.holdout_set)
    if config.prompts_file:
        records = load_prompts(config.prompts_file, env=env)
        source = f"{config.prompts_file} ({len(records)} prompts)"
    else:
        writer = require_hook(env, PromptWriter, "writes no prompts", "give --prompts-file")
        records = writer.write_prompts(config.prompts, seed=config.seed)
        source = f"template simulator, {config.prompts} situations, seed {config.seed}"
        if len(records) < config.prompts:  # a writer over a fixed dataset (verifiers, inspect)
            source = (f"the environment's {len(records)} prompts ({config.prompts} asked), "
                      f"seed {config.seed}")
    if named is not None:
        return _with_named_holdout(config, records, source, named)
    stratify = bool(config.prompts_file) if config.stratify is None else config.stratify
    if stratify:
        if not any(
            len({r["scenario_id"] for r in records if r["category"] == name}) >= 2
            for name in {r["category"] for r in records}
        ):
            raise PosttrainError(
                "no category has two or more scenarios, so nothing can be held out by "
                "scenario: give prompts distinct scenario_id values (or more prompts)"
            )
        train, holdout = split_holdout_stratified(records, config.holdout)
    else:
        train, holdout = split_holdout(records, config.holdout)
    if not holdout and need_holdout:
        raise PosttrainError(
            f"the holdout is empty after splitting {len(records)} prompts at --holdout "
            f"{config.holdout}: raise --holdout or --prompts"
        )
    if not train:
        raise PosttrainError("every prompt landed in the holdout: lower --holdout")
    if config.balance > 0:
        train = balance(train, config.balance)
    return PreparedData(
        train=train,
        holdout=holdout,
        source=source,
        split="stratified by category, then scenario" if stratify else "hash of scenario id",
    )


def named_prompt_set(env: Env, name: str) -> list[dict[str, Any]]:
    """The records of a prompt set the environment ships (its ``prompt_sets`` hook), or a
    ``PosttrainError`` that lists the names it has."""
    sets = require_hook(env, PromptSets, "ships no named prompt sets",
                        "split the holdout from the prompts with --holdout instead").prompt_sets()
    if name not in sets:
        shipped = ", ".join(sorted(sets)) or "none"
        raise PosttrainError(
            f"--holdout-set {name!r}: environment {env_label(env)} ships no "
            f"prompt set of that name (it ships: {shipped})"
        )
    return load_prompts(sets[name], env=env)


def _with_named_holdout(config: DataConfig, records: list[dict[str, Any]], source: str,
                        holdout: list[dict[str, Any]]) -> PreparedData:
    """Every written prompt trains and the named set is the holdout, whole; a train
    prompt that shares a scenario id or its text with the set is dropped, so nothing
    the holdout measures was trained on."""
    name = config.holdout_set
    scenarios = {str(r["scenario_id"]) for r in holdout}
    texts = {folded(r["prompt"]) for r in holdout}
    train = [r for r in records
             if str(r["scenario_id"]) not in scenarios and folded(r["prompt"]) not in texts]
    dropped = len(records) - len(train)
    if not train:
        raise PosttrainError(
            f"every prompt is also in the holdout set {name!r}: give other prompts to train on"
        )
    if config.balance > 0:
        train = balance(train, config.balance)
    split = f"holdout: the shipped set {name!r}, whole; train: every other prompt"
    if dropped:
        split += f" ({dropped} dropped as they are in the set)"
    return PreparedData(train=train, holdout=holdout,
                        source=f"{source}; holdout set {name!r} ({len(holdout)} prompts)",
                        split=split)
