"""The order book and the customer of one episode: deterministic, no storage.

Every order's details come from SHA-256 of its id, so the same id always has
the same items, price, delivery date and status, on every machine, with no data
file. The book of an episode holds the customer's order only: any other id a
policy names is unknown (the lookup returns an error), which is what makes an
invented id visible in the transcript.

A customer who wrote without an order id still has one (drawn from the text of
their message, again by SHA-256); they tell it when the policy asks through
``ask_customer``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

#: refunds are allowed up to this many days after delivery
REFUND_WINDOW_DAYS = 30

ITEMS = (
    "desk lamp", "running shoes", "coffee grinder", "wool scarf", "phone case",
    "yoga mat", "water bottle", "backpack", "bluetooth speaker", "cookbook",
    "table fan", "rain jacket",
)
# prices in whole units and halves keep amounts short to write (24.5, 60)
PRICES = (9.5, 12.0, 15.0, 19.5, 24.5, 30.0, 39.0, 45.5, 60.0, 75.0)


@dataclass(frozen=True)
class Order:
    """One order as ``lookup_order`` returns it."""

    order_id: str
    item: str
    price: float
    status: str  # "delivered", "in_transit" or "refunded"
    days_since_delivery: int | None  # None until delivered

    @property
    def refundable(self) -> bool:
        return self.status == "delivered" and (self.days_since_delivery or 0) <= REFUND_WINDOW_DAYS

    @property
    def reason(self) -> str | None:
        """Why the order cannot be refunded (None when it can)."""
        if self.status == "refunded":
            return "already refunded"
        if self.status == "in_transit":
            return "not delivered yet"
        if not self.refundable:
            return (f"delivered {self.days_since_delivery} days ago, "
                    f"past the {REFUND_WINDOW_DAYS}-day window")
        return None

    def record(self) -> dict[str, object]:
        """The lookup result: the order's fields plus ``reason`` and ``refundable``.

        What decides the next move comes last (whether it may be refunded, then the
        price to refund), right before the policy's turn: a small model finds a token
        at a fixed distance back more easily than a field anywhere in the result (every
        price is three tokens long for the starter: ``24`` ``.`` ``5``)."""
        return {"order_id": self.order_id, "item": self.item, "status": self.status,
                "days_since_delivery": self.days_since_delivery, "reason": self.reason,
                "refundable": self.refundable, "price": self.price}


def _digest(*parts: str) -> bytes:
    return hashlib.sha256("\x1f".join(parts).encode()).digest()


def order_for(order_id: str) -> Order:
    """The order behind a canonical id (``ORD-4821``), the same on every call.

    About 60% of orders are refundable; the rest are in transit, already refunded,
    or delivered past the refund window, in roughly equal shares.
    """
    digest = _digest("order", order_id)
    item = ITEMS[digest[0] % len(ITEMS)]
    price = PRICES[digest[1] % len(PRICES)]
    kind = digest[2] % 20
    if kind < 12:
        return Order(order_id, item, price, "delivered", 1 + digest[3] % REFUND_WINDOW_DAYS)
    if kind < 15:
        return Order(order_id, item, price, "in_transit", None)
    if kind < 18:
        return Order(order_id, item, price, "refunded", 1 + digest[3] % REFUND_WINDOW_DAYS)
    return Order(order_id, item, price, "delivered", REFUND_WINDOW_DAYS + 1 + digest[3] % 60)


def customer_order_id(prompt: str) -> str:
    """The order id a customer who gave none has in mind (4 digits, from their text)."""
    number = int.from_bytes(_digest("customer", " ".join(prompt.split()))[:4], "big")
    return f"ORD-{1000 + number % 9000}"
