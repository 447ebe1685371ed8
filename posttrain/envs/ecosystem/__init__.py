"""Environments from other libraries: ``--env verifiers:ENV_ID`` (``verifiers_env``) and
``--env inspect:PKG/TASK`` or ``inspect:FILE.py@TASK`` (``inspect_env``).

``ecosystem_env(name)`` builds one from its spec (``spec``: ``LIBRARY:TARGET?ARGS``), or
returns None when ``name`` names no library. The libraries are optional (the
``ecosystem`` extra) and imported only when such an environment is asked for (inside
the adapters, never at import time).
"""

from __future__ import annotations

from typing import Any

from posttrain.envs.ecosystem.inspect_env import InspectEnv
from posttrain.envs.ecosystem.spec import parse_env_spec, with_env_args
from posttrain.envs.ecosystem.verifiers_tools import verifiers_environment
from posttrain.errors import PosttrainError


def ecosystem_env(name: str) -> Any | None:
    """The environment ``name`` (``verifiers:...``, ``inspect:...``) loads, or None for any
    other name."""
    spec = parse_env_spec(name)
    if spec is None:
        return None
    if spec.library == "verifiers":
        return verifiers_environment(spec.target, spec.args)
    if spec.library == "inspect":
        return InspectEnv(spec.target, spec.args)
    raise PosttrainError(f"--env {name!r}: {spec.library} environments are not supported yet")


__all__ = ["ecosystem_env", "parse_env_spec", "with_env_args"]
