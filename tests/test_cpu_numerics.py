"""How a command sets torch's CPU numerics before torch loads (posttrain.cpu_numerics,
posttrain.commands.cpu_flag): pinned kernels and threads for the embedded starters, the
CPU's own for a real model, passive waiting everywhere, and what the user set kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.cli import build_parser, command_leaves
from posttrain.commands.cpu_flag import runs_an_embedded_model
from posttrain.cpu_numerics import (
    NUMERICS_VARIABLE,
    PINNED_KERNELS,
    PINNED_THREADS,
    choose_numerics,
    set_up_cpu,
)

ROOT = Path(__file__).resolve().parents[1]
#: what scripts/test.sh or a user's shell may have set, removed for the commands below
DECIDING = (*PINNED_KERNELS, "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY",
            NUMERICS_VARIABLE)


def test_auto_pins_the_embedded_starters_and_frees_a_real_model():
    assert choose_numerics(None, embedded_model=True, environ={})[0] == "pinned"
    mode, reason = choose_numerics(None, embedded_model=False, environ={})
    assert mode == "native" and "real model" in reason
    assert choose_numerics("native", embedded_model=True, environ={}) == (
        "native", "--numerics native")
    # the environment variable where no flag is given; the flag over it
    environ = {NUMERICS_VARIABLE: "pinned"}
    assert choose_numerics(None, embedded_model=False, environ=environ)[0] == "pinned"
    assert choose_numerics("native", embedded_model=False, environ=environ)[0] == "native"
    with pytest.raises(ValueError, match="POSTTRAIN_NUMERICS 'fast': expected one of"):
        choose_numerics(None, embedded_model=True, environ={NUMERICS_VARIABLE: "fast"})


def test_which_models_are_embedded():
    assert runs_an_embedded_model(None)  # the environment's own starter
    assert runs_an_embedded_model("starter-2m") and runs_an_embedded_model("starter@3")
    assert not runs_an_embedded_model("smollm2")
    assert not runs_an_embedded_model("HuggingFaceTB/SmolLM2-135M-Instruct")


def test_pinned_sets_the_kernels_threads_and_waiting_and_keeps_what_was_set():
    environ: dict[str, str] = {}
    setup = set_up_cpu("pinned", "test", environ=environ, torch_loaded=False)
    assert environ == setup.applied == {
        **PINNED_KERNELS, "OMP_NUM_THREADS": str(PINNED_THREADS),
        "MKL_NUM_THREADS": str(PINNED_THREADS), "OMP_WAIT_POLICY": "PASSIVE"}
    # a second set-up (a --config naming a real model) takes the first one's back
    native = set_up_cpu("native", "test", environ=environ, previous=setup, torch_loaded=False)
    assert environ == native.applied == {"OMP_WAIT_POLICY": "PASSIVE"}
    # what the user set is kept: their threads, their wait policy
    environ = {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "ACTIVE"}
    mine = set_up_cpu("pinned", "test", environ=environ, torch_loaded=False)
    assert environ == {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "ACTIVE", **PINNED_KERNELS}
    assert mine.threads == "1"


def test_after_torch_loaded_the_set_up_touches_nothing_and_says_so():
    environ: dict[str, str] = {}
    setup = set_up_cpu("pinned", "test", environ=environ, torch_loaded=True)
    assert setup.late and setup.applied == {} and environ == {}


def test_every_command_takes_numerics_with_help():
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    leaves = [leaf for command in commands.values() for leaf in command_leaves(command)]
    assert len(leaves) > len(commands)  # model build, runs list, ... are commands too
    for leaf in leaves:
        options = {option for action in leaf._actions for option in action.option_strings}
        assert "--numerics" in options, leaf.prog
    assert build_parser().parse_args(["model", "build", "--numerics", "native"]).numerics \
        == "native"
    help_text = commands["grpo"].format_help()
    assert "OMP_WAIT_POLICY=PASSIVE" in help_text and "POSTTRAIN_NUMERICS" in help_text


def _plan_only(tmp_path: Path, model: str, *flags: str,
               environ: dict[str, str] | None = None) -> dict:
    """``posttrain grpo --plan-only`` on ``model`` in a fresh process, with none of the
    deciding variables inherited; its config's record of the process's numerics."""
    env = {key: value for key, value in os.environ.items() if key not in DECIDING}
    env.update(environ or {}, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    runs = tmp_path / "runs"
    result = subprocess.run(
        [sys.executable, "-m", "posttrain", "grpo", "--base-model", model, "--prompts",
         "40", "--eval-samples", "1", "--plan-only", "--runs-dir", str(runs), "--run-name",
         "n", *flags], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads((runs / "n" / "config.json").read_text())["resolved"]["numerics"]


@pytest.mark.slow
def test_a_starter_run_computes_pinned_and_a_native_one_on_its_cpu(starter_2m_folder,
                                                                     tmp_path):
    import torch

    pinned = _plan_only(tmp_path / "a", "starter-2m")
    assert pinned["cpu_capability"] == "AVX2" and pinned["torch_threads"] == PINNED_THREADS
    assert {name: pinned[name] for name in PINNED_KERNELS} == PINNED_KERNELS
    assert pinned["OMP_WAIT_POLICY"] == "PASSIVE"
    # a model named by its folder is a real model to auto: native (by name, starter-2m
    # native would be a build of its own, keyed by those numerics: minutes)
    native = _plan_only(tmp_path / "b", str(starter_2m_folder))
    assert native["ATEN_CPU_CAPABILITY"] is None and native["OMP_WAIT_POLICY"] == "PASSIVE"
    # the CPU's own kernels: what a torch with nothing set picks here
    fresh = subprocess.run([sys.executable, "-c", "import torch; print(torch.backends.cpu."
                            "get_cpu_capability())"], capture_output=True, text=True,
                           env={k: v for k, v in os.environ.items() if k not in DECIDING},
                           timeout=120)
    assert native["cpu_capability"] == fresh.stdout.strip()
    assert torch.backends.cpu.get_cpu_capability()  # this process's, whatever it is
