"""``posttrain model build|info``: build the embedded starter models and say where models live."""

from __future__ import annotations

import argparse
import json
import struct
from math import prod
from pathlib import Path
from typing import Any

from posttrain.commands.env_flag import add_env_arg
from posttrain.errors import PosttrainError
from posttrain.policy import models
from posttrain.policy.starter_names import is_starter_name
from posttrain.policy.starters.build import build_starter
from posttrain.policy.starters.gate import StarterProbe
from posttrain.policy.starters.recipes import STARTER_CODE_VERSION
from posttrain.policy.starters.registry import recipe_for, starter_folder


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "model",
        help="build the starter models; show where a model is cached",
        description="Build the embedded starter models and inspect cached models. The models "
        "folder is $POSTTRAIN_MODELS, else ~/.cache/posttrain/models.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True

    build = actions.add_parser(
        "build",
        help="build a starter model (cached after the first build)",
        description="Build a starter model offline from its recipe and cache it.",
    )
    build.add_argument(
        "--name",
        default="starter",
        metavar="NAME",
        help="which starter model: starter (9.1M parameters, the default; with --env, that "
        "environment's own starter), starter-2m (1.6M), starter-multiturn (starter-2m taught "
        "to play refund-multiturn episodes), or NAME@SEED to start from another build seed "
        "(e.g. starter@3)",
    )
    build.add_argument(
        "--env", default=None, metavar="ENV",
        help="build the starter of this environment (a built-in name or file.py:ATTRIBUTE) "
        "from its own hooks: its prompt writer, its reference agent's right moves and its "
        "scripted agent's mistakes, gated on its own rule (docs/policies.md). The refund "
        "rules keep their own starters")
    add_env_arg(build)
    build.add_argument(
        "--prompts-file", default=None, metavar="FILE",
        help="with --env, for an environment without a prompt writer: the JSONL prompts the "
        "starter is built on")
    build.add_argument("--force", action="store_true", help="rebuild even when cached")
    build.set_defaults(func=run_build)

    info = actions.add_parser(
        "info",
        help="where a model is cached, its parameters and (starter) recipe",
        description="Show where a model is cached, its size and, for starter models, the recipe. "
        "Nothing is built or converted.",
    )
    info.add_argument("name", help="starter, starter-2m, starter-multiturn, smollm2, a .gguf "
                      "file or a model folder")
    info.add_argument("--env", default=None, metavar="ENV",
                      help="with starter: that environment's own starter (as model build "
                      "--env builds it)")
    add_env_arg(info)
    info.add_argument("--json", action="store_true", help="print the facts as JSON")
    info.set_defaults(func=run_info)


def run_build(args: argparse.Namespace) -> int:
    if args.prompts_file and not args.env:
        raise PosttrainError("--prompts-file goes with --env (the environment whose starter "
                             "is built on it)")
    # an unknown name, or an environment without the hooks, stops here, before any build
    recipe = recipe_for(args.name, env=args.env, prompts_file=args.prompts_file)
    was_cached = starter_folder(args.name, recipe=recipe).is_dir() and not args.force
    folder = build_starter(args.name, force=args.force, recipe=recipe)
    build = json.loads((folder / "build.json").read_text())
    state = "already built" if was_cached else f"built in {build['seconds']:.0f}s"
    print(f"{recipe.name}: {state}, {build['parameters']:,} parameters")
    print(f"quality gate: {_gate_line(build)}")
    print(f"folder: {folder}")
    return 0


def _gate_line(build: dict[str, Any]) -> str:
    """The gate's verdict on a build, with the build seed it kept and how many it tried."""
    gate = build.get("gate")
    if gate is None:
        return "not recorded (a build from before the gate)"
    tried = [attempt["seed"] for attempt in build.get("attempts", [])]
    word = "passed" if gate == "passed" else "FAILED (the nearest build was kept)"
    seeds = f"build seed {build['build_seed']}"
    if len(tried) > 1:
        seeds += f", after {len(tried) - 1} build seed(s) outside the spec"
    return f"{word}, {seeds}"


def safetensors_parameter_count(folder: str | Path) -> int | None:
    """Parameters stored in a folder's ``*.safetensors`` files (headers only), or None."""
    total, found = 0, False
    for path in sorted(Path(folder).glob("*.safetensors")):
        with path.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
        total += sum(prod(v["shape"]) for k, v in header.items() if k != "__metadata__")
        found = True
    return total if found else None


def model_facts(name: str, env: str | None = None) -> dict[str, Any]:
    """What is known about a model name without building or converting anything (``env``:
    whose ``starter``)."""
    facts: dict[str, Any] = {"name": name, "models_folder": str(models.models_dir())}

    if is_starter_name(name):
        from dataclasses import asdict

        recipe = recipe_for(name, env=env)
        folder = starter_folder(name, recipe=recipe)
        facts.update(kind="starter", folder=str(folder), built=folder.is_dir())
        facts["recipe"] = {
            **asdict(recipe),
            "key": recipe.key(),
            "code_version": STARTER_CODE_VERSION,
        }
        if folder.is_dir():
            facts["build"] = json.loads((folder / "build.json").read_text())
        return facts
    if name == models.SMOLLM2_NAME or name.lower().endswith(".gguf"):
        gguf = models.smollm2_gguf() if name == models.SMOLLM2_NAME else Path(name).expanduser()
        if not gguf.is_file():
            raise PosttrainError(f"{gguf}: no such GGUF file")
        folder = models.models_dir() / "gguf"
        converted = sorted(folder.glob(f"{gguf.stem}-*/config.json")) if folder.is_dir() else []
        facts.update(kind="gguf", gguf=str(gguf), built=bool(converted))
        if converted:
            facts["folder"] = str(converted[-1].parent)
            facts["parameters"] = safetensors_parameter_count(converted[-1].parent)
        return facts
    path = Path(name).expanduser()
    if path.is_dir():
        facts.update(kind="folder", folder=str(path), parameters=safetensors_parameter_count(path))
        return facts
    if "/" not in name:
        raise PosttrainError(
            f"{name!r} is not a model posttrain knows: give starter, starter-2m, starter@N, "
            "smollm2, a local folder, a .gguf file or a hub id (org/name)"
        )
    cached = hub_cache_folder(name)
    facts.update(kind="hub id", note="loaded through the Hugging Face cache",
                 built=cached.is_dir(), folder=str(cached))
    return facts


def hub_cache_folder(hub_id: str) -> Path:
    """Where the Hugging Face cache keeps ``hub_id`` (``$HF_HUB_CACHE``, ``$HF_HOME/hub``
    or ``~/.cache/huggingface/hub``)."""
    import os

    root = os.environ.get("HF_HUB_CACHE") or (
        Path(os.environ["HF_HOME"]) / "hub" if os.environ.get("HF_HOME")
        else Path.home() / ".cache" / "huggingface" / "hub")
    return Path(root) / ("models--" + hub_id.replace("/", "--"))


def run_info(args: argparse.Namespace) -> int:
    facts = model_facts(args.name, env=args.env)
    if args.json:
        print(json.dumps(facts, indent=2, sort_keys=True))
        return 0
    print(f"{facts['name']} ({facts['kind']})")
    print(f"  models folder: {facts['models_folder']}")
    if "gguf" in facts:
        print(f"  gguf file:     {facts['gguf']}")
    if facts["kind"] == "hub id" and not facts["built"]:
        print(f"  folder:        {facts['folder']}  (not in the Hugging Face cache: offline it "
              "cannot be loaded; download it where there is network, or give a local folder)")
        return 1
    if "folder" in facts:
        env_flag = f" --env {args.env}" if args.env else ""
        hint = f"  (not built yet: posttrain model build --name {facts['name']}{env_flag})"
        state = "" if facts.get("built", True) else hint
        print(f"  folder:        {facts['folder']}{state}")
    elif facts["kind"] == "gguf":
        print("  folder:        (not converted yet: the first load converts and caches it)")
    build = facts.get("build", {})
    parameters = build.get("parameters", facts.get("parameters"))
    if parameters:
        print(f"  parameters:    {parameters:,}")
    if build:
        loss = build.get("final_loss")
        loss_text = f", final SFT loss {loss:.3f}" if loss is not None else ""
        print(f"  built in:      {build['seconds']}s{loss_text}")
        if "recipe" in facts:
            print(f"  quality gate:  {_gate_line(build)}")
            for attempt in build.get("attempts", []):
                probe = StarterProbe(**attempt["probe"]).describe()
                verdict = "; ".join(attempt["failures"]) or "meets the spec"
                print(f"    build seed {attempt['seed']}: {probe} -> {verdict}")
    if "recipe" in facts:
        recipe = facts["recipe"]
        arch = recipe["architecture"]
        print(
            f"  recipe:        key {recipe['key']}, hidden {arch['hidden_size']}, "
            f"{arch['num_layers']} layers; steps: "
            f"skill {recipe['skill_steps']}, mix {recipe['mix_steps']}, lr "
            f"{recipe['learning_rate']}; data seed {recipe['data_seed']}, first build seed "
            f"{recipe['seed']}"
        )
        mix = ", ".join(f"{k} {v}" for k, v in recipe["mix"].items())
        print(f"  behaviour mix: {mix}")
        spec = recipe["spec"]
        ranges = ", ".join(
            f"{r['category']} {r['low']:.2f}-{r['high']:.2f}" for r in spec["pass_rates"]
        )
        print(f"  spec:          copy rate >= {spec['min_copy_rate']:.2f} (where the rule "
              f"copies); pass rates {ranges}")
    if "note" in facts:
        print(f"  {facts['note']}")
    return 0
