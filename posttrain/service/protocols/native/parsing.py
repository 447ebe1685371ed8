"""Parsing posttrain's own JSON bodies into the engine's typed requests.

Every check that can be made from the body alone happens here, in the order the body is
read, so a bad request is answered 4xx with a message naming the field
(``data[3].loss_fn_inputs.advantages``) and nothing in the engine changes. The shape of
the JSON (objects, known fields, required fields) is checked here; each value goes
through the engine's own rule for it (``posttrain.service.engine.checks``), which the
engine applies again to whatever typed request it is handed. Pure functions; no torch.

Wire format of a datum (the Tinker datum convention): ``{"model_input": {"token_ids":
[...]}, "loss_fn_inputs": {"target_tokens": [...], "logprobs": [...], ...}}`` with the
full sequence minus its last token as ``token_ids`` and one value per input token in each
per-token input.
"""

from __future__ import annotations

from typing import Any

from posttrain.service.engine import checks
from posttrain.service.engine.checks import kind, state_name, token_ids
from posttrain.service.engine.errors import BadRequest
from posttrain.service.engine.requests import (
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
from posttrain.service.protocols.json_bodies import adam_params, json_object, only, required
from posttrain.service.schema import AdamParams

SAMPLING_KEYS = ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop")
CREATE_RUN_KEYS = ("session_id", "rank", "alpha", "target_modules", "seed")


# ---------------------------------------------------------------- sessions, runs, tokens


def parse_session(body: Any) -> float:
    """``{"heartbeat_timeout_s"?: 60}`` (an empty body is the default): the timeout."""
    body = body if body is not None else {}
    if not isinstance(body, dict):
        raise BadRequest("body: expected a JSON object")
    return checks.heartbeat_timeout(
        body.get("heartbeat_timeout_s", checks.DEFAULT_HEARTBEAT_TIMEOUT_S))


def parse_lora(body: Any, limits: Limits, module_names: tuple[str, ...], *,
               optional_modules: tuple[str, ...] = ()) -> LoraSpec:
    """The LoRA part of a create-run body; ``module_names`` are the model's linear layers
    (the default targets), ``optional_modules`` others a body may name (the unembedding)."""
    body = json_object(body, "body")
    rank = checks.lora_rank(body.get("rank", 16), limits)
    return checks.lora_spec(rank, body.get("alpha", 2 * rank), body.get("seed", 0),
                            body.get("target_modules", list(module_names)), limits,
                            module_names, optional_modules)


def parse_create_run(body: Any, limits: Limits, module_names: tuple[str, ...], *,
                     optional_modules: tuple[str, ...] = ()) -> LoraSpec:
    """``{"session_id", "rank", "alpha", "target_modules", "seed"}``: its LoRA spec (rank 16,
    alpha 2*rank, every linear layer, seed 0); the caller reads ``session_id``."""
    if not isinstance(body, dict):
        raise BadRequest("body: expected a JSON object")
    extra = sorted(set(body) - set(CREATE_RUN_KEYS))
    if extra:
        raise BadRequest(f"body: unknown field(s) {', '.join(map(repr, extra))}")
    return parse_lora(body, limits, module_names, optional_modules=optional_modules)


def parse_resume(body: Any) -> Any:
    """``{"session_id"}`` of a resume: the session id as sent (the engine checks it)."""
    if not isinstance(body, dict):
        raise BadRequest("body: expected a JSON object")
    return body.get("session_id")


def parse_tokenize(body: Any) -> str | list[dict[str, str]]:
    """``{"text": str}`` (the text) or ``{"messages": [{"role", "content"}, ...]}`` (the
    messages, for the chat template)."""
    if not isinstance(body, dict) or ("messages" in body) == ("text" in body):
        raise BadRequest('body: send exactly one of "messages" (a chat) or "text"')
    if "text" in body:
        if not isinstance(body["text"], str):
            raise BadRequest("text: expected a string")
        return body["text"]
    messages = body["messages"]
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str)
        and isinstance(m.get("content"), str)
        for m in messages
    ):
        raise BadRequest('messages: expected a list of {"role": str, "content": str}')
    return messages


def parse_detokenize(body: Any, vocab_size: int, limits: Limits) -> tuple[int, ...]:
    """``{"token_ids": [...]}``: the ids."""
    if not isinstance(body, dict):
        raise BadRequest("body: expected a JSON object")
    return token_ids(body.get("token_ids"), "token_ids", vocab_size, limits.max_sequence_tokens)


# ---------------------------------------------------------------- primitives


def _datum(value: Any, where: str, loss_function: str, vocab_size: int, limits: Limits) -> Datum:
    value = json_object(value, where)
    only(value, ("model_input", "loss_fn_inputs"), where)
    model_input = json_object(required(value, "model_input", where), f"{where}.model_input")
    only(model_input, ("token_ids",), f"{where}.model_input")
    ids = token_ids(
        required(model_input, "token_ids", f"{where}.model_input"),
        f"{where}.model_input.token_ids",
        vocab_size,
        limits.max_sequence_tokens,
    )
    raw_inputs = json_object(required(value, "loss_fn_inputs", where), f"{where}.loss_fn_inputs")
    return Datum(ids, checks.datum_inputs(raw_inputs, ids, where, loss_function, vocab_size,
                                          limits))


def parse_forward_backward(
    body: Any, vocab_size: int, limits: Limits, *, backward: bool = True
) -> ForwardBackward:
    """``{"data": [datum, ...], "loss_function": name, "loss_config": {...}}``."""
    body = json_object(body, "body")
    only(body, ("seq", "data", "loss_function", "loss_config"), "body")
    loss_function = required(body, "loss_function", "body")
    config = checks.loss_config(loss_function, body.get("loss_config"))
    data = required(body, "data", "body")
    if not isinstance(data, list):
        raise BadRequest(f"data: expected a non-empty list of datums, got {kind(data)}")
    checks.datum_count(data, limits)
    datums = tuple(
        _datum(item, f"data[{index}]", loss_function, vocab_size, limits)
        for index, item in enumerate(data)
    )
    checks.total_tokens(datums, limits)
    return ForwardBackward(datums, loss_function, config, backward)


def parse_optim_step(body: Any) -> AdamParams:
    """``{"adam_params": {learning_rate, beta1, beta2, eps, weight_decay, grad_clip_norm}}``,
    every key required (no hidden defaults)."""
    body = json_object(body, "body")
    only(body, ("seq", "adam_params"), "body")
    return adam_params(required(body, "adam_params", "body"))


def parse_sample(body: Any, vocab_size: int, limits: Limits) -> SamplingRequest:
    """``{"version": N, "prompt": {"token_ids": [...]}, "num_samples": k,
    "sampling_params": {"max_tokens", "temperature", "top_p", "top_k", "seed", "stop"}}``."""
    body = json_object(body, "body")
    only(body, ("seq", "version", "prompt", "num_samples", "sampling_params"), "body")
    version = checks.sampler_version(required(body, "version", "body"))
    prompt = json_object(required(body, "prompt", "body"), "prompt")
    only(prompt, ("token_ids",), "prompt")
    ids = token_ids(
        required(prompt, "token_ids", "prompt"), "prompt.token_ids", vocab_size,
        limits.max_sequence_tokens,
    )
    num_samples = checks.num_samples(body.get("num_samples", 1), limits)
    params = json_object(required(body, "sampling_params", "body"), "sampling_params")
    only(params, SAMPLING_KEYS, "sampling_params")
    max_tokens = checks.max_new_tokens(required(params, "max_tokens", "sampling_params"), limits)
    checks.fits_context(len(ids), max_tokens, limits)
    stop = checks.stop_strings(params.get("stop", []))
    return SamplingRequest(
        version=version,
        prompt_token_ids=ids,
        num_samples=num_samples,
        max_tokens=max_tokens,
        temperature=checks.temperature(params.get("temperature", 1.0)),
        top_p=checks.top_p(params.get("top_p", 1.0)),
        top_k=checks.top_k(params.get("top_k", 0)),
        seed=checks.sample_seed(params.get("seed"), limits),
        stop=stop,
    )


def parse_logprobs(body: Any, vocab_size: int, limits: Limits) -> LogprobsRequest:
    """``{"sequences": [[ids], ...], "version": N | null}``; null = the trainer's weights."""
    body = json_object(body, "body")
    only(body, ("seq", "sequences", "version"), "body")
    sequences = required(body, "sequences", "body")
    if not isinstance(sequences, list):
        raise BadRequest(
            f"sequences: expected a non-empty list of token-id lists, got {kind(sequences)}"
        )
    return checks.logprobs_request(sequences, body.get("version"), vocab_size, limits)


def parse_save_weights(body: Any) -> SaveWeights:
    """``{"version": N}``: the snapshot's number, a non-negative integer."""
    body = json_object(body, "body")
    only(body, ("seq", "version"), "body")
    return SaveWeights(checks.sampler_version(required(body, "version", "body")))


def parse_state_name(body: Any, *, allow_run_id: bool = False) -> StateName:
    """``{"name": ...}``; for load_state also an optional ``run_id`` (another run's save)
    and ``optimizer`` (default true; false loads the adapter alone)."""
    body = json_object(body, "body")
    only(body, ("seq", "name", "run_id", "optimizer") if allow_run_id else ("seq", "name"),
         "body")
    run_id = body.get("run_id")
    if run_id is not None:
        # a run id names a folder under the state folder: the same rule as a name, so
        # "../../elsewhere" cannot reach outside it
        run_id = state_name(run_id, "run_id")
    optimizer = checks.optimizer_flag(body.get("optimizer", True))
    return StateName(state_name(required(body, "name", "body"), "name"), run_id, optimizer)


def parse_finish(body: Any) -> Finish:
    """``{}`` (only ``seq`` is accepted)."""
    only(json_object(body, "body"), ("seq",), "body")
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
    return checks.sequence_number(json_object(body, "body").get("seq"))

