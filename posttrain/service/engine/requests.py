"""The typed requests the engine takes, and the limits it publishes. No parsing here.

A protocol wing reads its wire format and builds these (posttrain's own JSON in
``posttrain.service.protocols.native.parsing``, the tinker SDK's protobuf and JSON in
``posttrain.service.protocols.tinker``); the engine checks every one against its model
and limits (``posttrain.service.engine.checks``) before anything is queued.

The datum convention (Tinker's): a datum's ``token_ids`` are the full sequence minus its
last token, and every per-token input (``target_tokens``, ``logprobs``, ``advantages``,
``weights``) has the same length ``N``: position ``i`` predicts ``target_tokens[i]``, the
token after ``token_ids[i]``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from posttrain.service.schema import AdamParams


@dataclass(frozen=True)
class Limits:
    """Published limits (served by capabilities); a request over one is answered 413 or 400."""

    max_body_bytes: int = field(default=16 << 20, metadata={"help": "largest request body"})
    max_datums: int = field(default=1024, metadata={"help": "datums per forward_backward"})
    max_tokens_per_call: int = field(
        default=32_768, metadata={"help": "total input tokens per forward_backward or logprobs "
                                  "(time grows with it; memory is one pass's, at most "
                                  "2,048 tokens: lora_model.MICRO_BATCH_TOKENS)"}
    )
    max_sequence_tokens: int = field(
        default=1024, metadata={"help": "tokens per sequence (capped by the model's context)"}
    )
    max_num_samples: int = field(default=64, metadata={"help": "num_samples per sample call"})
    max_new_tokens: int = field(default=512, metadata={"help": "max_tokens per sample call"})
    max_runs: int = field(default=64, metadata={"help": "live LoRA runs on the server"})
    max_queued_operations: int = field(default=1024, metadata={"help": "queued operations per run"})
    max_lora_rank: int = field(default=128, metadata={"help": "largest LoRA rank"})
    max_wait_s: float = field(default=30.0, metadata={"help": "longest long-poll of an operation"})
    max_long_polls: int = field(default=24, metadata={
        "help": "long polls (an operation's ?wait=, tinker's retrieve_future) held for their "
        "whole wait at once; the ones past it wait at most crowded_poll_s, so polls never "
        "hold all of the server's 40 request threads"})
    crowded_poll_s: float = field(default=1.0, metadata={
        "help": "longest wait of a long poll past max_long_polls"})
    max_seq_ahead: int = field(
        default=1024, metadata={"help": "how far a sequence number may run ahead of execution"}
    )
    operation_retention_s: float = field(
        default=600.0,
        metadata={"help": "how long a finished operation and its result stay retrievable"},
    )

    def to_json(self) -> dict[str, Any]:
        """The limits as served by capabilities."""
        return asdict(self)


# ---------------------------------------------------------------- typed requests


@dataclass(frozen=True)
class LoraSpec:
    """A LoRA run's adapter: rank, alpha, target modules, initialisation seed."""

    rank: int
    alpha: float
    target_modules: tuple[str, ...]
    seed: int


@dataclass(frozen=True)
class Datum:
    """One training sequence: input token ids and per-token inputs of the same length."""

    token_ids: tuple[int, ...]
    inputs: dict[str, tuple[float, ...]]  # target_tokens hold token ids (ints)


@dataclass(frozen=True)
class ForwardBackward:
    """A ``forward_backward`` (or ``forward``) request: datums, the loss and its config."""

    data: tuple[Datum, ...]
    loss_function: str
    loss_config: dict[str, float]
    backward: bool = True  # False for ``forward``: loss and logprobs, no gradients


@dataclass(frozen=True)
class SamplingRequest:
    """A ``sample`` request: ``num_samples`` completions of one prompt from a version."""

    version: int
    prompt_token_ids: tuple[int, ...]
    num_samples: int
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    stop: tuple[str, ...]


@dataclass(frozen=True)
class LogprobsRequest:
    """A ``logprobs`` request: per-token logprobs of whole sequences at a version."""

    sequences: tuple[tuple[int, ...], ...]
    version: int | None  # None: the trainer's current weights


@dataclass(frozen=True)
class SaveWeights:
    """A ``save_weights_for_sampler`` request: the snapshot's version number."""

    version: int


@dataclass(frozen=True)
class StateName:
    """A save_state / load_state / export_lora target; ``run_id`` names another run's state;
    ``optimizer`` False loads the adapter alone (fresh AdamW moments)."""

    name: str
    run_id: str | None = None
    optimizer: bool = True


@dataclass(frozen=True)
class Finish:
    """A ``finish`` request: end the run after everything before it."""


# the request type of each primitive (``optim_step`` takes the shared ``AdamParams``)
REQUEST_TYPES: dict[str, type[Any]] = {
    "save_weights_for_sampler": SaveWeights,
    "sample": SamplingRequest,
    "logprobs": LogprobsRequest,
    "forward": ForwardBackward,
    "forward_backward": ForwardBackward,
    "optim_step": AdamParams,
    "save_state": StateName,
    "load_state": StateName,
    "export_lora": StateName,
    "finish": Finish,
}
