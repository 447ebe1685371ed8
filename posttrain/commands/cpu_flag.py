"""``--numerics auto|pinned|native`` on every command, and the process's CPU set-up made
from it before torch loads (``posttrain.cpu_numerics``): which model a command runs
decides ``auto`` (an embedded starter: pinned; a real model: native).
"""

from __future__ import annotations

import argparse
from typing import Any

from posttrain.cpu_numerics import (
    NUMERICS,
    NUMERICS_VARIABLE,
    PINNED_THREADS,
    CpuSetup,
    choose_numerics,
    set_up_cpu,
)
from posttrain.errors import PosttrainError
from posttrain.policy.starter_names import is_starter_name
from posttrain.runs.folder import from_run_base_model, runs_root

NUMERICS_HELP = (
    "how torch computes on a CPU: pinned (the same bits on every x86-64 CPU with AVX2: "
    "ATen, MKL and oneDNN held to AVX2, "
    f"{PINNED_THREADS} threads), native (this CPU's fastest kernels: AVX-512, native bf16, "
    "every core; the bits are this machine's) or auto (pinned for the embedded starters, "
    f"native for a real model). Default: ${NUMERICS_VARIABLE}, else auto. Every command "
    "also lets idle OpenMP threads sleep (OMP_WAIT_POLICY=PASSIVE) unless the environment "
    "names a policy; an OMP_NUM_THREADS you set is kept")


def add_numerics_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--numerics", choices=NUMERICS, default=None, help=NUMERICS_HELP)


def runs_an_embedded_model(base_model: str | None, *, from_run: str | None = None,
                           runs_dir: str | None = None) -> bool:
    """Whether a command with this ``--base-model`` (None: the environment's starter, or
    ``--from-run``'s base) runs one of the embedded starters."""
    if base_model is None and from_run:
        try:
            base_model = from_run_base_model(runs_root(runs_dir), from_run, None)
        except PosttrainError:
            return True  # the command refuses the run itself, with its own words
    return base_model is None or is_starter_name(base_model)


def set_up_cpu_for(asked: str | None, base_model: str | None, *, from_run: str | None = None,
                   runs_dir: str | None = None, previous: CpuSetup | None = None) -> CpuSetup:
    """The process's numerics for a command running ``base_model`` (see
    ``runs_an_embedded_model``), set before torch loads; ``previous``: the set-up an
    earlier call made (a recipe's ``--config`` can name another model than its flags)."""
    try:
        mode, reason = choose_numerics(asked, embedded_model=runs_an_embedded_model(
            base_model, from_run=from_run, runs_dir=runs_dir))
    except ValueError as error:
        raise PosttrainError(str(error)) from None
    return set_up_cpu(mode, reason, previous=previous)


def set_up_cpu_from_args(args: argparse.Namespace) -> CpuSetup:
    """The set-up for a parsed command line (``posttrain.cli.main``, before the command
    runs)."""
    def given(name: str) -> str | None:
        # a recipe's flags left out read as an ``Unset`` marker (its --config may name them)
        value: Any = getattr(args, name, None)
        return value if isinstance(value, str) else None

    model = given("base_model")
    if model is None and getattr(args, "command", None) == "model":
        model = given("name")  # posttrain model build --name starter@3
    return set_up_cpu_for(given("numerics"), model, from_run=given("from_run"),
                          runs_dir=given("runs_dir"))
