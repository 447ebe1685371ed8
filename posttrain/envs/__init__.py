"""Environments. ``get_env(name)`` returns one by name or ``module:attribute``
(``registry``); the contract is ``base``. Each name is imported on first use, so that
importing one module of the package (``posttrain.envs.base``, say) loads no other."""

from __future__ import annotations

from posttrain.lazy_exports import lazy_face

_EXPORTS = {
    "BUILTIN_ENVS": "posttrain.envs.registry",
    "DEFAULT_ENV": "posttrain.envs.registry",
    "get_env": "posttrain.envs.registry",
    "Env": "posttrain.envs.base",
    "passes": "posttrain.envs.base",
    "rewarded_features": "posttrain.envs.base",
}

__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
