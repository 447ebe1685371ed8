"""What the shared recipe flow hands a training step, and what the step hands back.

Its own module so that the flow (``recipe.py``), the evaluations (``measure.py``) and the
trainers (``grpo_trainer.py``, ``dpo_trainer.py``, ``sft_trainer.py``) can all name these
types without importing each other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from posttrain.data.prepare import PreparedData
from posttrain.envs.base import Env
from posttrain.policy.models import Policy
from posttrain.runs.folder import RunFolder
from posttrain.train.distributed import Ranks
from posttrain.train.rewards import RuleReward
from posttrain.train.settings import RecipeSettings


@dataclass
class TrainOutcome:
    """What a recipe's training step hands back to the shared flow."""

    policy: Policy | None  # the trained policy (adapter on), None when nothing was trained
    status: str = "done"  # done | stopped
    stop_reason: str | None = None
    history: list[dict[str, Any]] = field(default_factory=list)  # trainer log history
    alarms: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)  # recipe-specific summary entries


@dataclass
class RecipeContext:
    """Everything the training step may need; built by ``run_recipe``."""

    recipe: str
    settings: RecipeSettings
    env: Env
    data: PreparedData
    folder: RunFolder
    policy: Policy
    learning_rate: float
    run: Any  # RunHandle (or NullRun)
    reward: RuleReward  # the training reward (the environment's rule unless --reward)
    before_rows: list[dict[str, Any]] = field(default_factory=list)  # every base evaluation
    say: Callable[[str], None] = print
    ranks: Ranks = field(default_factory=Ranks)  # this process's place in a launch
