"""The embedded starter models by name: which exist and where each build is cached.

Two kinds, one registry: ``starter`` and ``starter-2m`` are built from scratch
(``posttrain.policy.starters.scratch``, where the build and its quality gate are
described; their recipes are ``recipes``); ``starter-multiturn`` continues ``starter`` on
an environment's episodes (``posttrain.policy.starters.episodes``). ``NAME@SEED`` names the
same recipe started from build seed ``SEED`` (a seed study over builds: ``posttrain grpo
--base-model starter@3``).

A build lands under ``<models folder>/starter/<name>-<recipe key>/``. Nothing here
builds: ``cached_starter`` says whether a name's build is there, and the build step
(``posttrain.policy.starters.build``) makes one.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from posttrain.envs import get_env
from posttrain.errors import PosttrainError
from posttrain.policy.models import models_dir
from posttrain.policy.starter_names import split_seeded_name
from posttrain.policy.starters.episodes import episode_recipes
from posttrain.policy.starters.recipes import RECIPES, hook_recipe, needs_hook_starter


def all_recipes() -> dict[str, Any]:
    """The starters built from scratch and those continued on an environment's episodes."""
    return {**RECIPES, **episode_recipes()}


def recipe_for(name: str, *, env: str | None = None, prompts_file: str | None = None) -> Any:
    """The recipe of a starter name (``NAME@SEED``: from build seed SEED); PosttrainError
    naming the choices otherwise. With ``env``, ``starter`` names that environment's own
    starter when it has no hand-written one (``hook_recipe``; ``prompts_file`` for an
    environment without a prompt writer)."""
    base, seed = split_seeded_name(name)
    loaded = get_env(env) if base == "starter" and env is not None else None
    if loaded is not None and needs_hook_starter(loaded):
        return hook_recipe(env, prompts_file, seed, loaded=loaded)
    recipes = all_recipes()
    if base not in recipes:
        choices = ", ".join(sorted(recipes))
        raise PosttrainError(
            f"unknown starter model {name!r}; choose one of {choices} (or NAME@SEED for "
            "another build seed, e.g. starter@3)"
        )
    recipe = recipes[base]
    return replace(recipe, seed=seed) if seed is not None else recipe


def starter_folder(name: str = "starter", *, recipe: Any = None) -> Path:
    """Where the build of ``name`` (or of ``recipe``) is cached; it may not exist yet."""
    recipe = recipe or recipe_for(name)
    return models_dir() / "starter" / f"{recipe.name}-{recipe.key()}"


def cached_starter(name: str, *, env: str | None = None,
                   prompts_file: str | None = None) -> Path | None:
    """The folder of ``name``'s build when it is in the cache, else None (``env`` and
    ``prompts_file`` choose the recipe as ``recipe_for`` does)."""
    folder = starter_folder(name, recipe=recipe_for(name, env=env, prompts_file=prompts_file))
    return folder if folder.is_dir() else None
