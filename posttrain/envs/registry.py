"""Environments by name: ``get_env(name)`` returns a built-in rule, a user's object
(``module:attribute`` or ``file.py:attribute``) or another library's environment
(``verifiers:``, ``inspect:``, ``openenv:``), checked against the contract.

The ecosystem adapters (``posttrain.envs.ecosystem``) are imported only when a name asks
for one: a run on a built-in rule or a user's file loads none of them.
"""

from __future__ import annotations

from posttrain.envs.base import Env, check_env
from posttrain.envs.ecosystem.spec import parse_env_spec
from posttrain.errors import PosttrainError
from posttrain.plugins import load_object

# built-in environments: name -> "module:attribute"
BUILTIN_ENVS = {
    "refund": "posttrain.envs.refund.env:REFUND_ENV",
    "refund-multiturn": "posttrain.envs.refund_multiturn.env:REFUND_MULTITURN_ENV",
}
#: what every command uses without --env
DEFAULT_ENV = "refund"


def get_env(name: str = DEFAULT_ENV) -> Env:
    """Return the environment called ``name``.

    ``name`` is a built-in name (``refund``), ``package.module:attribute`` or
    ``path/to/file.py:attribute`` for a user's own environment object, or an environment
    another library loads (``verifiers:ENV_ID``, ``inspect:PKG/TASK``, ``openenv:URL``;
    ``posttrain.envs.ecosystem``). Raises ``PosttrainError`` naming the choices, or what a
    user's object lacks.
    """
    if parse_env_spec(name) is not None:
        # another library's environment: its adapters (and, inside them, the library)
        # load now, only for a name that asks for them
        from posttrain.envs.ecosystem.adapters import ecosystem_env

        loaded = ecosystem_env(name)
    else:
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
