"""The refund assistant: the built-in environment, one rule with every hook.

- ``rule``: tools, system prompt, ground truth (``case_for``), the score table,
  markers;
- ``env``: the ``RefundEnv`` object (``REFUND_ENV``) that assembles the rule and its hooks;
- ``prompts``: the template prompt writer (``write_prompts`` hook);
- ``agent``: the seeded scripted agent (``scripted_agent`` hook);
- ``negatives``: the invented lookup (``constructed_negative`` hook).

Everything that knows about orders, ids and refunds lives in this package.
"""

from posttrain.envs.refund.env import REFUND_ENV, RefundEnv
from posttrain.envs.refund.rule import (
    CATEGORIES,
    FORMAT_BONUS,
    OFF_TOPIC_MAX_CHARS,
    POLICY,
    REWARDED_FEATURES,
    SYSTEM,
    TOOLS,
    WIRE_FORMAT,
    case_for,
    category,
    markers,
    messages_for,
    normalize_order_id,
    score,
    well_formed,
)
from posttrain.envs.wire import parse_tool_call

__all__ = [
    "CATEGORIES", "FORMAT_BONUS", "OFF_TOPIC_MAX_CHARS", "POLICY", "REFUND_ENV",
    "REWARDED_FEATURES", "SYSTEM", "TOOLS", "WIRE_FORMAT", "RefundEnv", "case_for",
    "category", "markers", "messages_for", "normalize_order_id", "parse_tool_call",
    "score", "well_formed",
]
