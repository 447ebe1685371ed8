"""What the recipe's phases hand a training step, and what the step hands back.

Its own module so that the phases (``recipe.py``), the evaluations (``measure.py``) and the
trainers (``grpo/trainer.py``, ``dpo/trainer.py``, ``sft/trainer.py``) can all name these
types without importing each other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from posttrain.data.prepare import PreparedData
from posttrain.envs.base import Env
from posttrain.policy.models import Policy
from posttrain.runs.folder import NewRun, RunFolder
from posttrain.score.audit import RewardAudit
from posttrain.train.distributed import Ranks
from posttrain.train.rewards import RuleReward
from posttrain.train.settings import RecipeSettings

#: a recipe's own settings class (GRPOSettings, DPOSettings, SFTSettings)
SettingsT = TypeVar("SettingsT", bound=RecipeSettings)


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
class RecipeContext(Generic[SettingsT]):
    """Everything the training step may need; built by ``posttrain.train.recipe.load``
    (``RecipeContext[GRPOSettings]`` for a GRPO run: its step reads its own settings)."""

    recipe: str
    settings: SettingsT
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
    # seconds per phase, in the order the report prints them (data_s, load_s, ...), and
    # when the run started (time.monotonic())
    timings: dict[str, float] = field(default_factory=dict)
    started: float = 0.0
    audit: RewardAudit | None = None  # the training reward's audit (the baseline phase's)
    # the main process's hold on the run's name and folder, let go when the run finishes
    claim: NewRun | None = None
