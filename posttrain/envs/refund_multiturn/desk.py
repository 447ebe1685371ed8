"""The refund desk of one episode: executes the policy's tool calls against the book.

``Desk(case)`` is the episode's state (what was looked up, whether the customer told
their id, whether a refund went through). ``Desk.call(name, arguments)`` returns the
tool result as JSON text; a call that fails returns ``{"error": "..."}`` (the same
text in posttrain's episode runner and in TRL's tool loop). The desk never trusts a
tool result written in a transcript: the reward replays the policy's calls on a fresh
desk (``rule.replay``), so a reply that forges a ``<tool_response>`` gains nothing.

``RefundDesk`` is the same desk in the shape TRL's ``GRPOTrainer(environment_factory=...)``
wants: ``reset(**row)`` starts an episode from a dataset row, and each public method
is a tool (TRL reads its schema from the docstring).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from posttrain.envs.refund.rule import normalize_order_id
from posttrain.envs.refund_multiturn.book import order_for

TOOL_NAMES = ("lookup_order", "create_refund", "ask_customer")
_ARGUMENTS = {
    "lookup_order": ("order_id",),
    "create_refund": ("amount", "order_id"),
    "ask_customer": ("question",),
}


def _json(payload: dict[str, Any]) -> str:
    return json.dumps(payload, separators=(", ", ": "))


def error(message: str) -> str:
    """A failed call's result."""
    return _json({"error": message})


def is_error(result: str) -> bool:
    """Did a tool result report a failure?"""
    try:
        payload = json.loads(result)
    except ValueError:
        return False
    return isinstance(payload, dict) and "error" in payload


@dataclass
class Call:
    """One executed tool call and what it returned."""

    name: str
    arguments: dict[str, Any]
    result: str
    ok: bool


@dataclass
class Desk:
    """The state of one episode. ``case`` is the rule's ground truth
    (``order_id`` given in the prompt, ``customer_id`` the customer can tell, ...)."""

    case: dict[str, Any]
    told: bool = False  # the customer has told their id
    looked_up: bool = False  # the customer's order was looked up
    refund: dict[str, Any] | None = None  # the refund that went through
    calls: list[Call] = field(default_factory=list)

    @property
    def own_id(self) -> str | None:
        """The customer's order id (given in the prompt, or the one they can tell)."""
        return self.case.get("order_id") or self.case.get("customer_id")

    @property
    def known_ids(self) -> set[str]:
        """Ids the policy has been told so far; naming any other is inventing one."""
        known = set()
        if self.case.get("order_id"):
            known.add(self.case["order_id"])
        if self.told and self.case.get("customer_id"):
            known.add(self.case["customer_id"])
        return known

    @property
    def done(self) -> bool:
        """An episode ends on a refund that went through."""
        return self.refund is not None

    def call(self, name: str, arguments: dict[str, Any]) -> str:
        """Execute one tool call; the result is JSON text (``{"error": ...}`` on failure)."""
        result = self._execute(name, arguments if isinstance(arguments, dict) else {})
        self.calls.append(Call(name, dict(arguments or {}), result, not is_error(result)))
        return result

    def _execute(self, name: str, arguments: dict[str, Any]) -> str:
        if name not in _ARGUMENTS:
            return error(f"no tool named {name!r}; the tools are {', '.join(TOOL_NAMES)}")
        wanted = _ARGUMENTS[name]
        missing = [arg for arg in wanted if arg not in arguments]
        extra = sorted(set(arguments) - set(wanted))
        if missing or extra:
            what = f"missing {', '.join(missing)}" if missing else f"unexpected {', '.join(extra)}"
            return error(f"{name} takes {', '.join(wanted)}: {what}")
        if self.done:
            return error("the refund went through; the conversation is over")
        if name == "ask_customer":
            return self._ask_customer()
        order_id = normalize_order_id(str(arguments["order_id"]))
        if order_id is None:
            return error(f"{arguments['order_id']!r} is not an order id (they look like ORD-4821)")
        if order_id != self.own_id:
            return error(f"no order {order_id}")
        if name == "lookup_order":
            self.looked_up = True
            return _json(order_for(order_id).record())
        return self._create_refund(order_id, arguments["amount"])

    def _ask_customer(self) -> str:
        given, hidden = self.case.get("order_id"), self.case.get("customer_id")
        if given:
            return _json({"customer": f"I already gave it: {given}."})
        if hidden:
            self.told = True
            return _json({"customer": f"It's {hidden}."})
        return _json({"customer": "I don't have an order, I just had a question."})

    def _create_refund(self, order_id: str, amount: Any) -> str:
        if not self.looked_up:
            return error(f"look {order_id} up with lookup_order before refunding it")
        order = order_for(order_id)
        if not order.refundable:
            return error(f"{order_id} cannot be refunded: {order.reason}")
        try:
            value = float(amount)
        except (TypeError, ValueError):
            return error(f"amount must be a number, got {amount!r}")
        if not math.isfinite(value) or value <= 0 or value > order.price:
            return error(f"amount must be more than 0 and at most the order total {order.price}")
        self.refund = {"order_id": order_id, "amount": value}
        return _json({"refund_id": "RF-" + order_id[4:], "order_id": order_id,
                      "amount": value, "status": "refunded"})


class RefundDesk:
    """The desk as a TRL environment (``GRPOTrainer(environment_factory=RefundDesk)``).

    TRL calls ``reset(**row)`` with every dataset column before each rollout; the
    ``case`` column (JSON text) carries the episode's ground truth.
    """

    def __init__(self) -> None:
        self.desk = Desk(case={})

    def reset(self, **row: Any) -> None:
        case = row.get("case")
        self.desk = Desk(case=json.loads(case) if isinstance(case, str) else dict(case or {}))

    def lookup_order(self, order_id: str) -> str:
        """Fetch an order by id: items, price, status, days since delivery, refundable.

        Args:
            order_id: The order id, e.g. ORD-4821.
        """
        return self.desk.call("lookup_order", {"order_id": order_id})

    def create_refund(self, amount: float, order_id: str) -> str:
        """Refund an amount on an order that was looked up first; ends the conversation.

        Args:
            amount: Amount to refund, at most the order total.
            order_id: The order id.
        """
        return self.desk.call("create_refund", {"order_id": order_id, "amount": amount})

    def ask_customer(self, question: str) -> str:
        """Ask the customer a question (e.g. their order id) and get their answer.

        Args:
            question: What to ask.
        """
        return self.desk.call("ask_customer", {"question": question})
