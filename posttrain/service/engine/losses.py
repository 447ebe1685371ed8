"""The built-in losses of the primitives service: per-token formulas, summed, caller normalises.

Every loss is a plain **sum over tokens and datums**; the server never averages. Token-mean,
sequence-mean or 1/G scaling is the caller's choice, made through ``weights`` or
``advantages`` (the convention Tinker documents and SkyRL converged on after its own
mean-reductions surprised users).

Notation, per token ``t`` of a datum (all tensors have the datum's length ``N``):

- ``lp``: the learner's log-probability of ``target_tokens[t]``, computed in this forward
  pass (gradients flow through it and nothing else);
- ``q``: the ``logprobs`` input, the sampler's log-probability of the same token;
- ``A``: the ``advantages`` input; ``w``: the ``weights`` input (optional for the policy
  losses, default 1; put 0 on prompt positions);
- ``r = exp(lp - q)``, the importance ratio; ``sg(x)`` is ``x`` with its gradient stopped.

===================  ==========================================  ============================
loss                 per-token loss                              config (default)
===================  ==========================================  ============================
cross_entropy        ``-w * lp``                                 none
importance_sampling  ``-w * r * A``                              none
ppo                  ``-w * min(r * A, clip(r, lo, hi) * A)``    clip_low_threshold (0.8),
                                                                 clip_high_threshold (1.2)
cispo                ``-w * sg(clip(r, lo, hi)) * lp * A``       clip_low_threshold (0.0),
                                                                 clip_high_threshold (4.0)
dro                  ``-w * (lp * A - beta/2 * (lp - q)^2)``     beta (0.05)
===================  ==========================================  ============================

The clip thresholds are bounds on the ratio itself (``1 - eps_low``, ``1 + eps_high``), so
DAPO's clip-higher is ``ppo`` with, say, ``clip_high_threshold=1.28``. ``cross_entropy``
weights may be negative: that is how a loss the server does not know (DPO, say) is sent
as its exact gradient at the current weights (``w = -dL/dlp``).

An unknown loss, an unknown config key, a missing or unexpected input, or a config value
out of range raises ``LossError`` (the server answers 4xx) before anything changes; no loss
is ever replaced by another.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

PerTokenLoss = Callable[[Any, Mapping[str, Any], Mapping[str, float]], Any]


class LossError(ValueError):
    """A loss request the server refuses: unknown name, config key, input, or bad value."""


@dataclass(frozen=True)
class LossSpec:
    """One built-in loss: its formula, inputs, config keys with defaults, and the math."""

    name: str
    formula: str
    required_inputs: tuple[str, ...]
    optional_inputs: tuple[str, ...]
    config_defaults: Mapping[str, float]
    per_token: PerTokenLoss
    description: str

    def describe(self) -> dict[str, Any]:
        """The JSON the capabilities endpoint serves for this loss."""
        return {
            "formula": self.formula,
            "required_inputs": list(self.required_inputs),
            "optional_inputs": list(self.optional_inputs),
            "config_defaults": dict(self.config_defaults),
            "reduction": "sum over tokens and datums",
            "description": self.description,
        }


# ---------------------------------------------------------------- per-token formulas
# Each takes the learner's target logprobs (N,), the datum's inputs as tensors (N,) and the
# resolved config; it returns the per-token loss (N,). Pure tensor functions.


def _weights(target_logprobs: Any, inputs: Mapping[str, Any]) -> Any:
    weights = inputs.get("weights")
    return weights if weights is not None else target_logprobs.new_ones(target_logprobs.shape)


def _ratio(target_logprobs: Any, inputs: Mapping[str, Any]) -> Any:
    import torch

    return torch.exp(target_logprobs - inputs["logprobs"])


def cross_entropy(
    target_logprobs: Any, inputs: Mapping[str, Any], config: Mapping[str, float]
) -> Any:
    """``-w * lp`` per token (supervised learning; negative weights push probability down)."""
    return -inputs["weights"] * target_logprobs


def importance_sampling(
    target_logprobs: Any, inputs: Mapping[str, Any], config: Mapping[str, float]
) -> Any:
    """``-w * r * A`` per token: REINFORCE with an (unclipped) importance-sampling correction.

    At ``lp == q`` the gradient is ``-w * A * d lp``, plain policy gradient.
    """
    ratio = _ratio(target_logprobs, inputs)
    return -_weights(target_logprobs, inputs) * ratio * inputs["advantages"]


def ppo(target_logprobs: Any, inputs: Mapping[str, Any], config: Mapping[str, float]) -> Any:
    """``-w * min(r * A, clip(r, lo, hi) * A)`` per token: PPO's clipped surrogate.

    Tokens whose ratio left ``[lo, hi]`` in the direction the advantage favours get no gradient.
    """
    import torch

    ratio = _ratio(target_logprobs, inputs)
    advantages = inputs["advantages"]
    clipped = ratio.clamp(config["clip_low_threshold"], config["clip_high_threshold"])
    surrogate = torch.minimum(ratio * advantages, clipped * advantages)
    return -_weights(target_logprobs, inputs) * surrogate


def cispo(target_logprobs: Any, inputs: Mapping[str, Any], config: Mapping[str, float]) -> Any:
    """``-w * sg(clip(r, lo, hi)) * lp * A`` per token (MiniMax-M1's CISPO).

    The ratio is clipped and detached, so every token keeps a gradient (``lp`` carries it);
    clipping only bounds the step size.
    """
    ratio = _ratio(target_logprobs, inputs).detach()
    clipped = ratio.clamp(config["clip_low_threshold"], config["clip_high_threshold"])
    return -_weights(target_logprobs, inputs) * clipped * target_logprobs * inputs["advantages"]


def dro(target_logprobs: Any, inputs: Mapping[str, Any], config: Mapping[str, float]) -> Any:
    """``-w * (lp * A - beta/2 * (lp - q)^2)`` per token (direct reward optimisation).

    The quadratic term keeps the learner near the sampler; it also acts on tokens with
    ``A = 0``, so send ``weights`` 0 on prompt positions.
    """
    deviation = target_logprobs - inputs["logprobs"]
    objective = target_logprobs * inputs["advantages"] - 0.5 * config["beta"] * deviation**2
    return -_weights(target_logprobs, inputs) * objective


# ---------------------------------------------------------------- the registry

_POLICY_INPUTS = ("target_tokens", "logprobs", "advantages")

LOSSES: dict[str, LossSpec] = {
    spec.name: spec
    for spec in (
        LossSpec(
            name="cross_entropy",
            formula="-w * lp",
            required_inputs=("target_tokens", "weights"),
            optional_inputs=(),
            config_defaults={},
            per_token=cross_entropy,
            description="supervised; negative weights carry a custom loss's gradient",
        ),
        LossSpec(
            name="importance_sampling",
            formula="-w * exp(lp - q) * A",
            required_inputs=_POLICY_INPUTS,
            optional_inputs=("weights",),
            config_defaults={},
            per_token=importance_sampling,
            description="policy gradient with an unclipped importance ratio",
        ),
        LossSpec(
            name="ppo",
            formula="-w * min(r * A, clip(r, clip_low_threshold, clip_high_threshold) * A)",
            required_inputs=_POLICY_INPUTS,
            optional_inputs=("weights",),
            config_defaults={"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
            per_token=ppo,
            description="clipped surrogate; thresholds bound the ratio (DAPO: raise the high one)",
        ),
        LossSpec(
            name="cispo",
            formula="-w * sg(clip(r, clip_low_threshold, clip_high_threshold)) * lp * A",
            required_inputs=_POLICY_INPUTS,
            optional_inputs=("weights",),
            config_defaults={"clip_low_threshold": 0.0, "clip_high_threshold": 4.0},
            per_token=cispo,
            description="clipped, detached importance weight on a REINFORCE term",
        ),
        LossSpec(
            name="dro",
            formula="-w * (lp * A - beta / 2 * (lp - q)^2)",
            required_inputs=_POLICY_INPUTS,
            optional_inputs=("weights",),
            config_defaults={"beta": 0.05},
            per_token=dro,
            description="policy gradient with a quadratic pull towards the sampler",
        ),
    )
}


def loss_spec(name: Any) -> LossSpec:
    """The registered loss called ``name``; ``LossError`` listing the choices otherwise."""
    if not isinstance(name, str) or name not in LOSSES:
        raise LossError(
            f"loss_function {name!r} is not supported; choose one of {', '.join(LOSSES)} "
            "(the server never substitutes another loss)"
        )
    return LOSSES[name]


def resolve_config(name: str, config: Mapping[str, Any] | None) -> dict[str, float]:
    """The full config of loss ``name``: its defaults overridden by ``config``.

    Raises ``LossError`` for an unknown loss, an unknown key, a non-finite or non-number
    value, or thresholds out of order (``0 <= low <= high``; ``beta >= 0``).
    """
    spec = loss_spec(name)
    if config is None:
        config = {}
    if not isinstance(config, Mapping):
        raise LossError(f"loss_config must be an object, got {type(config).__name__}")
    unknown = sorted(set(config) - set(spec.config_defaults))
    if unknown:
        allowed = ", ".join(spec.config_defaults) or "none"
        raise LossError(
            f"loss_config key(s) {', '.join(map(repr, unknown))} are not accepted by {name!r} "
            f"(accepted: {allowed})"
        )
    resolved = dict(spec.config_defaults)
    for key, value in config.items():
        is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not is_number or not math.isfinite(value):
            raise LossError(f"loss_config[{key!r}] must be a finite number, got {value!r}")
        resolved[key] = float(value)
    if "clip_low_threshold" in resolved:
        low, high = resolved["clip_low_threshold"], resolved["clip_high_threshold"]
        if not 0.0 <= low <= high:
            raise LossError(
                f"{name}: need 0 <= clip_low_threshold <= clip_high_threshold, got {low} and {high}"
            )
    if resolved.get("beta", 0.0) < 0:
        raise LossError(f"{name}: beta must be >= 0, got {resolved['beta']}")
    return resolved


def check_inputs(name: str, keys: set[str] | frozenset[str], where: str = "loss_fn_inputs") -> None:
    """Raise ``LossError`` when ``keys`` miss a required input of ``name`` or hold an extra one."""
    spec = loss_spec(name)
    missing = [key for key in spec.required_inputs if key not in keys]
    if missing:
        raise LossError(f"{where}: {name!r} needs {', '.join(missing)}")
    extra = sorted(keys - set(spec.required_inputs) - set(spec.optional_inputs))
    if extra:
        allowed = ", ".join((*spec.required_inputs, *spec.optional_inputs))
        raise LossError(f"{where}: {name!r} does not take {', '.join(extra)} (takes {allowed})")


def datum_loss(
    name: str, target_logprobs: Any, inputs: Mapping[str, Any], config: Mapping[str, float]
) -> Any:
    """Summed loss of one datum (a scalar tensor). ``inputs`` are float tensors shaped like
    ``target_logprobs`` (``target_tokens`` may be among them; it is not used here)."""
    return LOSSES[name].per_token(target_logprobs, inputs, config).sum()


def capabilities() -> dict[str, Any]:
    """``{name: description}`` of every loss, for ``GET /v1/training/capabilities``."""
    return {name: spec.describe() for name, spec in LOSSES.items()}
