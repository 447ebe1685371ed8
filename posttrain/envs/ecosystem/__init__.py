"""Environments from other libraries: ``--env verifiers:ENV_ID`` (``verifiers_env``) and
``--env inspect:PKG/TASK`` or ``inspect:FILE.py@TASK`` (``inspect_env``).

``ecosystem_env(name)`` builds one from its spec (``spec``: ``LIBRARY:TARGET?ARGS``), or
returns None when ``name`` names no library. The libraries are optional (the
``ecosystem`` extra) and imported only when such an environment is asked for (inside
the adapters, never at import time).
"""

from __future__ import annotations

from typing import Any

from posttrain.envs.ecosystem.inspect_env import InspectEnv, load_task
from posttrain.envs.ecosystem.inspect_tools import InspectToolEnv, uses_tools
from posttrain.envs.ecosystem.spec import JudgeEndpoint, parse_env_spec, with_env_args
from posttrain.envs.ecosystem.verifiers_env import VerifiersEnv, import_verifiers, load_verifiers
from posttrain.envs.ecosystem.verifiers_tools import VerifiersToolEnv
from posttrain.envs.ecosystem.verifiers_v1 import VerifiersTasksetEnv, is_v1_taskset
from posttrain.errors import PosttrainError


def verifiers_environment(env_id: str, args: dict[str, Any] | None = None,
                          judge: JudgeEndpoint | None = None) -> Any:
    """The posttrain environment of verifiers environment ``env_id``: a v1 taskset
    (``VerifiersTasksetEnv``), else the classic environment ``load_environment`` returns:
    a ``ToolEnv`` plays episodes (``VerifiersToolEnv``), a ``SingleTurnEnv`` single
    replies (``VerifiersEnv``)."""
    vf = import_verifiers()
    if is_v1_taskset(env_id):
        return VerifiersTasksetEnv(env_id, args, judge)
    vf_env = load_verifiers(env_id, dict(args or {}), judge)
    if isinstance(vf_env, vf.ToolEnv):
        return VerifiersToolEnv(env_id, args, vf_env)
    return VerifiersEnv(env_id, args, vf_env)


def ecosystem_env(name: str) -> Any | None:
    """The environment ``name`` (``verifiers:...``, ``inspect:...``) loads, or None for any
    other name."""
    spec = parse_env_spec(name)
    if spec is None:
        return None
    if spec.library == "verifiers":
        return verifiers_environment(spec.target, spec.loader_args(), spec.judge())
    if spec.library == "inspect":
        args = spec.loader_args()
        task = load_task(spec.target, args)
        if uses_tools(task):
            return InspectToolEnv(spec.target, args, task, spec.judge())
        return InspectEnv(spec.target, args, task, spec.judge())
    raise PosttrainError(f"--env {name!r}: {spec.library} environments are not supported yet")


__all__ = ["ecosystem_env", "parse_env_spec", "verifiers_environment", "with_env_args"]
