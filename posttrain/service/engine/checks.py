"""Checking typed requests against the engine's model and limits, before anything is queued.

Every protocol wing hands the engine typed requests (``posttrain.service.engine.requests``);
the engine checks each one here: token ids inside the vocabulary, lengths that match, the
loss and its config known, sizes within the published limits. A bad request raises
``BadRequest`` (400) or ``TooLarge`` (413) with a message naming the field
(``data[3].loss_fn_inputs.advantages``), and nothing in the engine changes.

The field rules are small functions (``token_ids``, ``lora_rank``, ``num_samples``, ...)
so that a wing parsing its own wire format (posttrain's JSON, in
``posttrain.service.protocols.native.parsing``) applies the same rule, with the same
message, at the point its parser reaches the field. Pure functions; no torch.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from posttrain.service.engine import losses
from posttrain.service.engine.errors import BadRequest, TooLarge
from posttrain.service.engine.requests import (
    REQUEST_TYPES,
    Datum,
    Finish,
    ForwardBackward,
    Limits,
    LogprobsRequest,
    LoraSpec,
    SamplingRequest,
    SaveWeights,
    StateName,
)
from posttrain.service.schema import AdamParams

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# the sequences a per-token field may arrive as: JSON lists, or tuples from a typed request
LISTS = (list, tuple)
DEFAULT_HEARTBEAT_TIMEOUT_S = 60.0


# ---------------------------------------------------------------- values


def kind(value: Any) -> str:
    """What a JSON value is, in words, for messages ("an object", "a list", "null", ...)."""
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), "null" if value is None else type(value).__name__
    )


def integer(value: Any, where: str, *, low: int | None = None, high: int | None = None) -> int:
    """``value`` as an int within ``[low, high]``; ``BadRequest`` naming ``where`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{where}: expected an integer, got {kind(value)}")
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
    """A non-empty flat list of token ids, each in ``[0, vocab_size)``; ``TooLarge`` past
    ``max_length``."""
    if not isinstance(value, LISTS):
        raise BadRequest(f"{where}: expected a flat list of token ids, got {kind(value)}")
    if not value:
        raise BadRequest(f"{where}: needs at least one token")
    if len(value) > max_length:
        raise TooLarge(f"{where}: {len(value)} tokens, over the limit of {max_length}")
    for index, token in enumerate(value):
        if isinstance(token, bool) or not isinstance(token, int):
            raise BadRequest(f"{where}[{index}]: expected an integer token id, got {kind(token)}")
        if not 0 <= token < vocab_size:
            raise BadRequest(
                f"{where}[{index}]: token id {token} is outside the vocabulary [0, {vocab_size})"
            )
    return tuple(value)


def per_token_values(value: Any, where: str, length: int) -> tuple[float, ...]:
    """A flat list of ``length`` finite numbers (one per input token)."""
    if not isinstance(value, LISTS):
        raise BadRequest(f"{where}: expected a flat list of {length} numbers, got {kind(value)}")
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


def optimizer_flag(value: Any) -> bool:
    """``load_state``'s ``optimizer``: true (adapter and AdamW moments) or false (adapter)."""
    if not isinstance(value, bool):
        raise BadRequest(f"optimizer: expected true or false, got {kind(value)}")
    return value


def heartbeat_timeout(value: Any) -> float:
    """A session's ``heartbeat_timeout_s``: 0.5 s to a day."""
    return number(value, "heartbeat_timeout_s", low=0.5, high=86_400)


def sequence_number(value: Any) -> int | None:
    """A ``seq`` (>= 1), or None when the engine numbers the operation itself."""
    return None if value is None else integer(value, "seq", low=1)


# ---------------------------------------------------------------- LoRA runs


def lora_rank(value: Any, limits: Limits) -> int:
    """A LoRA rank, 1 to ``limits.max_lora_rank``."""
    return integer(value, "rank", low=1, high=limits.max_lora_rank)


def lora_spec(rank: Any, alpha: Any, seed: Any, target_modules: Any, limits: Limits,
              module_names: tuple[str, ...], optional_modules: tuple[str, ...] = ()
              ) -> LoraSpec:
    """A checked ``LoraSpec``; ``module_names`` are the model's linear layers,
    ``optional_modules`` others a run may name (the unembedding). Duplicate targets are
    dropped, first one kept."""
    rank = lora_rank(rank, limits)
    alpha = number(alpha, "alpha", low=0)
    seed = integer(seed, "seed", low=0, high=2**63 - 1)
    targets = target_modules
    if not isinstance(targets, LISTS) or not targets \
            or not all(isinstance(t, str) for t in targets):
        raise BadRequest("target_modules: expected a non-empty list of module names")
    allowed = (*module_names, *optional_modules)
    unknown = sorted(set(targets) - set(allowed))
    if unknown:
        raise BadRequest(
            f"target_modules: {', '.join(unknown)} not in this model; "
            f"choose from {', '.join(allowed)}"
        )
    return LoraSpec(rank=rank, alpha=alpha, target_modules=tuple(dict.fromkeys(targets)), seed=seed)


# ---------------------------------------------------------------- forward_backward


def loss_config(loss_function: Any, config: Any) -> dict[str, float]:
    """The loss's full config (its defaults overridden by ``config``); ``BadRequest`` for an
    unknown loss, config key or value (``posttrain.service.engine.losses``)."""
    try:
        return losses.resolve_config(loss_function, config)
    except losses.LossError as error:
        raise BadRequest(str(error)) from error


def datum_count(data: Sequence[Any], limits: Limits) -> None:
    """At least one datum, at most ``limits.max_datums`` (``TooLarge``)."""
    if not data:
        raise BadRequest("data: expected a non-empty list of datums, got a list")
    if len(data) > limits.max_datums:
        raise TooLarge(f"data: {len(data)} datums, over the limit of {limits.max_datums}")


def datum_inputs(raw_inputs: Mapping[str, Any], ids: tuple[int, ...], where: str,
                 loss_function: str, vocab_size: int, limits: Limits
                 ) -> dict[str, tuple[float, ...]]:
    """The per-token inputs of datum ``where`` whose input tokens are ``ids``: the ones the
    loss takes, each one value per input token (``target_tokens``: token ids)."""
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
            inputs[key] = targets
        else:
            inputs[key] = per_token_values(raw, field_where, len(ids))
    return inputs


def total_tokens(datums: Sequence[Datum], limits: Limits) -> None:
    """``TooLarge`` when the datums hold more than ``limits.max_tokens_per_call`` tokens."""
    total = sum(len(d.token_ids) for d in datums)
    if total > limits.max_tokens_per_call:
        raise TooLarge(
            f"data: {total} tokens in all, over the limit of {limits.max_tokens_per_call}"
        )


def check_forward_backward(request: ForwardBackward, vocab_size: int, limits: Limits, *,
                           backward: bool) -> ForwardBackward:
    """A checked ``forward_backward`` (``backward``) or ``forward`` request."""
    config = loss_config(request.loss_function, request.loss_config)
    datum_count(request.data, limits)
    datums = []
    for index, datum in enumerate(request.data):
        where = f"data[{index}]"
        ids = token_ids(datum.token_ids, f"{where}.model_input.token_ids", vocab_size,
                        limits.max_sequence_tokens)
        datums.append(Datum(ids, datum_inputs(datum.inputs, ids, where, request.loss_function,
                                              vocab_size, limits)))
    total_tokens(datums, limits)
    return ForwardBackward(tuple(datums), request.loss_function, config, backward)


# ---------------------------------------------------------------- the other primitives


def check_adam_params(params: AdamParams) -> AdamParams:
    """AdamW values in range: rates, eps, decay and clip >= 0, betas in [0, 0.999999]."""
    return AdamParams(
        learning_rate=number(params.learning_rate, "adam_params.learning_rate", low=0),
        beta1=number(params.beta1, "adam_params.beta1", low=0, high=0.999999),
        beta2=number(params.beta2, "adam_params.beta2", low=0, high=0.999999),
        eps=number(params.eps, "adam_params.eps", low=0),
        weight_decay=number(params.weight_decay, "adam_params.weight_decay", low=0),
        grad_clip_norm=number(params.grad_clip_norm, "adam_params.grad_clip_norm", low=0),
    )


def sampler_version(value: Any) -> int:
    """A sampler version number, >= 0."""
    return integer(value, "version", low=0)


def num_samples(value: Any, limits: Limits) -> int:
    """Samples of one prompt, 1 to ``limits.max_num_samples``."""
    return integer(value, "num_samples", low=1, high=limits.max_num_samples)


def max_new_tokens(value: Any, limits: Limits) -> int:
    """``sampling_params.max_tokens``, 1 to ``limits.max_new_tokens``."""
    return integer(value, "sampling_params.max_tokens", low=1, high=limits.max_new_tokens)


def fits_context(prompt_length: int, max_tokens: int, limits: Limits) -> None:
    """The prompt and the tokens to sample must fit the context."""
    if prompt_length + max_tokens > limits.max_sequence_tokens:
        raise BadRequest(
            f"prompt ({prompt_length} tokens) + max_tokens ({max_tokens}) is over the context of "
            f"{limits.max_sequence_tokens} tokens"
        )


def stop_strings(value: Any) -> tuple[str, ...]:
    """``sampling_params.stop``: non-empty strings."""
    if not isinstance(value, LISTS) or not all(isinstance(s, str) and s for s in value):
        raise BadRequest("sampling_params.stop: expected a list of non-empty strings")
    return tuple(value)


def temperature(value: Any) -> float:
    """``sampling_params.temperature``, 0 to 100."""
    return number(value, "sampling_params.temperature", low=0, high=100)


def top_p(value: Any) -> float:
    """``sampling_params.top_p``, above 0 up to 1."""
    return number(value, "sampling_params.top_p", low=1e-9, high=1.0)


def top_k(value: Any) -> int:
    """``sampling_params.top_k``, >= 0 (0: off)."""
    return integer(value, "sampling_params.top_k", low=0)


def sample_seed(value: Any, limits: Limits) -> int | None:
    """``sampling_params.seed`` (None: drawn), low enough that ``seed + i`` stays an int64."""
    return None if value is None else integer(value, "sampling_params.seed", low=0,
                                              high=2**63 - 1 - limits.max_num_samples)


def check_sample(request: SamplingRequest, vocab_size: int, limits: Limits) -> SamplingRequest:
    """A checked ``sample`` request."""
    version = sampler_version(request.version)
    ids = token_ids(request.prompt_token_ids, "prompt.token_ids", vocab_size,
                    limits.max_sequence_tokens)
    count = num_samples(request.num_samples, limits)
    max_tokens = max_new_tokens(request.max_tokens, limits)
    fits_context(len(ids), max_tokens, limits)
    stop = stop_strings(request.stop)
    return SamplingRequest(
        version=version, prompt_token_ids=ids, num_samples=count, max_tokens=max_tokens,
        temperature=temperature(request.temperature), top_p=top_p(request.top_p),
        top_k=top_k(request.top_k), seed=sample_seed(request.seed, limits), stop=stop,
    )


def logprobs_request(sequences: Sequence[Any], version: Any, vocab_size: int, limits: Limits
                     ) -> LogprobsRequest:
    """A checked ``logprobs`` request: 1 to ``limits.max_datums`` sequences of at most
    ``limits.max_tokens_per_call`` tokens in all; ``version`` None is the trainer's weights."""
    if not sequences:
        raise BadRequest("sequences: expected a non-empty list of token-id lists, got a list")
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
    return LogprobsRequest(parsed, None if version is None else sampler_version(version))


def check_state_name(request: StateName, *, allow_run_id: bool) -> StateName:
    """A checked save_state / export_lora (``allow_run_id`` False) or load_state target."""
    if not allow_run_id and (request.run_id is not None or not request.optimizer):
        raise ValueError("only load_state takes a run_id or optimizer=False")
    run_id = request.run_id
    if run_id is not None:
        # a run id names a folder under the state folder: the same rule as a name, so
        # "../../elsewhere" cannot reach outside it
        run_id = state_name(run_id, "run_id")
    return StateName(state_name(request.name, "name"), run_id, optimizer_flag(request.optimizer))


def check_request(primitive: str, request: Any, vocab_size: int, limits: Limits) -> Any:
    """The checked typed request of ``primitive`` (what the engine queues). Raises
    ``BadRequest`` / ``TooLarge`` naming the field; ``TypeError`` when ``request`` is not
    the primitive's request type (``requests.REQUEST_TYPES``), which is a wing's bug."""
    expected = REQUEST_TYPES[primitive]
    if not isinstance(request, expected):
        raise TypeError(f"{primitive} takes a {expected.__name__}, got {type(request).__name__}")
    if primitive in ("forward_backward", "forward"):
        return check_forward_backward(request, vocab_size, limits,
                                      backward=primitive == "forward_backward")
    if primitive == "optim_step":
        return check_adam_params(request)
    if primitive == "sample":
        return check_sample(request, vocab_size, limits)
    if primitive == "logprobs":
        return logprobs_request(request.sequences, request.version, vocab_size, limits)
    if primitive == "save_weights_for_sampler":
        return SaveWeights(sampler_version(request.version))
    if primitive in ("save_state", "export_lora", "load_state"):
        return check_state_name(request, allow_run_id=primitive == "load_state")
    return Finish()
