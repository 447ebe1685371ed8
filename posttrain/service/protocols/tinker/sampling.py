"""What a tinker sampling session samples from, and the sampling itself.

A sampling session (``create_sampling_session``, or the unnamed
``save_weights_for_sampler`` behind ``save_weights_and_get_sampling_client``) names a
``SamplerSource``:

- ``base``: the server's base model;
- ``snapshot``: sampler version ``N`` of a live run, the in-memory clone of its adapter
  that ``save_weights_for_sampler`` took (cheap, so the RL loops can take one per step;
  it goes when the run ends);
- ``sampler_weights``: a named sampler save, the PEFT adapter folder
  ``runs/<run_id>/exports/<name>/`` (it outlives the run and a restart);
- ``weights``: a ``save_state`` folder's adapter (``runs/<run_id>/states/<name>/``).

Sampling runs on the engine's compute thread, between the training primitives. Sample
``i`` of a request uses seed ``seed + i`` (a seed is drawn when none is given); logprobs
are the log-softmax of the raw logits (temperature 1) at each sampled token, the quantity
the trainer computes, so importance ratios start at 1. ``prompt_logprobs`` are the
model's logprobs of each prompt token given the ones before it, None (NaN on the wire) at
position 0 and before the last ``prompt_logprobs_last_n`` when that is set. Stop strings
and stop token ids end a sequence like an end-of-turn token and stay in its tokens; a
sequence that ends any way but running out of ``max_tokens`` has stop reason ``stop``.
"""

from __future__ import annotations

import random
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from posttrain.policy.sampler import Sampler, SamplingParams
from posttrain.service.engine import state
from posttrain.service.engine.errors import NotFound
from posttrain.service.engine.lora_model import new_peft_model, shared_copy, target_logprobs
from posttrain.service.protocols.tinker.proto import SampledSequenceWire, encode_sample_response
from posttrain.service.protocols.tinker.requests import SampleJob

LOADED_ADAPTERS_KEPT = 4  # saved adapters kept loaded (each a PEFT tree on the shared base)
SAMPLERS_KEPT = 16


@dataclass(frozen=True)
class SamplerSource:
    """What a sampling session samples from (module docstring)."""

    kind: str  # "base" | "snapshot" | "sampler_weights" | "weights"
    run_id: str | None = None
    version: int | None = None  # snapshot
    name: str | None = None  # sampler_weights / weights

    @property
    def model_path(self) -> str | None:
        """The ``tinker://`` path of a saved source (None for the base and snapshots)."""
        if self.kind in ("sampler_weights", "weights"):
            return f"tinker://{self.run_id}/{self.kind}/{self.name}"
        return None


class TinkerSampling:
    """Resolves sources to torch models (loading saved adapters, keeping the last few) and
    samples them; every torch call runs on the engine's compute thread."""

    def __init__(self, engine: Any):
        self.engine = engine
        self._adapters: OrderedDict[tuple[str, str, str], Any] = OrderedDict()
        self._samplers: OrderedDict[int, tuple[Any, Any]] = OrderedDict()
        self._lock = threading.Lock()

    # ------------------------------------------------------------ sources

    def folder(self, source: SamplerSource) -> Path:
        """Where a saved source lives under the state folder."""
        sub = "exports" if source.kind == "sampler_weights" else "states"
        return state.run_folder(self.engine.state_dir, source.run_id) / sub / source.name

    def check_saved(self, source: SamplerSource) -> None:
        """``NotFound`` naming the path when a saved source is not on disk."""
        marker = "adapter_config.json" if source.kind == "sampler_weights" else "state.json"
        if not (self.folder(source) / marker).is_file():
            what = "sampler weights" if source.kind == "sampler_weights" else "saved state"
            raise NotFound(f"{source.model_path}: no {what} {source.name!r} in run "
                           f"{source.run_id!r} (save_weights_for_sampler(name) and save_state "
                           "return the paths that exist)")

    def _model_for(self, source: SamplerSource) -> Any:
        """The torch model of ``source`` (compute thread)."""
        if source.kind == "base":
            return self.engine.policy.model
        if source.kind == "snapshot":
            model = self.engine.run_models().get(source.run_id)
            if model is None:
                raise LookupError(
                    f"run {source.run_id} has ended, and its in-memory sampler snapshots with "
                    "it; save named sampler weights (save_weights_for_sampler(name)) to sample "
                    "a run after it ends")
            return model._model_for(source.version)
        key = (source.kind, source.run_id or "", source.name or "")
        with self._lock:
            if key in self._adapters:
                self._adapters.move_to_end(key)
                return self._adapters[key]
        self.check_saved(source)
        model = self._load_adapter(source)
        with self._lock:
            self._adapters[key] = model
            while len(self._adapters) > LOADED_ADAPTERS_KEPT:
                self._adapters.popitem(last=False)
        return model

    def _load_adapter(self, source: SamplerSource) -> Any:
        import torch

        base = self.engine.policy.model
        folder = self.folder(source)
        if source.kind == "sampler_weights":
            import warnings

            from peft import PeftModel

            with warnings.catch_warnings():  # LoRA on a tied unembedding: see new_peft_model
                warnings.filterwarnings("ignore", message=".*tie_word_embeddings.*")
                model = PeftModel.from_pretrained(shared_copy(base), str(folder))
        else:  # a save_state: its adapter tensors are named as the trainer's parameters
            from safetensors.torch import load_file

            info = state.read_state_info(folder)
            if info.get("base_model") != self.engine.base_model:
                raise ValueError(f"{source.model_path} was saved on base model "
                                 f"{info.get('base_model')!r}; this server runs "
                                 f"{self.engine.base_model!r}")
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

    def _sampler_for(self, model: Any) -> Any:
        with self._lock:
            entry = self._samplers.get(id(model))
            if entry is not None and entry[0] is model:
                self._samplers.move_to_end(id(model))
                return entry[1]
        sampler = Sampler(SimpleNamespace(model=model, tokenizer=self.engine.policy.tokenizer))
        with self._lock:
            self._samplers[id(model)] = (model, sampler)
            while len(self._samplers) > SAMPLERS_KEPT:
                self._samplers.popitem(last=False)
        return sampler

    # ------------------------------------------------------------ sampling

    def sample(self, source: SamplerSource, job: SampleJob) -> bytes:
        """Sample ``job`` from ``source``; the protobuf ``SampleResponse`` bytes. Waits for
        the compute thread."""
        return self.engine.compute.run(self._sample, source, job)

    def _sample(self, source: SamplerSource, job: SampleJob) -> bytes:
        model = self._model_for(source)
        sampler = self._sampler_for(model)
        seed = job.seed if job.seed is not None else random.SystemRandom().randrange(2**62)
        params = SamplingParams(temperature=job.temperature, top_p=job.top_p, top_k=job.top_k,
                                max_new_tokens=job.max_tokens, stop_strings=job.stop_strings,
                                stop_token_ids=job.stop_token_ids)
        prompt = list(job.prompt)
        completions = sampler.sample_tokens([prompt] * job.num_samples,
                                            [seed + i for i in range(job.num_samples)], params)
        sequences = [SampledSequenceWire(stopped=completion.stop_reason != "length",
                                         tokens=completion.token_ids,
                                         logprobs=completion.logprobs)
                     for completion in completions]
        prompt_logprobs = None
        if job.prompt_logprobs:
            prompt_logprobs = self._prompt_logprobs(model, prompt, job.prompt_logprobs_last_n)
        return encode_sample_response(sequences, prompt_logprobs)

    def _prompt_logprobs(self, model: Any, prompt: list[int], last_n: int | None
                         ) -> list[float | None]:
        import torch

        values: list[float | None] = [None]
        if len(prompt) > 1:
            pad_id = self.engine.policy.tokenizer.pad_token_id or 0
            with torch.no_grad():
                for _, (logprobs,) in target_logprobs(model, [tuple(prompt[:-1])],
                                                      [prompt[1:]], pad_id):
                    values += logprobs.tolist()
        if last_n is not None:
            values[: len(values) - last_n] = [None] * (len(values) - last_n)
        return values
