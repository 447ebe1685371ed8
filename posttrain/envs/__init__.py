"""Environments. ``get_env(name)`` returns one by name or ``module:attribute``."""

from __future__ import annotations

from posttrain.envs.base import Env, check_env, passes, rewarded_features
from posttrain.envs.ecosystem import ecosystem_env
from posttrain.errors import PosttrainError
from posttrain.plugins import load_object

# built-in environments: name -> "module:attribute"
BUILTIN_ENVS = {
    "refund": "posttrain.envs.refund:REFUND_ENV",
    "refund-multiturn": "posttrain.envs.refund_multiturn:REFUND_MULTITURN_ENV",
}
#: what every command uses without --env
DEFAULT_ENV = "refund"


def get_env(name: str = DEFAULT_ENV) -> Env:
    """Return the environment called ``name``.

    ``name`` is a built-in name (``refund``), ``package.module:attribute`` or
    ``path/to/file.py:attribute`` for a user's own environment object, or an environment
    another library loads (``verifiers:ENV_ID``, ``inspect:PKG/TASK``;
    ``posttrain.envs.ecosystem``). Raises ``PosttrainError`` naming the choices, or what a
    user's object lacks.
    """
    loaded = ecosystem_env(name)
    if loaded is None:
        target = BUILTIN_ENVS.get(name, name)
        if ":" not in target:
            known = ", ".join(sorted(BUILTIN_ENVS))
            raise PosttrainError(
                f"unknown environment {name!r}: use one of {known}, module:attribute "
                "(or file.py:attribute), verifiers:ENV_ID, or inspect:PKG/TASK "
                "(inspect:FILE.py@TASK)"
            )
        loaded = load_object(target, "--env", "my_rules.py:ENV")
    return check_env(loaded, f"--env {name!r}")


__all__ = ["BUILTIN_ENVS", "DEFAULT_ENV", "Env", "get_env", "passes", "rewarded_features"]
