"""The refund environment's constructed negative: the ``constructed_negative`` hook.

DPO learns only where a prompt has contrast, and a base policy that almost never
invents an order id on a no-id prompt gives those prompts no pairs. The known-bad
reply there is a lookup of an id the customer never gave.
"""

from __future__ import annotations

import hashlib
from typing import Any

from posttrain.envs.wire import render_tool_call

INVENTED_TOOL = "lookup_order"


def _invented_number(prompt: str, attempt: int) -> int:
    digest = hashlib.sha256(f"{prompt}\x1f{attempt}".encode()).hexdigest()
    return int(digest[:8], 16) % 9000 + 1000


def invented_call(prompt: str, tool: str = INVENTED_TOOL) -> str:
    """A well-formed call of ``tool`` with an order id made up from ``prompt``.

    The id is ``ORD-dddd``, four digits from SHA-256 of the prompt (the same prompt
    always gives the same id); if those four digits occur anywhere in the prompt, the
    next hash (prompt, 1), (prompt, 2), ... is tried, so the id is never in it.
    """
    text = prompt or ""
    for attempt in range(10_000):
        number = _invented_number(text, attempt)
        if str(number) not in text:
            return render_tool_call(tool, {"order_id": f"ORD-{number}"})
    raise ValueError("could not invent an order id absent from the prompt")  # pragma: no cover


def invented_lookup(prompt: str, case: dict[str, Any]) -> str | None:
    """The hook: an invented lookup where the prompt gives no order id, else None."""
    return None if case.get("order_id") else invented_call(prompt)
