"""How a GRPO run's cold start and the RL after it are shaped (``--cold-start-shape
full|light|auto``), chosen from the same base rows as the cold start itself.

Measured on SmolLM2-135M (benchmarks/RESULTS.md, "RL that moves real weights"), two kinds
of base policy want two different cold starts:

- **full** (the defaults: ``--cold-start-steps 40``, no early stop, the train split as it
  is, RL at temperature 0.8 with beta 0.04). On the refund rule the base never passes a
  with-id prompt, but its with-id replies score differently (asking for the id earns part
  of the reward: 15 of 62 groups alike). A full cold start there leaves RL room, and RL
  moved on training seeds 0, 1 and 2 (G, I, F). The light shape moved less there and took
  33 minutes (J).
- **light** (``LIGHT_SHAPE``: up to 30 steps, stopped once every category passes at 0.3,
  demonstrations and RL's prompts balanced to 0.33 a category, RL sampled at 1.2 with
  beta 0.2). On the library example every group of the categories the base never passes
  scored alike (34 of 34, 25 of 25): the move is absent, not partial. A full cold start
  learned it outright (1.00 / 1.00 / 0.95) and left RL nothing to do (LA, flat); an early
  stop alone left chitchat to fall (LE, LI); the balanced demonstrations and RL prompts
  with a firmer KL moved one seed (LJ) but not another, whose near-deterministic policy
  (0.015 nats a token) gave RL 80% all-equal groups (LK); sampling RL at 1.2 moved all
  three training seeds with no category down (LM, LL, LN).

``auto`` (the default) is ``light`` when a cold start runs and some category the base
never passes scored every one of its groups alike, else ``full``. "Every group" counts only
from ``MIN_GROUPS`` groups on: with fewer (the suite's tiny configs: 3 prompts, 2 replies
each) the run keeps ``full`` and says which counts were too few. A setting the user gave
(on the command line, in ``--config``, or a value other than the field's default) is never
replaced; the run says which it kept. The run's plan (``plan.py``) applies the shape: this
module changes no run.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from posttrain.data.prompts import balance
from posttrain.train.grpo.cold_start_choice import ColdStartChoice

COLD_START_SHAPES = ("auto", "full", "light")

#: the fewest groups (one prompt's replies in one evaluation) of a category before "every
#: group scored alike" says the move is absent (the library base: 34 of 34 and 25 of 25)
MIN_GROUPS = 10

#: The light shape's settings (benchmarks/RESULTS.md, LL, LM, LN).
LIGHT_SHAPE: dict[str, float | int] = {
    "cold_start_steps": 30,
    "cold_start_until": 0.3,
    "cold_start_balance": 0.33,
    "balance": 0.33,
    "beta": 0.2,
    "temperature": 1.2,
}


@dataclass
class ColdStartShape:
    """The shape this run takes, why, and what it changed (said and recorded)."""

    name: str  # full or light
    reason: str
    applied: dict[str, Any] = field(default_factory=dict)  # setting -> value it now has
    kept: list[str] = field(default_factory=list)  # the user's own settings it left alone

    def changes(self) -> str:
        """What the shape set and what it kept: "sets --beta 0.2; keeps your --balance"."""
        changed = ", ".join(f"--{key.replace('_', '-')} {value:g}"
                            for key, value in self.applied.items())
        kept = ", ".join(f"--{key.replace('_', '-')}" for key in self.kept)
        return "; ".join(part for part in (f"sets {changed}" if changed else "",
                                           f"keeps your {kept}" if kept else "") if part)

    def words(self) -> str:
        changes = self.changes()
        return f"cold start shape: {self.name} ({self.reason})" + (
            f"; {changes}" if changes else "")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "reason": self.reason, "applied": dict(self.applied),
                "kept": list(self.kept)}


def absent_moves(choice: ColdStartChoice) -> list[str]:
    """Categories the base never passes whose groups (two or more replies to one prompt in
    one evaluation, at least ``MIN_GROUPS`` of them) all scored alike: nothing partial for
    RL, or a cold start, to grow."""
    return [category.name for category in choice.signal
            if category.replies and not category.passed
            and category.groups >= MIN_GROUPS and category.all_equal == category.groups]


def too_few_groups(choice: ColdStartChoice) -> list[str]:
    """Categories the base never passes whose groups all scored alike, but too few of them
    to say so (``MIN_GROUPS``): "with_id 3 groups" each."""
    return [f"{category.name} {category.groups} groups" for category in choice.signal
            if category.replies and not category.passed
            and 0 < category.groups < MIN_GROUPS and category.all_equal == category.groups]


def choose_cold_start_shape(asked: str, choice: ColdStartChoice) -> tuple[str, str]:
    """``full`` or ``light`` for ``--cold-start-shape asked`` and why (see the module
    docstring); a run without a cold start is ``full``."""
    if not choice.run:
        return "full", "no cold start"
    if asked in ("full", "light"):
        return asked, f"--cold-start-shape {asked}"
    absent = absent_moves(choice)
    if absent:
        return "light", (f"auto: the base scored every group of {', '.join(absent)} alike: "
                         "the move is absent, not partial, and a full cold start would learn it "
                         "outright and leave RL nothing to explore")
    few = too_few_groups(choice)
    if few:
        return "full", (f"auto: too few groups to read the shape: {', '.join(few)}, "
                        f"{MIN_GROUPS} needed; the default")
    return "full", ("auto: the base's replies score differently within every category it "
                    "does not pass")


def given_settings(settings: Any) -> set[str]:
    """Settings the user chose: named on the command line or in ``--config``
    (``settings.explicit``), or holding a value other than the field's default."""
    given = set(settings.explicit)
    for item in fields(settings):
        if item.name in LIGHT_SHAPE and getattr(settings, item.name) != item.default:
            given.add(item.name)
    return given


def shape_settings(asked: str, choice: ColdStartChoice, settings: Any
                   ) -> tuple[Any, ColdStartShape]:
    """The run's settings under its cold start shape (a copy; the user's own settings kept)
    and the shape, for the run to say and record."""
    name, reason = choose_cold_start_shape(asked, choice)
    if name == "full":
        return settings, ColdStartShape(name, reason)
    given = given_settings(settings)
    applied = {key: value for key, value in LIGHT_SHAPE.items() if key not in given}
    kept = [key for key in LIGHT_SHAPE if key in given]
    # the chosen name too, so a run's config.json, read back by --config, runs the same
    shaped = replace(settings, cold_start_shape=name, **applied)
    return shaped, ColdStartShape(name, reason, applied, kept)


def shaped_train(train: list[dict[str, Any]], shape: ColdStartShape) -> list[dict[str, Any]]:
    """RL's train prompts under the shape: balanced to its share when it set ``--balance``
    (the data phase balanced them already when the user did)."""
    share = shape.applied.get("balance", 0)
    return balance(train, share) if share else train
