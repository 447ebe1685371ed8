"""Environments from other libraries: ``--env verifiers:ENV_ID`` (``verifiers_env``),
``--env inspect:PKG/TASK`` or ``inspect:FILE.py@TASK`` (``inspect_env``) and ``--env
openenv:URL`` or ``openenv:MODULE:APP`` (``openenv_env``).

``ecosystem_env(name)`` builds one from its spec (``spec``: ``LIBRARY:TARGET?ARGS``), or
returns None when ``name`` names no library. The libraries are optional (the
``ecosystem`` extra) and imported only when such an environment is asked for (inside
the adapters, never at import time).
"""

from __future__ import annotations

from posttrain.envs.ecosystem.adapters import ecosystem_env, verifiers_environment
from posttrain.envs.ecosystem.spec import parse_env_spec, with_env_args

__all__ = ["ecosystem_env", "parse_env_spec", "verifiers_environment", "with_env_args"]
