"""``RefundMultiturnEnv`` and ``REFUND_MULTITURN_ENV``: the multi-turn refund desk as an
``Env`` (the rule, the book, the desk, the prompts and the agent of this package put
together, with what the episode score pays for by design)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from posttrain.envs.refund_multiturn.agent import ScriptedEpisodeAgent, behaviour_help
from posttrain.envs.refund_multiturn.desk import Desk, RefundDesk
from posttrain.envs.refund_multiturn.prompts import write_prompts
from posttrain.envs.refund_multiturn.rule import (
    CATEGORIES,
    MAX_TURNS,
    SYSTEM,
    TOOLS,
    case_for,
    category,
    markers,
    messages_for,
    replay,
    score,
)
from posttrain.envs.refund_multiturn.starter_data import starter_dialogue
from posttrain.envs.wire import split_turns

# what the episode score pays for by design (hack_scan names; "-": less of it, "~":
# either way): a well-formed episode everywhere; the lookup, and the refund where the
# order is refundable; the reason where it is not (the marker stands for the words
# that say it, which the scan then reads net of it); asking through
# ask_customer without an id; short replies off topic. On every order prompt an
# episode that does the work is longer (a lookup turn, then its reply or the refund),
# so length goes either way there ("~length"): a clean run's eligible episodes grew
# with the lookups the rule pays for, and a `hack` alarm named length (hack bench)
REWARDED_FEATURES: dict[str, tuple[str, ...]] = {
    "*": ("marker:well_formed", "-marker:invented_id", "-marker:turn_limit"),
    "eligible": ("tool:lookup_order", "tool:create_refund", "marker:looked_up",
                 "marker:refunded", "tool_call", "has_digits", "~length"),
    "ineligible": ("tool:lookup_order", "marker:looked_up", "marker:reason_given", "tool_call",
                   "~tool:create_refund", "~length", "~has_digits"),
    "no_id": ("tool:ask_customer", "tool:lookup_order", "~tool:create_refund",
              "marker:looked_up", "~marker:refunded", "~marker:reason_given", "tool_call",
              "~has_digits", "~length"),
    "off_topic": ("-length", "-tool_call"),
}


@dataclass(frozen=True)
class RefundMultiturnEnv:
    """The refund desk as a multi-turn ``Env`` (see ``posttrain.envs.base``)."""

    name: str = "refund-multiturn"
    categories: tuple[str, ...] = CATEGORIES
    tools: list[dict[str, Any]] = field(default_factory=lambda: TOOLS)
    system: str = SYSTEM
    multi_turn: bool = True
    max_turns: int = MAX_TURNS
    #: the base model recipes use for this environment when --base-model is not given
    starter_model: str = "starter-multiturn"
    rewarded_features: dict[str, tuple[str, ...]] = field(
        default_factory=lambda: dict(REWARDED_FEATURES))

    def messages_for(self, prompt: str) -> list[dict[str, str]]:
        return messages_for(prompt)

    def case_for(self, prompt: str) -> dict[str, Any]:
        return case_for(prompt)

    def category(self, case: dict[str, Any]) -> str:
        return category(case)

    def score(self, reply: str, case: dict[str, Any]) -> float:
        return score(reply, case)

    def markers(self, reply: str, case: dict[str, Any]) -> dict[str, float]:
        return markers(reply, case)

    # --- multi-turn hooks (posttrain.envs.base)

    def new_desk(self, case: dict[str, Any]) -> Desk:
        """A fresh episode: ``call(name, arguments) -> result text`` and ``done``."""
        return Desk(case=dict(case))

    def episode_summary(self, reply: str, case: dict[str, Any]) -> dict[str, Any]:
        """Turns, tool calls, failed calls and how the episode ended."""
        return replay(split_turns(reply), case, self.max_turns).summary()

    def trl_environment(self) -> type:
        """The class TRL's ``environment_factory`` instantiates (one per rollout)."""
        return RefundDesk

    # --- optional hooks

    def write_prompts(self, count: int, seed: int = 0) -> list[dict[str, Any]]:
        return write_prompts(count, seed)

    def scripted_agent(self, seed: int = 0,
                       behaviour: dict[str, dict[str, float]] | None = None) -> Any:
        return ScriptedEpisodeAgent(seed, behaviour)

    def behaviour_help(self) -> str:
        return behaviour_help()

    def starter_episode_spec(self) -> dict[str, Any]:
        """The starter_model's recipe: continued from starter-2m, and the gate's pass-rate
        ranges on this environment's probe prompts (docs/policies.md)."""
        return {"base": "starter-2m",
                "pass_rates": (("eligible", 0.02, 0.60), ("ineligible", 0.20, 0.85),
                               ("no_id", 0.10, 0.70), ("off_topic", 0.60, 1.00))}

    def starter_dialogue(self, prompt: str, right: bool, rng: Any) -> tuple[str, str, list]:
        """One warm-start episode for the starter build (``starter_data``)."""
        return starter_dialogue(prompt, right, rng)


REFUND_MULTITURN_ENV = RefundMultiturnEnv()

__all__ = [
    "CATEGORIES",
    "MAX_TURNS",
    "REFUND_MULTITURN_ENV",
    "REWARDED_FEATURES",
    "SYSTEM",
    "TOOLS",
    "RefundMultiturnEnv",
]
