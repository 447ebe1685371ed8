"""The training-primitives service: ordered primitives over HTTP, caller-owned loss math.

Three wings over a shared schema (docs/service.md, "Where things live"):

- ``engine/``: one base model, sessions, LoRA runs, ordered operations (``Engine``);
- ``protocols/``: the wire formats on the engine (posttrain's own JSON, OpenAI chat,
  tinker), served together by ``server`` (``serve`` / ``start_server``);
- ``client/``: the caller's side, ``ServiceClient`` and the RL helpers
  (``group_mean_advantages``, ``all_zero``, ``rl_datum``, ``forward_backward_payload``,
  ``run_rl_loop``), standard library only;
- ``schema``: the request types both sides share (``AdamParams``).

Importing this package loads no model and no torch.
"""

from __future__ import annotations

from posttrain.service import server
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
from posttrain.service.client.rl import (
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
from posttrain.service.engine import Engine

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
        return getattr(server, name)
    raise AttributeError(f"module 'posttrain.service' has no attribute {name!r}")
