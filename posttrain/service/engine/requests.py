"""Parsing and validating request bodies into typed requests, before anything is queued.

Every check that can be made from the body alone happens here, so a bad request is
answered 4xx with a message naming the field (``data[3].loss_fn_inputs.advantages``) and
nothing in the engine changes. Pure functions over JSON values; no torch.

Wire conventions (the Tinker datum convention): a datum's ``model_input.token_ids`` is the
full sequence minus its last token, and every per-token input (``target_tokens``,
``logprobs``, ``advantages``, ``weights``) has the same length ``N``: position ``i``
predicts ``target_tokens[i]``, the token after ``token_ids[i]``.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from posttrain.service.engine import losses
from posttrain.service.engine.errors import BadRequest, TooLarge
from posttrain.service.schema import ADAM_KEYS, AdamParams

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass(frozen=True)
class Limits:
    """Published limits (served by capabilities); a request over one is answered 413 or 400."""

    max_body_bytes: int = field(default=16 << 20, metadata={"help": "largest request body"})
    max_datums: int = field(default=1024, metadata={"help": "datums per forward_backward"})
    max_tokens_per_call: int = field(
        default=262_144, metadata={"help": "total input tokens per forward_backward or logprobs"}
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
    inputs: dict[str, tuple[float, ...]]  # target_tokens are whole numbers here too


@dataclass(frozen=True)
class ForwardBackward:
    data: tuple[Datum, ...]
    loss_function: str
    loss_config: dict[str, float]
    backward: bool = True  # False for ``forward``: loss and logprobs, no gradients


@dataclass(frozen=True)
class SamplingRequest:
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
    sequences: tuple[tuple[int, ...], ...]
    version: int | None  # None: the trainer's current weights


@dataclass(frozen=True)
class SaveWeights:
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
    pass


SAMPLING_KEYS = ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop")


# ---------------------------------------------------------------- field helpers


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadRequest(f"{where}: expected a JSON object, got {_kind(value)}")
    return value


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), "null" if value is None else type(value).__name__
    )


def _only(body: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
    extra = sorted(set(body) - set(allowed))
    if extra:
        raise BadRequest(
            f"{where}: unknown field(s) {', '.join(map(repr, extra))}; "
            f"accepted: {', '.join(allowed)}"
        )


def _required(body: dict[str, Any], key: str, where: str) -> Any:
    if key not in body:
        raise BadRequest(f"{where}: missing field {key!r}")
    return body[key]


def integer(value: Any, where: str, *, low: int | None = None, high: int | None = None) -> int:
    """``value`` as an int within ``[low, high]``; ``BadRequest`` naming ``where`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{where}: expected an integer, got {_kind(value)}")
    if low is not None and value < low:
        raise BadRequest(f"{where}: must be >= {low}, got {value}")
    if high is not None and value > high:
        raise BadRequest(f"{where}: must be <= {high}, got {value}")
    return value


def number(value: Any, where: str, *, low: float | None = None, high: float | None = None) -> float:
    """``value`` as a finite float within ``[low, high]``; ``BadRequest`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BadRequest(f"{where}: expected a finite number, got {value!r}")
    if low is not None and value < low:
        raise BadRequest(f"{where}: must be >= {low}, got {value}")
    if high is not None and value > high:
        raise BadRequest(f"{where}: must be <= {high}, got {value}")
    return float(value)


def token_ids(value: Any, where: str, vocab_size: int, max_length: int) -> tuple[int, ...]:
    """A non-empty flat list of token ids, each in ``[0, vocab_size)``."""
    if not isinstance(value, list):
        raise BadRequest(f"{where}: expected a flat list of token ids, got {_kind(value)}")
    if not value:
        raise BadRequest(f"{where}: needs at least one token")
    if len(value) > max_length:
        raise TooLarge(f"{where}: {len(value)} tokens, over the limit of {max_length}")
    for index, token in enumerate(value):
        if isinstance(token, bool) or not isinstance(token, int):
            raise BadRequest(f"{where}[{index}]: expected an integer token id, got {_kind(token)}")
        if not 0 <= token < vocab_size:
            raise BadRequest(
                f"{where}[{index}]: token id {token} is outside the vocabulary [0, {vocab_size})"
            )
    return tuple(value)


def _floats(value: Any, where: str, length: int) -> tuple[float, ...]:
    if not isinstance(value, list):
        raise BadRequest(f"{where}: expected a flat list of {length} numbers, got {_kind(value)}")
    if len(value) != length:
        raise BadRequest(
            f"{where}: has {len(value)} values but model_input has {length} tokens; every "
            "per-token input needs one value per input token"
        )
    for index, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, (int, float)) or not math.isfinite(item):
            raise BadRequest(f"{where}[{index}]: expected a finite number, got {item!r}")
    return tuple(float(item) for item in value)


def state_name(value: Any, where: str) -> str:
    """A save/export name: 1-64 of letters, digits, ``.``, ``_``, ``-``; no path tricks."""
    if not isinstance(value, str) or not NAME_PATTERN.match(value) or ".." in value:
        raise BadRequest(
            f"{where}: expected a name of 1-64 letters, digits, '.', '_' or '-' "
            f"(starting with a letter or digit), got {value!r}"
        )
    return value


# ---------------------------------------------------------------- bodies


def parse_lora(body: Any, limits: Limits, module_names: tuple[str, ...], *,
               optional_modules: tuple[str, ...] = ()) -> LoraSpec:
    """The LoRA part of a create-run body; ``module_names`` are the model's linear layers
    (the default targets), ``optional_modules`` others a body may name (the unembedding)."""
    body = _object(body, "body")
    rank = integer(body.get("rank", 16), "rank", low=1, high=limits.max_lora_rank)
    alpha = number(body.get("alpha", 2 * rank), "alpha", low=0)
    seed = integer(body.get("seed", 0), "seed", low=0, high=2**63 - 1)
    targets = body.get("target_modules", list(module_names))
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) for t in targets):
        raise BadRequest("target_modules: expected a non-empty list of module names")
    allowed = (*module_names, *optional_modules)
    unknown = sorted(set(targets) - set(allowed))
    if unknown:
        raise BadRequest(
            f"target_modules: {', '.join(unknown)} not in this model; "
            f"choose from {', '.join(allowed)}"
        )
    return LoraSpec(rank=rank, alpha=alpha, target_modules=tuple(dict.fromkeys(targets)), seed=seed)


def _datum(value: Any, where: str, loss_function: str, vocab_size: int, limits: Limits) -> Datum:
    value = _object(value, where)
    _only(value, ("model_input", "loss_fn_inputs"), where)
    model_input = _object(_required(value, "model_input", where), f"{where}.model_input")
    _only(model_input, ("token_ids",), f"{where}.model_input")
    ids = token_ids(
        _required(model_input, "token_ids", f"{where}.model_input"),
        f"{where}.model_input.token_ids",
        vocab_size,
        limits.max_sequence_tokens,
    )
    raw_inputs = _object(_required(value, "loss_fn_inputs", where), f"{where}.loss_fn_inputs")
    try:
        losses.check_inputs(loss_function, set(raw_inputs), f"{where}.loss_fn_inputs")
    except losses.LossError as error:
        raise BadRequest(str(error)) from error
    inputs: dict[str, tuple[float, ...]] = {}
    for key, raw in raw_inputs.items():
        field_where = f"{where}.loss_fn_inputs.{key}"
        if key == "target_tokens":
            targets = token_ids(raw, field_where, vocab_size, limits.max_sequence_tokens)
            if len(targets) != len(ids):
                raise BadRequest(
                    f"{field_where}: has {len(targets)} tokens but model_input has {len(ids)}; "
                    "targets are the input shifted by one (input = full[:-1], targets = full[1:])"
                )
            inputs[key] = tuple(float(t) for t in targets)
        else:
            inputs[key] = _floats(raw, field_where, len(ids))
    return Datum(token_ids=ids, inputs=inputs)


def parse_forward_backward(
    body: Any, vocab_size: int, limits: Limits, *, backward: bool = True
) -> ForwardBackward:
    """``{"data": [datum, ...], "loss_function": name, "loss_config": {...}}``."""
    body = _object(body, "body")
    _only(body, ("seq", "data", "loss_function", "loss_config"), "body")
    loss_function = _required(body, "loss_function", "body")
    try:
        config = losses.resolve_config(loss_function, body.get("loss_config"))
    except losses.LossError as error:
        raise BadRequest(str(error)) from error
    data = _required(body, "data", "body")
    if not isinstance(data, list) or not data:
        raise BadRequest(f"data: expected a non-empty list of datums, got {_kind(data)}")
    if len(data) > limits.max_datums:
        raise TooLarge(f"data: {len(data)} datums, over the limit of {limits.max_datums}")
    datums = tuple(
        _datum(item, f"data[{index}]", loss_function, vocab_size, limits)
        for index, item in enumerate(data)
    )
    total = sum(len(d.token_ids) for d in datums)
    if total > limits.max_tokens_per_call:
        raise TooLarge(
            f"data: {total} tokens in all, over the limit of {limits.max_tokens_per_call}"
        )
    return ForwardBackward(datums, loss_function, config, backward)


def parse_optim_step(body: Any) -> AdamParams:
    """``{"adam_params": {learning_rate, beta1, beta2, eps, weight_decay, grad_clip_norm}}``,
    every key required (no hidden defaults)."""
    body = _object(body, "body")
    _only(body, ("seq", "adam_params"), "body")
    params = _object(_required(body, "adam_params", "body"), "adam_params")
    _only(params, ADAM_KEYS, "adam_params")
    missing = [key for key in ADAM_KEYS if key not in params]
    if missing:
        raise BadRequest(
            f"adam_params: missing {', '.join(missing)}; every AdamW hyper-parameter is explicit "
            f"({', '.join(ADAM_KEYS)})"
        )
    return AdamParams(
        learning_rate=number(params["learning_rate"], "adam_params.learning_rate", low=0),
        beta1=number(params["beta1"], "adam_params.beta1", low=0, high=0.999999),
        beta2=number(params["beta2"], "adam_params.beta2", low=0, high=0.999999),
        eps=number(params["eps"], "adam_params.eps", low=0),
        weight_decay=number(params["weight_decay"], "adam_params.weight_decay", low=0),
        grad_clip_norm=number(params["grad_clip_norm"], "adam_params.grad_clip_norm", low=0),
    )


def parse_sample(body: Any, vocab_size: int, limits: Limits) -> SamplingRequest:
    """``{"version": N, "prompt": {"token_ids": [...]}, "num_samples": k,
    "sampling_params": {"max_tokens", "temperature", "top_p", "top_k", "seed", "stop"}}``."""
    body = _object(body, "body")
    _only(body, ("seq", "version", "prompt", "num_samples", "sampling_params"), "body")
    version = integer(_required(body, "version", "body"), "version", low=0)
    prompt = _object(_required(body, "prompt", "body"), "prompt")
    _only(prompt, ("token_ids",), "prompt")
    ids = token_ids(
        _required(prompt, "token_ids", "prompt"), "prompt.token_ids", vocab_size,
        limits.max_sequence_tokens,
    )
    num_samples = integer(body.get("num_samples", 1), "num_samples", low=1,
                          high=limits.max_num_samples)
    params = _object(_required(body, "sampling_params", "body"), "sampling_params")
    _only(params, SAMPLING_KEYS, "sampling_params")
    max_tokens = integer(_required(params, "max_tokens", "sampling_params"),
                         "sampling_params.max_tokens", low=1, high=limits.max_new_tokens)
    if len(ids) + max_tokens > limits.max_sequence_tokens:
        raise BadRequest(
            f"prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) is over the context of "
            f"{limits.max_sequence_tokens} tokens"
        )
    stop = params.get("stop", [])
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise BadRequest("sampling_params.stop: expected a list of non-empty strings")
    seed = params.get("seed")
    return SamplingRequest(
        version=version,
        prompt_token_ids=ids,
        num_samples=num_samples,
        max_tokens=max_tokens,
        temperature=number(params.get("temperature", 1.0), "sampling_params.temperature",
                           low=0, high=100),
        top_p=number(params.get("top_p", 1.0), "sampling_params.top_p", low=1e-9, high=1.0),
        top_k=integer(params.get("top_k", 0), "sampling_params.top_k", low=0),
        seed=None if seed is None else integer(seed, "sampling_params.seed", low=0,
                                               high=2**63 - 1 - limits.max_num_samples),
        stop=tuple(stop),
    )


def parse_logprobs(body: Any, vocab_size: int, limits: Limits) -> LogprobsRequest:
    """``{"sequences": [[ids], ...], "version": N | null}``; null = the trainer's weights."""
    body = _object(body, "body")
    _only(body, ("seq", "sequences", "version"), "body")
    sequences = _required(body, "sequences", "body")
    if not isinstance(sequences, list) or not sequences:
        raise BadRequest(
            f"sequences: expected a non-empty list of token-id lists, got {_kind(sequences)}"
        )
    if len(sequences) > limits.max_datums:
        raise TooLarge(
            f"sequences: {len(sequences)} sequences, over the limit of {limits.max_datums}"
        )
    parsed = tuple(
        token_ids(item, f"sequences[{index}]", vocab_size, limits.max_sequence_tokens)
        for index, item in enumerate(sequences)
    )
    total = sum(len(s) for s in parsed)
    if total > limits.max_tokens_per_call:
        raise TooLarge(
            f"sequences: {total} tokens in all, over the limit of {limits.max_tokens_per_call}"
        )
    version = body.get("version")
    return LogprobsRequest(parsed, None if version is None else integer(version, "version", low=0))


def parse_save_weights(body: Any) -> SaveWeights:
    """``{"version": N}``: the snapshot's number, a non-negative integer."""
    body = _object(body, "body")
    _only(body, ("seq", "version"), "body")
    return SaveWeights(integer(_required(body, "version", "body"), "version", low=0))


def parse_state_name(body: Any, *, allow_run_id: bool = False) -> StateName:
    """``{"name": ...}``; for load_state also an optional ``run_id`` (another run's save)
    and ``optimizer`` (default true; false loads the adapter alone)."""
    body = _object(body, "body")
    _only(body, ("seq", "name", "run_id", "optimizer") if allow_run_id else ("seq", "name"),
          "body")
    run_id = body.get("run_id")
    if run_id is not None:
        # a run id names a folder under the state folder: the same rule as a name, so
        # "../../elsewhere" cannot reach outside it
        run_id = state_name(run_id, "run_id")
    optimizer = body.get("optimizer", True)
    if not isinstance(optimizer, bool):
        raise BadRequest(f"optimizer: expected true or false, got {_kind(optimizer)}")
    return StateName(state_name(_required(body, "name", "body"), "name"), run_id, optimizer)


def parse_finish(body: Any) -> Finish:
    """``{}`` (only ``seq`` is accepted)."""
    _only(_object(body, "body"), ("seq",), "body")
    return Finish()


def parse_primitive(primitive: str, body: Any, vocab_size: int, limits: Limits) -> Any:
    """The typed request of one primitive's body (what the engine queues). Raises
    ``BadRequest`` / ``TooLarge`` naming the field; never anything else for any JSON."""
    if primitive == "forward_backward":
        return parse_forward_backward(body, vocab_size, limits)
    if primitive == "forward":
        return parse_forward_backward(body, vocab_size, limits, backward=False)
    if primitive == "optim_step":
        return parse_optim_step(body)
    if primitive == "sample":
        return parse_sample(body, vocab_size, limits)
    if primitive == "logprobs":
        return parse_logprobs(body, vocab_size, limits)
    if primitive == "save_weights_for_sampler":
        return parse_save_weights(body)
    if primitive in ("save_state", "export_lora"):
        return parse_state_name(body)
    if primitive == "load_state":
        return parse_state_name(body, allow_run_id=True)
    if primitive == "finish":
        return parse_finish(body)
    raise BadRequest(f"no primitive {primitive!r}")


def sequence_number(body: Any) -> int | None:
    """The body's ``seq`` (>= 1), or None when the client lets the server number it."""
    body = _object(body, "body")
    seq = body.get("seq")
    return None if seq is None else integer(seq, "seq", low=1)
