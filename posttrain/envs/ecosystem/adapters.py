"""Which adapter plays an ecosystem environment: ``ecosystem_env(name)`` parses
``LIBRARY:TARGET?ARGS`` (``spec``) and builds the verifiers or inspect adapter that fits
what the library loads (a v1 taskset, a ``ToolEnv``, a ``SingleTurnEnv``; a task with or
without ``use_tools``), or the OpenEnv adapter (a server's URL or an app to start); None
when ``name`` names no library.
"""

from __future__ import annotations

from typing import Any

from posttrain.envs.ecosystem.inspect_env import InspectEnv, load_task
from posttrain.envs.ecosystem.inspect_tools import InspectToolEnv, uses_tools
from posttrain.envs.ecosystem.openenv_env import OpenEnvEnv
from posttrain.envs.ecosystem.openenv_steps import OpenEnvStepsEnv
from posttrain.envs.ecosystem.spec import JudgeEndpoint, parse_env_spec
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
    if spec.library == "openenv":
        # several steps an episode (max_turns above 1): played as tool turns
        turns = spec.args.get("max_turns", 1)
        steps = isinstance(turns, int) and not isinstance(turns, bool) and turns > 1
        adapter = OpenEnvStepsEnv if steps else OpenEnvEnv
        return adapter(spec.target, spec.loader_args())
    raise PosttrainError(f"--env {name!r}: {spec.library} environments are not supported yet")

