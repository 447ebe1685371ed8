"""Environments. ``get_env(name)`` returns one by name or ``module:attribute``."""

from __future__ import annotations

import importlib

from posttrain.envs.base import Env, passes, rewarded_features
from posttrain.errors import PosttrainError

# built-in environments: name -> "module:attribute"
BUILTIN_ENVS = {
    "refund": "posttrain.envs.refund:REFUND_ENV",
}


def get_env(name: str = "refund") -> Env:
    """Return the environment called ``name``.

    ``name`` is a built-in name (``refund``) or ``package.module:attribute`` for a
    user's own environment object. Raises ``PosttrainError`` naming the choices.
    """
    target = BUILTIN_ENVS.get(name, name)
    if ":" not in target:
        known = ", ".join(sorted(BUILTIN_ENVS))
        raise PosttrainError(
            f"unknown environment {name!r}: use one of {known}, or 'module:attribute'"
        )
    module_name, attribute = target.split(":", 1)
    try:
        env = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise PosttrainError(f"cannot load environment {name!r}: {error}") from error
    if not isinstance(env, Env):
        raise PosttrainError(f"{name!r} is not an environment (see posttrain.envs.base.Env)")
    return env


__all__ = ["BUILTIN_ENVS", "Env", "get_env", "passes", "rewarded_features"]
