"""The refund assistant assembled as an ``Env`` (see ``posttrain.envs.base``): the rule's
functions (``rule``) plus every optional hook, each from the module that owns it
(prompt writer, shipped holdout, scripted agent, starter data, constructed negative).

The rule itself (``rule.py``) imports none of these, so each hook's module can use the
rule without a cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from posttrain.envs.refund.agent import behaviour_help as agent_behaviour_help
from posttrain.envs.refund.agent import scripted_agent as seeded_scripted_agent
from posttrain.envs.refund.holdout import NAME as HOLDOUT_NAME
from posttrain.envs.refund.holdout import SHIPPED_FILE as SHIPPED_HOLDOUT
from posttrain.envs.refund.negatives import invented_lookup
from posttrain.envs.refund.prompts import simulate
from posttrain.envs.refund.rule import (
    CATEGORIES,
    REWARDED_FEATURES,
    SYSTEM,
    TOOLS,
    case_for,
    category,
    markers,
    messages_for,
    score,
)
from posttrain.envs.refund.starter_data import STARTER_DATA


@dataclass(frozen=True)
class RefundEnv:
    """The refund assistant as an ``Env`` object (see ``posttrain.envs.base``)."""

    name: str = "refund"
    categories: tuple[str, ...] = CATEGORIES
    tools: list[dict[str, Any]] = field(default_factory=lambda: TOOLS)
    system: str = SYSTEM
    rewarded_features: dict[str, tuple[str, ...]] = field(
        default_factory=lambda: dict(REWARDED_FEATURES)
    )

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

    # --- optional hooks (posttrain.envs.base)

    def write_prompts(self, count: int, seed: int = 0) -> list[dict[str, Any]]:
        """The template prompt writer: ``count`` situations, one or two phrasings each."""
        return simulate(count, seed=seed)

    def prompt_sets(self) -> dict[str, Any]:
        """Prompt sets shipped with the rule, by name (``--holdout-set``): the refund
        holdout of 477 grammar-written prompts (``posttrain.envs.refund.holdout``)."""
        return {HOLDOUT_NAME: SHIPPED_HOLDOUT}

    def scripted_agent(self, seed: int = 0,
                       behaviour: dict[str, dict[str, float]] | None = None) -> Any:
        """The seeded scripted agent (``posttrain.envs.refund.agent``)."""
        return seeded_scripted_agent(seed, behaviour)

    def reference_agent(self, seed: int = 0) -> Any:
        """The rule's right move on every prompt (the scripted agent with ``right`` 1.0
        everywhere): demonstrations for ``posttrain sft --demos reference``."""
        return seeded_scripted_agent(seed, {name: {"right": 1.0} for name in self.categories})

    def behaviour_help(self) -> str:
        return agent_behaviour_help()

    def starter_data(self) -> Any:
        """What the starter build needs of this rule (``posttrain.envs.refund.starter_data``)."""
        return STARTER_DATA

    def constructed_negative(self, prompt: str, case: dict[str, Any]) -> str | None:
        """A known-bad reply: on a prompt that gives no order id, a lookup of an id
        the customer never gave (``posttrain.envs.refund.negatives``); None elsewhere."""
        return invented_lookup(prompt, case)


REFUND_ENV = RefundEnv()
