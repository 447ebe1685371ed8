"""The multi-turn refund environment (``--env refund-multiturn``).

- ``book``: the deterministic order book and the id a customer without one has;
- ``desk``: one episode's tools (``Desk``) and the same desk as a TRL environment
  (``RefundDesk``, for ``GRPOTrainer(environment_factory=...)``);
- ``rule``: system prompt, categories, the replay and the episode score table;
- ``prompts``: the prompt writer (refund requests); ``agent``: the scripted agent.
- ``env``: ``RefundMultiturnEnv``, all of it as an ``Env`` (``REFUND_MULTITURN_ENV``).

The names below are imported on first use: importing one module of the package loads no
other.
"""

from __future__ import annotations

from posttrain.lazy_exports import lazy_face

_EXPORTS = {
    "REFUND_MULTITURN_ENV": "posttrain.envs.refund_multiturn.env",
    "REWARDED_FEATURES": "posttrain.envs.refund_multiturn.env",
    "RefundMultiturnEnv": "posttrain.envs.refund_multiturn.env",
}

__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
