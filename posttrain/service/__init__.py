"""The training-primitives service: ordered primitives over HTTP, caller-owned loss math.

Server side: ``Engine`` (one base model, sessions, LoRA runs, ordered operations) and
``serve`` / ``start_server`` (HTTP). Caller side: ``ServiceClient`` and the RL helpers
(``group_mean_advantages``, ``all_zero``, ``rl_datum``, ``forward_backward_payload``,
``run_rl_loop``). See docs/service.md. Importing this package loads no model and no torch.
"""

from __future__ import annotations

from posttrain.service import api
from posttrain.service.client import (
    AdamParams,
    Operation,
    OperationCancelled,
    OperationFailed,
    Run,
    ServiceClient,
    ServiceRequestError,
    ServiceUnavailable,
    Session,
)
from posttrain.service.engine import Engine
from posttrain.service.rl import (
    Algorithm,
    AlgorithmNotExpressible,
    LoopContext,
    LoopReport,
    LoopSettings,
    NoGradientSignal,
    all_zero,
    forward_backward_payload,
    group_mean_advantages,
    leave_one_out_advantages,
    rl_datum,
    run_rl_loop,
)

__all__ = [
    "AdamParams", "Algorithm", "AlgorithmNotExpressible", "Engine", "LoopContext", "LoopReport",
    "LoopSettings", "NoGradientSignal", "Operation", "OperationCancelled", "OperationFailed",
    "Run", "ServiceClient", "ServiceRequestError", "ServiceUnavailable", "Session", "all_zero",
    "forward_backward_payload", "group_mean_advantages", "leave_one_out_advantages", "rl_datum",
    "run_rl_loop", "serve", "start_server",
]


def __getattr__(name: str):
    # the server side pulls in the engine modules; load them only when asked for
    if name == "Engine":
        return Engine
    if name in ("serve", "start_server"):
        return getattr(api, name)
    raise AttributeError(f"module 'posttrain.service' has no attribute {name!r}")
