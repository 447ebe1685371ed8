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
from dataclasses import dataclass
from typing import Any

from posttrain.policy.sampler import SamplingParams
from posttrain.service.engine.errors import NotFound
from posttrain.service.engine.lora_model import target_logprobs
from posttrain.service.engine.sampler_models import AdapterNotSaved, ModelSource, RunNotLive
from posttrain.service.protocols.tinker.proto import SampledSequenceWire, encode_sample_response
from posttrain.service.protocols.tinker.requests import SampleJob

# the engine's names for the saved sources (posttrain.service.engine.sampler_models)
ENGINE_KINDS = {"sampler_weights": "export", "weights": "state"}


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

    def engine_source(self) -> ModelSource:
        """The same source in the engine's terms."""
        return ModelSource(ENGINE_KINDS.get(self.kind, self.kind), self.run_id, self.version,
                           self.name)


class TinkerSampling:
    """Samples sources on the engine's compute thread; the engine resolves them to torch
    models (``engine.sampler_models``, which keeps the saved adapters it loaded)."""

    def __init__(self, engine: Any):
        self.engine = engine

    # ------------------------------------------------------------ sources

    def check_saved(self, source: SamplerSource) -> None:
        """``NotFound`` naming the path when a saved source is not on disk."""
        if not self.engine.sampler_models.is_saved(source.engine_source()):
            raise self._not_saved(source)

    @staticmethod
    def _not_saved(source: SamplerSource) -> NotFound:
        what = "sampler weights" if source.kind == "sampler_weights" else "saved state"
        return NotFound(f"{source.model_path}: no {what} {source.name!r} in run "
                        f"{source.run_id!r} (save_weights_for_sampler(name) and save_state "
                        "return the paths that exist)")

    def _model_for(self, source: SamplerSource) -> Any:
        """The torch model of ``source`` (compute thread)."""
        try:
            return self.engine.sampler_models.model_for(source.engine_source(),
                                                        label=source.model_path)
        except RunNotLive:
            raise LookupError(
                f"run {source.run_id} has ended, and its in-memory sampler snapshots with "
                "it; save named sampler weights (save_weights_for_sampler(name)) to sample "
                "a run after it ends") from None
        except AdapterNotSaved:
            raise self._not_saved(source) from None

    # ------------------------------------------------------------ sampling

    def sample(self, source: SamplerSource, job: SampleJob) -> bytes:
        """Sample ``job`` from ``source``; the protobuf ``SampleResponse`` bytes. Waits for
        the compute thread."""
        return self.engine.compute.run(self._sample, source, job)

    def _sample(self, source: SamplerSource, job: SampleJob) -> bytes:
        model = self._model_for(source)
        sampler = self.engine.sampler_models.sampler_for(model)
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
