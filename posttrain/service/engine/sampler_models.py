"""Every model a sampler can run, found in one place, and the one cache of loaded adapters.

A protocol wing names what it wants to sample as a ``ModelSource``:

- ``base``: the server's base model;
- ``snapshot``: sampler version ``N`` of a live run, the in-memory clone of its adapter
  that ``save_weights_for_sampler`` took (the run's ``LoraModel`` holds its versions and
  loads the one asked for; they go when the run ends);
- ``export``: an adapter a run exported, the PEFT folder ``runs/<run_id>/exports/<name>/``
  (it outlives the run and a restart);
- ``state``: the adapter of a ``save_state``, ``runs/<run_id>/states/<name>/``.

``SamplerModels.model_for(source)`` returns the torch model (on the compute thread).
Saved adapters are loaded onto a shared copy of the base model and the last few are kept
loaded, in one cache for every wing (the OpenAI and tinker wings each kept their own
before). ``sampler_for(model)`` keeps the ``Sampler`` of each recently used model.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from posttrain.policy.sampler import Sampler
from posttrain.service.engine import state
from posttrain.service.engine.lora_model import new_peft_model, shared_copy

SAVED_ADAPTERS_KEPT = 4  # saved adapters kept loaded (each a PEFT tree on the shared base)
SAMPLERS_KEPT = 16
SAVED_KINDS = ("export", "state")


@dataclass(frozen=True)
class ModelSource:
    """What to sample from (module docstring)."""

    kind: str  # "base" | "snapshot" | "export" | "state"
    run_id: str | None = None
    version: int | None = None  # snapshot
    name: str | None = None  # export / state


class RunNotLive(LookupError):
    """A snapshot of a run that has ended (its in-memory versions went with it)."""


class AdapterNotSaved(LookupError):
    """A saved adapter that is not on disk."""


class SamplerModels:
    """Resolves ``ModelSource``s to torch models, loading saved adapters and keeping the
    last few; ``live_models()`` gives each live run's ``LoraModel`` by run id."""

    def __init__(self, base_model: str, policy: Any, state_dir: Path,
                 live_models: Callable[[], dict[str, Any]]):
        self.base_model = base_model
        self.policy = policy
        self.state_dir = state_dir
        self.live_models = live_models
        self._adapters: OrderedDict[tuple[str, str, str], Any] = OrderedDict()
        self._samplers: OrderedDict[int, tuple[Any, Any]] = OrderedDict()
        self._lock = threading.Lock()

    # ------------------------------------------------------------ what there is

    def folder(self, source: ModelSource) -> Path:
        """Where a saved source lives under the state folder."""
        sub = "exports" if source.kind == "export" else "states"
        return state.run_folder(self.state_dir, str(source.run_id)) / sub / str(source.name)

    def is_saved(self, source: ModelSource) -> bool:
        """Is the saved adapter of ``source`` on disk (an export's ``adapter_config.json``,
        a state's ``state.json``)?"""
        marker = "adapter_config.json" if source.kind == "export" else "state.json"
        return (self.folder(source) / marker).is_file()

    def exported_adapters(self) -> list[tuple[str, str, Path]]:
        """``(run_id, name, folder)`` of every adapter exported under the state folder,
        ordered by run and name."""
        found = []
        for config in sorted((self.state_dir / "runs").glob("*/exports/*/adapter_config.json")):
            folder = config.parent
            found.append((folder.parent.parent.name, folder.name, folder))
        return found

    def sampler_versions(self) -> dict[str, list[int]]:
        """Each live run's saved sampler versions, oldest first, by run id."""
        return {run_id: list(model.versions) for run_id, model in self.live_models().items()}

    # ------------------------------------------------------------ models

    def model_for(self, source: ModelSource, *, label: str | None = None) -> Any:
        """The torch model of ``source``; call it on the engine's compute thread.

        Raises ``RunNotLive`` for a snapshot of a run that has ended, ``LookupError`` for a
        version the run did not save, ``AdapterNotSaved`` for a saved adapter not on disk,
        ``ValueError`` for a state saved on another base model (``label`` names the source
        in that message; default ``state <name> of run <run_id>``)."""
        if source.kind == "base":
            return self.policy.model
        if source.kind == "snapshot":
            model = self.live_models().get(str(source.run_id))
            if model is None:
                raise RunNotLive(f"run {source.run_id} has ended, and its sampler snapshots "
                                 "with it")
            return model.model_for(source.version)
        if source.kind not in SAVED_KINDS:
            raise ValueError(f"no model source kind {source.kind!r}")
        key = (source.kind, source.run_id or "", source.name or "")
        with self._lock:
            if key in self._adapters:
                self._adapters.move_to_end(key)
                return self._adapters[key]
        if not self.is_saved(source):
            raise AdapterNotSaved(f"no {source.kind} {source.name!r} in run {source.run_id!r}")
        model = self._load_adapter(source, label or f"state {source.name} of run "
                                   f"{source.run_id}")
        with self._lock:
            self._adapters[key] = model
            while len(self._adapters) > SAVED_ADAPTERS_KEPT:
                self._adapters.popitem(last=False)
        return model

    def _load_adapter(self, source: ModelSource, label: str) -> Any:
        import torch

        base = self.policy.model
        folder = self.folder(source)
        if source.kind == "export":
            import warnings

            from peft import PeftModel

            with warnings.catch_warnings():  # LoRA on a tied unembedding: see new_peft_model
                warnings.filterwarnings("ignore", message=".*tie_word_embeddings.*")
                model = PeftModel.from_pretrained(shared_copy(base), str(folder))
        else:  # a save_state: its adapter tensors are named as the trainer's parameters
            from safetensors.torch import load_file

            info = state.read_state_info(folder)
            if info.get("base_model") != self.base_model:
                raise ValueError(f"{label} was saved on base model "
                                 f"{info.get('base_model')!r}; this server runs "
                                 f"{self.base_model!r}")
            model = new_peft_model(base, state.lora_from_json(info["lora"]))
            tensors = load_file(str(folder / "adapter.safetensors"))
            named = dict(model.named_parameters())
            with torch.no_grad():
                for name, tensor in tensors.items():
                    named[name].copy_(tensor)
        for parameter in model.parameters():
            parameter.requires_grad_(False)
        model.eval()
        return model

    def sampler_for(self, model: Any) -> Any:
        """A ``Sampler`` on ``model`` with the base model's tokenizer (the last few kept)."""
        with self._lock:
            entry = self._samplers.get(id(model))
            if entry is not None and entry[0] is model:
                self._samplers.move_to_end(id(model))
                return entry[1]
        sampler = Sampler(SimpleNamespace(model=model, tokenizer=self.policy.tokenizer))
        with self._lock:
            self._samplers[id(model)] = (model, sampler)
            while len(self._samplers) > SAMPLERS_KEPT:
                self._samplers.popitem(last=False)
        return sampler
