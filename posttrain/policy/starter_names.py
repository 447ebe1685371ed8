"""Which ``--base-model`` names are posttrain's starters, without building anything.

The loaders, the sampler defaults and the vLLM check only need to know whether a name
is a starter; the build (``starters.scratch``, ``starters.episodes``) and its registry
(``starters.registry``) sit above them and use these names too.
"""

from __future__ import annotations

import re

from posttrain.envs import BUILTIN_ENVS, get_env
from posttrain.envs.base import EpisodeStarterSource, has_hook

#: the starters built from scratch (one recipe each in ``starters.recipes.RECIPES``)
BASE_STARTER_NAMES = ("starter", "starter-2m")
_SEEDED_NAME = re.compile(r"^(?P<base>[a-z0-9-]+)@(?P<seed>[0-9]{1,6})$")


def split_seeded_name(name: str) -> tuple[str, int | None]:
    """``("starter", 3)`` for ``starter@3``; ``(name, None)`` for a name without a build
    seed."""
    match = _SEEDED_NAME.match(name)
    return (match["base"], int(match["seed"])) if match else (name, None)


def episode_starter_envs() -> dict[str, str]:
    """The starters continued on an environment's episodes: starter name -> built-in
    environment, for each environment that declares one (its ``starter_model`` and
    ``starter_episode_spec()``, e.g. ``starter-multiturn`` for refund-multiturn)."""
    named = {}
    for env_name in BUILTIN_ENVS:
        env = get_env(env_name)
        if has_hook(env, EpisodeStarterSource):
            named[env.starter_model] = env_name
    return named


def starter_names() -> tuple[str, ...]:
    """Every starter name: those built from scratch, then the episode starters."""
    return (*BASE_STARTER_NAMES, *episode_starter_envs())


def is_starter_name(name: str) -> bool:
    """True for ``starter``, ``starter-2m``, ``starter-multiturn`` and their ``NAME@SEED``
    forms."""
    return split_seeded_name(name)[0] in starter_names()
