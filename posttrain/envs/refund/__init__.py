"""The refund assistant: the built-in environment, one rule with every hook.

- ``rule``: tools, system prompt, ground truth (``case_for``), the score table,
  markers;
- ``env``: the ``RefundEnv`` object (``REFUND_ENV``) that assembles the rule and its hooks;
- ``prompts``: the template prompt writer (``write_prompts`` hook);
- ``agent``: the seeded scripted agent (``scripted_agent`` hook);
- ``negatives``: the invented lookup (``constructed_negative`` hook).

Everything that knows about orders, ids and refunds lives in this package.

The names below are imported on first use: importing one module of the package loads no
other.
"""

from __future__ import annotations

from posttrain.lazy_exports import lazy_face

_EXPORTS = {
    "REFUND_ENV": "posttrain.envs.refund.env",
    "RefundEnv": "posttrain.envs.refund.env",
    "CATEGORIES": "posttrain.envs.refund.rule",
    "FORMAT_BONUS": "posttrain.envs.refund.rule",
    "OFF_TOPIC_MAX_CHARS": "posttrain.envs.refund.rule",
    "POLICY": "posttrain.envs.refund.rule",
    "REWARDED_FEATURES": "posttrain.envs.refund.rule",
    "SYSTEM": "posttrain.envs.refund.rule",
    "TOOLS": "posttrain.envs.refund.rule",
    "WIRE_FORMAT": "posttrain.envs.refund.rule",
    "case_for": "posttrain.envs.refund.rule",
    "category": "posttrain.envs.refund.rule",
    "markers": "posttrain.envs.refund.rule",
    "messages_for": "posttrain.envs.refund.rule",
    "normalize_order_id": "posttrain.envs.refund.rule",
    "score": "posttrain.envs.refund.rule",
    "well_formed": "posttrain.envs.refund.rule",
    "parse_tool_call": "posttrain.envs.wire",
}

__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
