"""The training-primitives service: ordered primitives over HTTP, caller-owned loss math.

Three wings over a shared schema (docs/service.md, "Where things live"):

- ``engine/``: one base model, sessions, LoRA runs, ordered operations (``Engine``);
- ``protocols/``: the wire formats on the engine (posttrain's own JSON, OpenAI chat,
  tinker), served together by ``server`` (``serve`` / ``start_server``);
- ``client/``: the caller's side, ``ServiceClient`` and the RL helpers
  (``group_mean_advantages``, ``all_zero``, ``rl_datum``, ``forward_backward_payload``,
  ``run_rl_loop``), standard library only;
- ``schema``: the request types both sides share (``AdamParams``).

Every name is imported when first asked for, from the module that defines it: importing
this package (or the client under it) loads no server module, no model and no torch.
"""

from __future__ import annotations

from posttrain.lazy_exports import lazy_face

# public name -> module that defines it (tests/test_layers.py checks every one resolves)
_EXPORTS = {
    **dict.fromkeys(
        ("Operation", "OperationCancelled", "OperationFailed", "Run", "ServiceClient",
         "ServiceRequestError", "ServiceUnavailable", "Session"),
        "posttrain.service.client.service_client"),
    "AdamParams": "posttrain.service.schema",
    **dict.fromkeys(
        ("Algorithm", "AlgorithmNotExpressible", "LoopContext", "LoopReport", "LoopSettings",
         "NoGradientSignal", "all_zero", "forward_backward_payload", "group_mean_advantages",
         "leave_one_out_advantages", "rl_datum", "run_rl_loop"),
        "posttrain.service.client.rl"),
    "Engine": "posttrain.service.engine.engine",
    "serve": "posttrain.service.server",
    "start_server": "posttrain.service.server",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
