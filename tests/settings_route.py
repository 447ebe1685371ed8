"""The route a recipe run's settings take through posttrain's modules before its step,
measured while the run runs.

A reader follows a run from ``run_<recipe>`` to the training step by following the
settings: which functions are they handed to, in which module, in what order? This
records exactly that with ``sys.setprofile``: every call of a posttrain function that
receives a recipe's settings object (a ``RecipeSettings``, the cold start's SFT settings
included) or the run's plan, which carries them (``posttrain.train.plan``), as an
argument, from the route's first function to the step, grouped into visits of modules.
A visit to a module the route had already left is a *return*: the reader has to go back
to a file they were done with.

By default a method of the settings themselves (``settings.check()``,
``settings.name_run_for(...)``: ``self`` is the settings) is not a hand-over: the
settings class is one type spread over its recipe's ``settings.py``, ``train/settings.py``
and ``data/prepare.py`` (``DataFlags``), and calling its methods reads the settings, it
does not pass them on. ``own_methods=True`` counts those calls too.

Run from the repository root (the embedded starter-2m model, about 20 s after its build)::

    .venv/bin/python -m tests.settings_route grpo --base-model starter-2m --prompts 40 \\
        --eval-samples 2 --num-generations 4 --steps 2 --cold-start sft --cold-start-steps 3

``--own-methods`` before the recipe counts the settings' own methods too.
"""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import posttrain
from posttrain.cli import main as posttrain_main
from posttrain.train.grpo.plan import GRPOPlan
from posttrain.train.plan import TrainerPlan
from posttrain.train.settings import RecipeSettings

PACKAGE = str(Path(posttrain.__file__).parent) + os.sep


@dataclass
class Visit:
    """One stay in a module: the functions the settings were handed to there, in order."""

    module: str  # the path under posttrain/
    functions: list[str] = field(default_factory=list)
    returned: bool = False  # the route had left this module before


@dataclass
class SettingsRoute:
    """The visits from the route's first function (``start``) to the step (``step``)."""

    start: str  # "MODULE:FUNCTION", the module under posttrain/
    step: str
    visits: list[Visit] = field(default_factory=list)
    reached: bool = False  # whether the step was called

    @property
    def modules(self) -> list[str]:
        return list(dict.fromkeys(visit.module for visit in self.visits))

    @property
    def returns(self) -> int:
        return sum(visit.returned for visit in self.visits)

    def add(self, module: str, function: str) -> None:
        if self.visits and self.visits[-1].module == module:
            self.visits[-1].functions.append(function)
            return
        returned = any(visit.module == module for visit in self.visits)
        self.visits.append(Visit(module, [function], returned))

    def describe(self) -> str:
        lines = [f"{index:3}  {visit.module:34} {'RETURN' if visit.returned else '      '}  "
                 + ", ".join(dict.fromkeys(visit.functions))
                 for index, visit in enumerate(self.visits, 1)]
        lines.append(f"{self.start} -> {self.step}: {len(self.modules)} modules, "
                     f"{self.returns} returns to a module already left"
                     + ("" if self.reached else " (the step was never called)"))
        return "\n".join(lines)


def _carries_settings(value: Any) -> bool:
    """The settings themselves, or a run's plan (``posttrain.train.plan``), which carries
    the settings as planned (the step takes the plan)."""
    return isinstance(value, (RecipeSettings, TrainerPlan, GRPOPlan))


def _settings_given(frame: FrameType, own_methods: bool) -> bool:
    code = frame.f_code
    names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
    given = [name for name in names if _carries_settings(frame.f_locals.get(name))]
    if not own_methods and given == ["self"]:
        return False
    return bool(given)


def trace_settings_route(argv: list[str], *, start: str, step: str,
                         own_methods: bool = False) -> tuple[int, SettingsRoute]:
    """Run ``posttrain ARGV`` in this process; return its exit code and the route its
    settings took from ``start`` to ``step`` (each ``MODULE:FUNCTION``, the module's path
    under ``posttrain/``, as ``train/grpo/run.py:run_grpo``)."""
    route = SettingsRoute(start, step)
    state = {"started": False}

    def watch(frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call" or route.reached:
            return
        code = frame.f_code
        if not code.co_filename.startswith(PACKAGE):
            return
        where = f"{code.co_filename[len(PACKAGE):]}:{code.co_name}"
        if where == start:
            state["started"] = True
        if not state["started"] or not _settings_given(frame, own_methods):
            return
        route.add(code.co_filename[len(PACKAGE):], code.co_qualname)
        if where == step:
            route.reached = True
            sys.setprofile(None)  # the step is reached: the rest of the run at full speed

    sys.setprofile(watch)
    try:
        code = posttrain_main(argv)
    finally:
        sys.setprofile(None)
    return code, route


def main(arguments: list[str]) -> int:
    own_methods = bool(arguments) and arguments[0] == "--own-methods"
    argv = arguments[1:] if own_methods else arguments
    if not argv or argv[0] not in ("grpo", "dpo", "sft"):
        print("usage: python -m tests.settings_route [--own-methods] grpo|dpo|sft "
              "[posttrain flags...]", file=sys.stderr)
        return 2
    recipe = argv[0]
    with tempfile.TemporaryDirectory(prefix="settings-route-") as runs:
        if "--runs-dir" not in argv:
            argv = [*argv, "--runs-dir", runs]
        code, route = trace_settings_route(
            argv, start=f"train/{recipe}/run.py:run_{recipe}",
            step=f"train/{recipe}/trainer.py:train_{recipe}", own_methods=own_methods)
    print(route.describe())
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
