"""Environments from other libraries: ``--env verifiers:ENV_ID`` (``verifiers_env``),
``--env inspect:PKG/TASK`` or ``inspect:FILE.py@TASK`` (``inspect_env``) and ``--env
openenv:URL`` or ``openenv:MODULE:APP`` (``openenv_env``).

``ecosystem_env(name)`` (``adapters``) builds one from its spec (``spec``:
``LIBRARY:TARGET?ARGS``), or returns None when ``name`` names no library. The libraries
are optional (the ``ecosystem`` extra) and imported only when such an environment is
asked for (inside the adapters, never at import time); the names here are imported on
first use, so that ``spec`` loads no adapter.
"""

from __future__ import annotations

from posttrain.lazy_exports import lazy_face

_EXPORTS = {
    "ecosystem_env": "posttrain.envs.ecosystem.adapters",
    "verifiers_environment": "posttrain.envs.ecosystem.adapters",
    "parse_env_spec": "posttrain.envs.ecosystem.spec",
    "with_env_args": "posttrain.envs.ecosystem.spec",
}

__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
