"""The Modal app, as far as it can be tested without a Modal account: the `modal` CLI loads
it and finds its entry points, its image pins what constraints.txt pins, the flags are
checked on the laptop, and the container's function runs the command line's own entry
point with the same flags (a real run on the tiny starter, in a folder standing in for
the volume)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.cloud import remote
from posttrain.errors import PosttrainError

ROOT = Path(__file__).parents[1]
APP = str(ROOT / "posttrain" / "cloud" / "modal_app.py")


def modal_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "modal", *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)


def test_the_modal_cli_loads_the_app_and_finds_every_entry_point():
    done = modal_cli("run", f"{APP}::grpo", "--help")
    assert done.returncode == 0, done.stderr
    assert "modal run" in done.stdout and "::grpo" in done.stdout
    listed = modal_cli("run", f"{APP}::nosuch")
    assert listed.returncode != 0
    text = listed.stdout + listed.stderr
    for name in ("app.grpo", "app.dpo", "app.sft", "app.eval", "app.run_recipe"):
        assert name in text, text


def test_without_an_account_modal_says_so_instead_of_hanging():
    done = modal_cli("run", f"{APP}::grpo", "--steps", "3")
    assert done.returncode != 0
    assert "Token missing" in done.stdout + done.stderr


def test_the_image_pins_what_constraints_pins():
    from posttrain.cloud.modal_app import pinned_requirements

    pins = pinned_requirements()
    constraints = (ROOT / "constraints.txt").read_text().splitlines()
    for package in ("torch", "transformers", "trl", "peft", "accelerate", "datasets"):
        line = next(line for line in constraints if line.startswith(f"{package}=="))
        assert line in pins
    assert not any(pin.startswith(("hypothesis", "tensorboardX")) for pin in pins)


def test_gpu_is_split_from_the_recipe_flags_and_the_flags_are_checked_here():
    plan = remote.plan_launch("grpo", ["--gpu", "H100", "--steps", "3", "--run-name", "q"])
    assert (plan.gpu, plan.argv, plan.run_name) == ("H100", ("--steps", "3", "--run-name", "q"),
                                                     "q")
    assert remote.plan_launch("dpo", []).gpu == remote.DEFAULT_GPU
    assert remote.plan_launch("sft", ["--gpu=none"]).gpu is None
    assert remote.plan_launch("eval", ["--base-model", "starter"]).run_name is None
    with pytest.raises(PosttrainError, match="--stepz"):
        remote.plan_launch("grpo", ["--stepz", "3"])
    with pytest.raises(PosttrainError, match="the Modal app runs grpo, dpo, sft, eval"):
        remote.plan_launch("serve", [])
    with pytest.raises(PosttrainError, match="the runs live on the volume"):
        remote.plan_launch("grpo", ["--runs-dir", "/tmp/x"])
    with pytest.raises(PosttrainError, match=r"modal volume put posttrain grid\.toml"):
        remote.plan_launch("grpo", ["--config", "grid.toml"])
    with pytest.raises(PosttrainError, match="--gpu needs a value"):
        remote.plan_launch("grpo", ["--gpu"])
    # a team's PostgreSQL store by URL is fine; a SQLite file on the laptop is not there
    url = "postgresql://team:pw@db.example.com/runs"
    assert remote.plan_launch("grpo", ["--store", url]).argv == ("--store", url)
    with pytest.raises(PosttrainError, match="a file here is not there"):
        remote.plan_launch("grpo", ["--store=runs/posttrain.db"])
    # a file already on the volume, and the reference demonstrations, are fine
    remote.plan_launch("grpo", ["--prompts-file", "/posttrain/files/p.jsonl"])
    remote.plan_launch("sft", ["--demos", "reference"])


def test_the_container_runs_the_command_lines_entry_point_with_the_same_flags(
        starter_2m_folder, tmp_path, monkeypatch):
    from posttrain.cli import build_parser
    from posttrain.commands.recipe_command import settings_for
    from posttrain.train.grpo.settings import GRPOSettings

    flags = ["--base-model", "starter-2m", "--prompts", "60", "--steps", "1",
             "--num-generations", "4", "--eval-samples", "1", "--eval-repeats", "1",
             "--monitor-every", "0", "--run-name", "cloud"]
    volume = tmp_path / "volume"
    environment = remote.container_environment(str(volume), "http://127.0.0.1:9")
    assert environment["POSTTRAIN_SERVER"] == "http://127.0.0.1:9"
    environment.pop("POSTTRAIN_SERVER")  # no dashboard here: the store stays in the volume
    environment.pop("POSTTRAIN_MODELS")  # reuse the test's starter build
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    result = remote.run_in_container("grpo", flags)
    assert result["exit_code"] in (0, 1)
    assert result["run_name"] == "cloud"
    assert Path(result["run_folder"]) == volume / "runs" / "cloud"
    assert remote.volume_path(result["run_folder"], str(volume)) == "runs/cloud"
    assert result["summary"]["status"] == "done"
    assert "pass@1" in result["report"]
    # the same flags through the command line on a laptop: the same settings (the run's
    # config.json against what the laptop's parser makes of the flags; the recipe changes
    # none of them here: base model and run name are given)
    args = build_parser().parse_args(["grpo", *flags, "--runs-dir", str(tmp_path / "laptop")])
    local_settings = settings_for(GRPOSettings, args, "grpo").to_config()
    remote_settings = json.loads((volume / "runs" / "cloud" / "config.json").read_text())
    remote_settings["settings"].pop("runs_dir")
    local_settings.pop("runs_dir")
    assert remote_settings["settings"] == local_settings
