"""The embedded starter models by name: which exist, where each is cached, and building
one on first use.

Two kinds, one registry: ``starter`` and ``starter-2m`` are built from scratch
(``posttrain.policy.starter_build``, where the build and its quality gate are
described); ``starter-multiturn`` continues ``starter`` on an environment's episodes
(``posttrain.policy.starter_episodes``). ``NAME@SEED`` names the same recipe started from
build seed ``SEED`` (a seed study over builds: ``posttrain grpo --base-model starter@3``).

A build lands under ``<models folder>/starter/<name>-<recipe key>/``, atomically; one
process builds a recipe at a time (a lock file beside the folder), the others wait and
reuse it. Every build runs torch on ``BUILD_THREADS`` threads, so on one machine a recipe
gives the same weights, byte for byte, whatever the core count.
"""

from __future__ import annotations

import fcntl
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from posttrain.envs import get_env
from posttrain.errors import PosttrainError
from posttrain.policy.models import models_dir
from posttrain.policy.starter_build import (
    BUILD_THREADS,
    RECIPES,
    StarterRecipe,
    build_from_scratch,
    hook_recipe,
    needs_hook_starter,
)
from posttrain.policy.starter_episodes import (
    EpisodeStarterRecipe,
    build_episode_starter,
    episode_recipes,
)
from posttrain.policy.starter_names import split_seeded_name


def all_recipes() -> dict[str, Any]:
    """The starters built from scratch and those continued on an environment's episodes."""
    return {**RECIPES, **episode_recipes()}


def recipe_for(name: str, *, env: str | None = None, prompts_file: str | None = None) -> Any:
    """The recipe of a starter name (``NAME@SEED``: from build seed SEED); PosttrainError
    naming the choices otherwise. With ``env``, ``starter`` names that environment's own
    starter when it has no hand-written one (``hook_recipe``; ``prompts_file`` for an
    environment without a prompt writer)."""
    base, seed = split_seeded_name(name)
    if base == "starter" and env is not None and needs_hook_starter(get_env(env)):
        return hook_recipe(env, prompts_file, seed)
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


def build_starter(
    name: str = "starter",
    force: bool = False,
    *,
    recipe: StarterRecipe | EpisodeStarterRecipe | None = None,
    show_progress: bool = True,
    env: str | None = None,
    prompts_file: str | None = None,
) -> Path:
    """Build (or find in the cache) a starter model; returns its folder.

    The folder is a normal transformers folder (``from_pretrained`` loads it)
    plus ``recipe.json`` and ``build.json`` (the gate's verdict, every build seed
    tried with its probe, timings, behaviour counts). ``force`` rebuilds even when
    cached. ``recipe`` overrides the recipe of ``name`` (tests use smaller ones);
    ``env`` and ``prompts_file`` choose it as ``recipe_for`` does.
    Concurrent builds of the same recipe are serialised by a lock file next to
    the folder.
    """
    recipe = recipe or recipe_for(name, env=env, prompts_file=prompts_file)
    folder = starter_folder(recipe.name, recipe=recipe)
    if folder.is_dir() and not force:
        return folder
    with _build_lock(folder):
        if folder.is_dir() and not force:
            return folder  # another process built it while we waited
        return _build(recipe, folder, force, show_progress)


@contextmanager
def _build_lock(folder: Path) -> Iterator[None]:
    """One build of a recipe at a time across processes; the others wait, then reuse it."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for another build of {folder.name} ...", file=sys.stderr)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build(recipe: Any, folder: Path, force: bool, show_progress: bool) -> Path:
    import torch  # the train extra; only a build needs it

    # A fixed thread count: on one machine the weights then do not depend on its
    # core count (a different split of a sum rounds differently).
    threads = torch.get_num_threads()
    torch.set_num_threads(BUILD_THREADS)
    try:
        if isinstance(recipe, EpisodeStarterRecipe):
            # the episode starter continues its base: built (or found) first
            base_folder = build_starter(recipe.base, show_progress=show_progress)
            return build_episode_starter(recipe, folder, force, show_progress, base_folder)
        return build_from_scratch(recipe, folder, force, show_progress)
    finally:
        torch.set_num_threads(threads)
