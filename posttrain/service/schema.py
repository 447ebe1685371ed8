"""The request schema both sides of the wire share: the client builds these, the server reads them.

Standard library only: the client imports this module on a caller's machine without
torch, and the engine takes the same types as its typed requests, so a field is defined
once (an ``AdamParams`` was defined on each side before, and could drift).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

API_PREFIX = "/v1/training"  # where posttrain's own routes live
TERMINAL_RUN_STATES = ("finished", "cancelled", "failed", "lost")
TERMINAL_OPERATION_STATES = ("succeeded", "failed", "cancelled")
# every AdamW hyper-parameter is sent, in this order; the server has no hidden defaults
ADAM_KEYS = ("learning_rate", "beta1", "beta2", "eps", "weight_decay", "grad_clip_norm")


@dataclass(frozen=True)
class AdamParams:
    """AdamW hyper-parameters, all explicit; ``grad_clip_norm`` 0 turns clipping off."""

    learning_rate: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    grad_clip_norm: float

    def to_json(self) -> dict[str, float]:
        """The ``adam_params`` object of an ``optim_step`` body."""
        return asdict(self)
