"""One LoRA run's tensors: trainer adapter, AdamW state, sampler snapshots, and the math on them.

**Sharing the base.** Every run is its own ``PeftModel`` over a *shallow copy* of the base
model: a ``deepcopy`` whose memo maps every base parameter and buffer to itself, so the
module tree is new (PEFT can inject LoRA layers into it) while the frozen weights are the
same tensors for all runs. We measured this against one ``PeftModel`` holding one named
adapter per run (``add_adapter`` / ``set_adapter``): forward+backward cost the same, a copy
costs ~0.15 s once per run and a few hundred kB of Python objects, while ``set_adapter``
costs ~10 ms per switch and makes "which adapter is active" global state that every
operation of every run would have to set under a lock. Separate trees keep runs unable to
touch each other's adapters, allow different ranks and targets per run, and make export a
plain ``save_pretrained``.

**Sampler versions.** ``save_weights_for_sampler(N)`` stores a clone of the adapter
tensors. Sampling and versioned logprobs run on a second ``PeftModel`` per run (same
shared base) into which the requested snapshot is copied when it is not already loaded,
so sampling never touches the trainer's weights and a snapshot never changes.

**Numerics.** Logprobs are ``log_softmax`` of the raw float32 logits (temperature 1), the
same quantity the sampler reports, so sampler and trainer logprobs of the same tokens
agree to float rounding.

All methods assume the caller serialises them (the run's queue, under the engine's
compute lock).
"""

from __future__ import annotations

import copy
import math
import random
from collections import OrderedDict
from types import SimpleNamespace
from typing import Any

from posttrain.policy.models import lora_config
from posttrain.policy.sampler import Sampler, SamplingParams
from posttrain.service.engine import losses
from posttrain.service.engine.requests import (
    ForwardBackward,
    LogprobsRequest,
    LoraSpec,
    SamplingRequest,
)
from posttrain.service.schema import AdamParams

ADAPTER_NAME = "default"
# one forward pass holds at most this many logits (x 4 bytes, twice with log-softmax):
# 16k tokens at a 4k vocabulary, 1.3k tokens at a 49k one
MICRO_BATCH_LOGITS = 1 << 26
# ... and at most this many (padded) tokens, whatever the vocabulary: a pass's activations
# grow with its tokens (about 380 kB a token on the starter's 1k vocabulary, which the
# logit budget alone let take a whole 32k-token call in one pass, ~12 GB). With both, one
# call's memory is one pass's, whatever --max-tokens-per-call allows
# (benchmarks/serve_call_memory.py)
MICRO_BATCH_TOKENS = 2048


def shared_copy(model: Any) -> Any:
    """A new module tree over the same parameter and buffer tensors as ``model``."""
    memo: dict[int, Any] = {id(p): p for p in model.parameters()}
    memo.update({id(b): b for b in model.buffers()})
    return copy.deepcopy(model, memo)


def linear_module_names(model: Any) -> tuple[str, ...]:
    """Short names of the linear layers LoRA can target (``q_proj``, ...), ``lm_head`` excluded."""
    import torch

    names = {
        name.rsplit(".", 1)[-1]
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and not name.endswith("lm_head")
    }
    return tuple(sorted(names))


def unembedding_module_name(model: Any) -> str | None:
    """``"lm_head"`` when the model's unembedding is a linear layer LoRA can wrap, else None."""
    import torch

    head = getattr(model, "lm_head", None)
    return "lm_head" if isinstance(head, torch.nn.Linear) else None


def new_peft_model(base: Any, spec: LoraSpec) -> Any:
    """A fresh LoRA ``PeftModel`` on a shared copy of ``base``, initialised from ``spec.seed``.

    PEFT draws LoRA A from the global torch generator; it is forked so creating a run
    leaves the process's random state as it was.
    """
    import warnings

    import torch
    from peft import get_peft_model

    config = lora_config(base, spec.rank, spec.alpha, spec.target_modules)
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        # LoRA on a tied unembedding: its delta acts on the output projection alone, which
        # is what is asked for; PEFT warns because merging it would untie the weights, and
        # nothing here merges adapters
        warnings.filterwarnings("ignore", message=".*tie_word_embeddings.*")
        torch.manual_seed(spec.seed)
        model = get_peft_model(shared_copy(base), config, adapter_name=ADAPTER_NAME)
    model.eval()  # no dropout anywhere; training mode would change nothing but flags
    return model


def _pad_batch(sequences: list[tuple[int, ...]], pad_id: int) -> tuple[Any, Any]:
    import torch

    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, sequence in enumerate(sequences):
        ids[row, : len(sequence)] = torch.tensor(sequence, dtype=torch.long)
        mask[row, : len(sequence)] = 1
    return ids, mask


def _micro_batches(lengths: list[int], budget: int) -> list[list[int]]:
    """Indices grouped so each group's padded size (rows x longest) stays within ``budget``."""
    groups: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for index in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        width = max(longest, lengths[index])
        if current and width * (len(current) + 1) > budget:
            groups.append(current)
            current, longest = [], 0
            width = lengths[index]
        current.append(index)
        longest = width
    if current:
        groups.append(current)
    return groups


def target_logprobs(model: Any, inputs: list[tuple[int, ...]], targets: list[Any], pad_id: int):
    """Yield ``(indices, logprobs)`` per micro-batch, ``logprobs[k]`` being the tensor
    log p(targets[i][t] | inputs[i][:t+1]) of sequence ``i = indices[k]``.

    Right-padded micro-batches; causal attention means padding after a sequence cannot
    change its logits. Gradients flow when the caller has them enabled.
    """
    import torch

    vocab = int(model.config.vocab_size) if hasattr(model, "config") else 1
    budget = max(1, min(MICRO_BATCH_TOKENS, MICRO_BATCH_LOGITS // max(vocab, 1)))
    for group in _micro_batches([len(s) for s in inputs], budget):
        ids, mask = _pad_batch([inputs[i] for i in group], pad_id)
        logits = model(input_ids=ids, attention_mask=mask).logits.float()
        logprobs = torch.log_softmax(logits, dim=-1)
        picked = []
        for row, index in enumerate(group):
            wanted = torch.as_tensor(targets[index], dtype=torch.long)
            picked.append(logprobs[row, : len(inputs[index])].gather(-1, wanted[:, None])[:, 0])
        yield group, picked


# an adapter weight past this has diverged: float32 products of such weights overflow
# within one forward pass (LoRA weights of a healthy run stay within single digits)
MAX_ADAPTER_WEIGHT = 1e8


class LoraModel:
    """A run's trainer adapter, optimizer, gradient accumulation and sampler snapshots."""

    def __init__(self, base: Any, tokenizer: Any, spec: LoraSpec, *, max_versions: int = 64):
        import torch

        self.spec = spec
        self.tokenizer = tokenizer
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.trainer = new_peft_model(base, spec)
        self.parameters: OrderedDict[str, Any] = OrderedDict(
            (name, p) for name, p in self.trainer.named_parameters() if p.requires_grad
        )
        self.optimizer = torch.optim.AdamW(list(self.parameters.values()), lr=0.0)
        self.step = 0
        self.pending_backward_calls = 0  # forward_backward calls since the last optim_step
        self.versions: OrderedDict[int, dict[str, Any]] = OrderedDict()
        self.max_versions = max_versions
        self._base = base
        self._sampler_model: Any = None
        self._sampler: Any = None
        self._loaded_version: int | None = None

    # ------------------------------------------------------------ training

    def forward_backward(self, request: ForwardBackward) -> dict[str, Any]:
        """Sum the loss over all datums, add its gradient to the accumulated one (unless
        ``request.backward`` is False) and return the loss, per-datum target logprobs
        (computed before any update) and metrics."""
        import torch

        inputs = [datum.token_ids for datum in request.data]
        targets = [[int(t) for t in datum.inputs["target_tokens"]] for datum in request.data]
        outputs: list[list[float]] = [[] for _ in request.data]
        total = 0.0
        with torch.set_grad_enabled(request.backward):
            batches = target_logprobs(self.trainer, inputs, targets, self.pad_id)
            for group, group_logprobs in batches:
                group_loss = 0.0
                for index, logprobs in zip(group, group_logprobs, strict=True):
                    datum_inputs = {
                        key: torch.tensor(values, dtype=torch.float32)
                        for key, values in request.data[index].inputs.items()
                        if key != "target_tokens"
                    }
                    loss = losses.datum_loss(
                        request.loss_function, logprobs, datum_inputs, request.loss_config
                    )
                    group_loss = group_loss + loss
                    outputs[index] = logprobs.detach().tolist()
                value = float(group_loss.detach())
                if not math.isfinite(value):
                    raise ValueError(
                        f"{request.loss_function}: the loss is {value}; an importance ratio "
                        "exp(lp - logprobs) overflowed or an input is extreme (check the "
                        "logprobs and advantages sent)"
                    )
                if request.backward:
                    group_loss.backward()  # one graph per micro-batch is alive at a time
                total += value
        if request.backward:
            self.pending_backward_calls += 1
        tokens = sum(len(ids) for ids in inputs)
        return {
            "loss": total,
            "loss_fn_output_type": "logprobs",
            "loss_fn_outputs": [{"logprobs": lp} for lp in outputs],
            "metrics": {"loss:sum": total, "tokens": tokens, "datums": len(inputs)},
        }

    def optim_step(self, params: AdamParams) -> dict[str, Any]:
        """One AdamW step on the accumulated gradients with exactly ``params``; clears them.

        A step that would leave any adapter weight non-finite or beyond
        ``MAX_ADAPTER_WEIGHT`` (a learning rate of 1e30, say) is not applied: weights and
        optimizer state stay what they were, and
        ``ValueError`` says so (the operation fails, and with it the run, as any failed
        training operation does; it used to succeed, and the next sample returned null
        logprobs)."""
        import copy

        import torch

        for group in self.optimizer.param_groups:
            group["lr"] = params.learning_rate
            group["betas"] = (params.beta1, params.beta2)
            group["eps"] = params.eps
            group["weight_decay"] = params.weight_decay
        values = list(self.parameters.values())
        have_grads = [p for p in values if p.grad is not None]
        limit = params.grad_clip_norm if params.grad_clip_norm > 0 else float("inf")
        grad_norm = (
            float(torch.nn.utils.clip_grad_norm_(have_grads, limit)) if have_grads else 0.0
        )
        weights_before = {name: p.detach().clone() for name, p in self.parameters.items()}
        state_before = copy.deepcopy(self.optimizer.state_dict())
        self.optimizer.step()
        broken = [name for name, p in self.parameters.items()
                  if not bool(torch.isfinite(p.detach()).all())
                  or float(p.detach().abs().max()) > MAX_ADAPTER_WEIGHT]
        if broken:
            with torch.no_grad():
                for name, p in self.parameters.items():
                    p.copy_(weights_before[name])
            self.optimizer.load_state_dict(state_before)
            raise ValueError(
                f"optim_step: the update would make {len(broken)} of {len(self.parameters)} "
                f"adapter tensors non-finite or larger than {MAX_ADAPTER_WEIGHT:g} (learning "
                f"rate {params.learning_rate:g} too high, or extreme gradients); it was not "
                "applied: use a lower learning_rate or a grad_clip_norm")
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        calls, self.pending_backward_calls = self.pending_backward_calls, 0
        return {
            "step": self.step,
            "grad_norm": grad_norm,
            "grad_clipped": params.grad_clip_norm > 0 and grad_norm > params.grad_clip_norm,
            "learning_rate": params.learning_rate,
            "forward_backward_calls": calls,
        }

    def clear_gradients(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.pending_backward_calls = 0

    # ------------------------------------------------------------ snapshots and sampling

    def adapter_tensors(self) -> dict[str, Any]:
        """Clones of the trainer's adapter tensors, by parameter name."""
        return {name: p.detach().clone() for name, p in self.parameters.items()}

    def save_weights_for_sampler(self, version: int) -> dict[str, Any]:
        """Freeze the current adapter as sampler version ``version`` (never overwritten)."""
        if version in self.versions:
            raise ValueError(
                f"sampler version {version} already exists and versions are immutable; "
                "save under a new version number"
            )
        self.versions[version] = self.adapter_tensors()
        evicted = []
        while len(self.versions) > self.max_versions:
            oldest, _ = self.versions.popitem(last=False)
            evicted.append(oldest)
        return {"version": version, "step": self.step, "evicted_versions": evicted}

    def model_for(self, version: int | None) -> Any:
        """The torch model of sampler version ``version`` (None: the trainer itself): the
        run's sampler tree with that snapshot loaded into it. ``LookupError`` for a version
        that was not saved (or was dropped, past ``max_versions``)."""
        if version is None:
            return self.trainer
        if version not in self.versions:
            known = ", ".join(map(str, self.versions)) or "none"
            raise LookupError(
                f"sampler version {version} was not saved (saved: {known}); call "
                "save_weights_for_sampler first"
            )
        import torch

        if self._sampler_model is None:
            self._sampler_model = new_peft_model(self._base, self.spec)
            for p in self._sampler_model.parameters():
                p.requires_grad_(False)
        if self._loaded_version != version:
            named = dict(self._sampler_model.named_parameters())
            with torch.no_grad():
                for name, tensor in self.versions[version].items():
                    named[name].copy_(tensor)
            self._loaded_version = version
        return self._sampler_model

    def sample(self, request: SamplingRequest) -> dict[str, Any]:
        """``num_samples`` completions of one prompt from sampler version ``request.version``.

        Sample ``i`` uses seed ``seed + i`` (so seeded samples are reproducible and not
        duplicates); without a seed one is drawn and returned.
        """
        model = self.model_for(request.version)
        if self._sampler is None:
            self._sampler = Sampler(SimpleNamespace(model=model, tokenizer=self.tokenizer))
        seed = request.seed if request.seed is not None else random.SystemRandom().randrange(2**62)
        params = SamplingParams(
            temperature=request.temperature,
            top_p=request.top_p,
            top_k=request.top_k,
            max_new_tokens=request.max_tokens,
            stop_strings=request.stop,
        )
        prompts = [list(request.prompt_token_ids)] * request.num_samples
        completions = self._sampler.sample_tokens(
            prompts, [seed + i for i in range(request.num_samples)], params
        )
        return {
            "version": request.version,
            "seed": seed,
            "sequences": [
                {
                    "tokens": completion.token_ids,
                    "logprobs": completion.logprobs,
                    "stop_reason": completion.stop_reason,
                }
                for completion in completions
            ],
        }

    def logprobs(self, request: LogprobsRequest) -> dict[str, Any]:
        """Per-token logprobs of each sequence: entry ``t`` is log p(seq[t] | seq[:t]);
        entry 0 is None (nothing predicts the first token)."""
        import torch

        model = self.model_for(request.version)
        runnable = [i for i, seq in enumerate(request.sequences) if len(seq) > 1]
        inputs = [request.sequences[i][:-1] for i in runnable]
        targets = [list(request.sequences[i][1:]) for i in runnable]
        result: list[list[float | None]] = [[None] for _ in request.sequences]
        with torch.no_grad():
            for group, group_logprobs in target_logprobs(model, inputs, targets, self.pad_id):
                for position, logprobs in zip(group, group_logprobs, strict=True):
                    result[runnable[position]] = [None, *logprobs.tolist()]
        return {"version": request.version, "logprobs": result}

    # ------------------------------------------------------------ export

    def export(self, folder: Any) -> list[str]:
        """Write the trainer adapter as a PEFT folder; returns the file names written."""
        # the base weights (embeddings included) are frozen here, so the adapter alone is
        # the run; PEFT would otherwise copy the whole embedding matrix into the folder when
        # a LoRA sits on a tied unembedding
        self.trainer.save_pretrained(str(folder), save_embedding_layers=False)
        return sorted(p.name for p in folder.iterdir() if p.is_file())

    def release(self) -> None:
        """Drop the tensors (a terminal run keeps only its record)."""
        self.trainer = self._sampler_model = self._sampler = None
        self.parameters.clear()
        self.versions.clear()
        self.optimizer = None
