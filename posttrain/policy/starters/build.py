"""The starter build step: a starter's recipe built into its cache folder, once.

``build_starter`` is what ``posttrain model build`` runs, and what loading a starter name
runs when ``registry.cached_starter`` finds no build (``posttrain.policy.loading``). One
process builds a recipe at a time (a lock file beside the folder), the others wait and
reuse it; a build is atomic (a temp folder, then a rename). Every build runs torch on
``BUILD_THREADS`` threads, so on one machine a recipe gives the same weights, byte for
byte, whatever the core count.
"""

from __future__ import annotations

import fcntl
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from posttrain.policy.starters.episodes import EpisodeStarterRecipe, build_episode_starter
from posttrain.policy.starters.recipes import BUILD_THREADS, StarterRecipe
from posttrain.policy.starters.registry import recipe_for, starter_folder
from posttrain.policy.starters.scratch import build_from_scratch


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
