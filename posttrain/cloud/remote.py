"""What the Modal app (``posttrain/cloud/modal_app.py``) runs, kept free of ``modal`` so
it is tested here without an account.

On the laptop, ``plan_launch`` splits ``--gpu`` from the recipe's own flags and checks
those flags with the same parser ``posttrain`` uses, so a typo fails before a GPU is paid
for. In the container, ``run_in_container`` calls the same entry point as the command line
(``posttrain.cli.main``) with the same flags; the volume holds the runs and the model cache
(``container_environment``), and the run's store events go to the dashboard over HTTP.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posttrain.cli import build_parser, main
from posttrain.errors import PosttrainError
from posttrain.runs.folder import runs_root
from posttrain.runs.postgres_store import is_postgres_url

VOLUME_NAME = "posttrain"  # the Modal Volume holding runs/, models/ and hf/
VOLUME_ROOT = "/posttrain"  # where the container mounts it
SECRET_NAME = "posttrain"  # a Modal Secret with POSTTRAIN_TOKEN, shared by dashboard and runs
COMMANDS = ("grpo", "dpo", "sft", "eval")
DEFAULT_GPU = "A10G"
DASHBOARD_PORT = 8765
#: flags naming a file on the laptop, which the container does not have
FILE_FLAGS = ("--config", "--prompts-file", "--pairs", "--demos")


@dataclass(frozen=True)
class LaunchPlan:
    """One remote run: the command, its flags (without ``--gpu``), the GPU, the run name."""

    command: str
    argv: tuple[str, ...]
    gpu: str | None  # None: a CPU container
    run_name: str | None  # None for eval


def split_gpu(raw: list[str]) -> tuple[str | None, list[str]]:
    """``--gpu X`` / ``--gpu=X`` out of the flags; ``none`` or ``cpu`` means no GPU."""
    gpu, rest, index = DEFAULT_GPU, [], 0
    while index < len(raw):
        flag = raw[index]
        if flag == "--gpu":
            if index + 1 >= len(raw):
                raise PosttrainError("--gpu needs a value: a Modal GPU type such as A10G, "
                                     "L4, A100, H100 (or none)")
            gpu, index = raw[index + 1], index + 2
            continue
        if flag.startswith("--gpu="):
            gpu = flag.split("=", 1)[1]
        else:
            rest.append(flag)
        index += 1
    return (None if gpu.lower() in ("none", "cpu", "") else gpu), rest


def plan_launch(command: str, raw: list[str] | tuple[str, ...]) -> LaunchPlan:
    """Check a remote run's flags here, before any container starts."""
    if command not in COMMANDS:
        raise PosttrainError(f"{command!r}: the Modal app runs {', '.join(COMMANDS)}")
    gpu, argv = split_gpu(list(raw))
    for index, flag in enumerate(argv):
        name, _, inline = flag.partition("=")
        if name == "--runs-dir":
            raise PosttrainError(f"--runs-dir: on Modal the runs live on the volume "
                                 f"{VOLUME_NAME!r} ({VOLUME_ROOT}/runs); leave it out")
        if name == "--store":
            value = inline or (argv[index + 1] if index + 1 < len(argv) else "")
            if not is_postgres_url(value):
                raise PosttrainError(
                    f"--store {value}: on Modal a run writes to the volume's store, or to a "
                    f"PostgreSQL database the container can reach (--store "
                    f"postgresql://user:password@host/db); a file here is not there")
        if name in FILE_FLAGS:
            value = inline or (argv[index + 1] if index + 1 < len(argv) else "")
            if value != "reference" and not value.startswith(VOLUME_ROOT + "/"):
                raise PosttrainError(
                    f"{name} {value}: that file is on this machine, not in the container; "
                    f"upload it (modal volume put {VOLUME_NAME} {value} files/"
                    f"{Path(value).name}) and pass {VOLUME_ROOT}/files/{Path(value).name}")
    with contextlib.redirect_stderr(io.StringIO()) as errors:
        try:
            parsed = build_parser().parse_args([command, *argv])
        except SystemExit:
            raise PosttrainError(f"posttrain {command}: "
                                 + (errors.getvalue().strip().splitlines() or ["bad flags"])[-1]
                                 ) from None
    return LaunchPlan(command, tuple(argv), gpu, getattr(parsed, "run_name", None))


def container_environment(volume_root: str = VOLUME_ROOT, dashboard_url: str | None = None
                          ) -> dict[str, str]:
    """The variables a recipe container runs with: runs and model caches on the volume, and
    with a dashboard its URL as the run store (POSTTRAIN_TOKEN comes from the Secret)."""
    environment = {
        "POSTTRAIN_RUNS": f"{volume_root}/runs",
        "POSTTRAIN_MODELS": f"{volume_root}/models",
        "HF_HOME": f"{volume_root}/hf",
        "PYTHONUNBUFFERED": "1",
    }
    if dashboard_url:
        environment["POSTTRAIN_SERVER"] = dashboard_url.rstrip("/")
    return environment


def dashboard_command(volume_root: str = VOLUME_ROOT) -> list[str]:
    """``posttrain ui`` on every interface, for Modal's web proxy (writes need the token)."""
    return ["posttrain", "ui", "--host", "0.0.0.0", "--port", str(DASHBOARD_PORT),
            "--runs-dir", f"{volume_root}/runs"]


def run_in_container(command: str, argv: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """Run ``posttrain COMMAND ARGV`` through the command line's own entry point and hand
    back what the laptop prints: the exit code, the run's summary and its report."""
    code = main([command, *argv])
    plan = plan_launch(command, [*argv, "--gpu", "none"])
    result: dict[str, Any] = {"exit_code": code, "run_name": plan.run_name}
    if plan.run_name:
        folder = runs_root(None) / plan.run_name
        result["run_folder"] = str(folder)
        summary = folder / "summary.json"
        report = folder / "report.md"
        result["summary"] = json.loads(summary.read_text()) if summary.is_file() else None
        result["report"] = report.read_text() if report.is_file() else None
    return result


def volume_path(run_folder: str, volume_root: str = VOLUME_ROOT) -> str:
    """A path in the container as the volume names it (for ``modal volume get``)."""
    return os.path.relpath(run_folder, volume_root)
