"""Checking the JSON bodies of the tinker wire protocol (SDK 0.38) into typed requests.

Pure functions, no torch. Every refusal is a ``BadRequest`` naming the field
(``sampling_params.stop[2]``). Fields this server does not know are ignored (the SDK owns
the schema and adds to it); fields it knows but cannot honour with the value sent are
refused, never dropped: top-k logprobs, prompt alt tokens, target prompt logprobs,
stability records, image chunks.

Names and paths:

- a training client's model id is ``<session_id>:train:<model_seq_id>``, the scheme the
  SDK itself assumes when it creates a client from a checkpoint;
- checkpoint paths are ``tinker://<run_id>/weights/<name>`` (``save_state``: adapter,
  AdamW moments, step) and ``tinker://<run_id>/sampler_weights/<name>`` (a named sampler
  save: a PEFT adapter folder). They name the engine's run, not the session, so they
  still resolve after a restart.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from posttrain.service.engine.errors import BadRequest, TooLarge
from posttrain.service.engine.requests import Limits

TESTED_SDK_VERSION = "0.38.0"
KNOWN_SDK_SERIES = (0, 38)
# LoRA alpha for every tinker-made run, whatever the rank (SkyRL's choice too, and the
# value Tinker's LoRA guidance uses), so a learning rate means the same at any rank
TINKER_LORA_ALPHA = 32.0
PATH_PATTERN = re.compile(
    r"^tinker://(?P<run_id>[A-Za-z0-9][A-Za-z0-9._-]{0,63})/(?P<kind>weights|sampler_weights)"
    r"/(?P<name>[A-Za-z0-9][A-Za-z0-9._-]{0,63})$"
)


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), "null" if value is None else type(value).__name__)


def body_object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadRequest(f"body: expected a JSON object, got {_kind(body)}")
    return body


def text(body: dict[str, Any], key: str, *, where: str = "") -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value:
        raise BadRequest(f"{where}{key}: expected a non-empty string, got {_kind(value)}")
    return value


def whole(body: dict[str, Any], key: str, *, low: int | None = None, high: int | None = None,
          default: Any = ..., where: str = "") -> Any:
    """An integer field within ``[low, high]``; ``default`` when absent or null (required
    when no default is given)."""
    value = body.get(key)
    if value is None:
        if default is ...:
            raise BadRequest(f"{where}{key}: missing; expected an integer")
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{where}{key}: expected an integer, got {_kind(value)}")
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"from {low}" + (f" to {high}" if high is not None else " up")
        raise BadRequest(f"{where}{key}: expected an integer {bounds}, got {value}")
    return value


def real(body: dict[str, Any], key: str, default: float, *, low: float, high: float,
         where: str = "") -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or not low <= value <= high:
        raise BadRequest(f"{where}{key}: expected a number from {low:g} to {high:g}, "
                         f"got {value!r}")
    return float(value)


def flag(body: dict[str, Any], key: str, default: bool = False) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadRequest(f"{key}: expected true or false, got {_kind(value)}")
    return value


# ---------------------------------------------------------------- versions, ids, paths


def check_sdk_version(body: Any) -> str:
    """The client's ``sdk_version`` when it is a 0.38.x the server speaks; ``BadRequest``
    naming it and the tested version otherwise (the SDK then fails at construction)."""
    version = body.get("sdk_version") if isinstance(body, dict) else None
    match = re.match(r"^(\d+)\.(\d+)\.", version) if isinstance(version, str) else None
    if match is None or (int(match.group(1)), int(match.group(2))) != KNOWN_SDK_SERIES:
        raise BadRequest(
            f"this server speaks the tinker SDK {KNOWN_SDK_SERIES[0]}.{KNOWN_SDK_SERIES[1]}.x "
            f"wire protocol (tested with tinker=={TESTED_SDK_VERSION}); this client is "
            f"tinker {version if isinstance(version, str) else 'of unknown version'}: "
            f"pip install 'tinker=={TESTED_SDK_VERSION}'")
    return version


def model_id_for(session_id: str, model_seq_id: int) -> str:
    """The id of a session's training client number ``model_seq_id``."""
    return f"{session_id}:train:{model_seq_id}"


@dataclass(frozen=True)
class CheckpointPath:
    """A parsed ``tinker://<run_id>/<kind>/<name>``."""

    run_id: str
    kind: str  # "weights" | "sampler_weights"
    name: str

    @property
    def path(self) -> str:
        return f"tinker://{self.run_id}/{self.kind}/{self.name}"


def checkpoint_path(value: Any, where: str = "path") -> CheckpointPath:
    """``tinker://<run_id>/weights/<name>`` or ``.../sampler_weights/<name>``."""
    match = PATH_PATTERN.match(value) if isinstance(value, str) else None
    if match is None:
        raise BadRequest(
            f"{where}: expected tinker://<run_id>/weights/<name> or "
            f"tinker://<run_id>/sampler_weights/<name> (as save_state and "
            f"save_weights_for_sampler return them), got {value!r}")
    return CheckpointPath(match["run_id"], match["kind"], match["name"])


# ---------------------------------------------------------------- models


def lora_module_groups(model: Any, module_names: tuple[str, ...],
                       optional: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """The model's LoRA target names by tinker switch: "attn", "mlp", "unembed"."""
    groups: dict[str, list[str]] = {"attn": [], "mlp": [], "unembed": list(optional)}
    for qualified, _ in model.named_modules():
        short = qualified.rsplit(".", 1)[-1]
        if short not in module_names:
            continue
        parents = qualified.lower()
        kind = "attn" if "attn" in parents or "attention" in parents else "mlp"
        if short not in groups[kind]:
            groups[kind].append(short)
    return {kind: tuple(names) for kind, names in groups.items()}


def lora_targets(lora_config: Any, groups: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
    """LoRA target modules for a ``lora_config`` (``train_attn``, ``train_mlp``,
    ``train_unembed``, all true by default); ``groups`` maps "attn", "mlp", "unembed" to the
    model's module names of each kind."""
    chosen: list[str] = []
    for switch, group in (("train_attn", "attn"), ("train_mlp", "mlp"),
                          ("train_unembed", "unembed")):
        if flag(lora_config, switch, True):
            if not groups.get(group):
                raise BadRequest(f"lora_config.{switch}: this model has no {group} layer LoRA "
                                 "can wrap; set it to false")
            chosen.extend(groups[group])
    if not chosen:
        raise BadRequest("lora_config: train_attn, train_mlp and train_unembed are all false; "
                         "nothing would be trained")
    return tuple(dict.fromkeys(chosen))


def check_optimizer_config(config: Any, where: str = "optimizer_config") -> None:
    """Only AdamW (the SDK's default) is served."""
    if config is None:
        return
    kind = config.get("type") if isinstance(config, dict) else None
    if kind != "adamw":
        raise BadRequest(f"{where}: optimizer {kind!r} is not supported; this server steps "
                         "with AdamW (leave optimizer unset)")


# ---------------------------------------------------------------- sampling


@dataclass(frozen=True)
class SampleJob:
    """One checked ``asample`` request."""

    prompt: tuple[int, ...]
    num_samples: int
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int  # 0: off
    seed: int | None
    stop_strings: tuple[str, ...]
    stop_token_ids: tuple[int, ...]
    prompt_logprobs: bool
    prompt_logprobs_last_n: int | None


def prompt_tokens(prompt: Any, vocab_size: int, max_length: int, where: str = "prompt"
                  ) -> tuple[int, ...]:
    """The token ids of a ``ModelInput`` (``{"chunks": [{"type": "encoded_text", ...}]}``)."""
    chunks = prompt.get("chunks") if isinstance(prompt, dict) else None
    if not isinstance(chunks, list) or not chunks:
        raise BadRequest(f"{where}.chunks: expected a non-empty list of chunks")
    tokens: list[int] = []
    for index, chunk in enumerate(chunks):
        kind = chunk.get("type") if isinstance(chunk, dict) else None
        if kind != "encoded_text":
            raise BadRequest(f"{where}.chunks[{index}]: {kind or 'untyped'} chunks are not "
                             "supported; this server samples a text model (encoded_text only)")
        ids = chunk.get("tokens")
        if not isinstance(ids, list):
            raise BadRequest(f"{where}.chunks[{index}].tokens: expected a list of token ids")
        for position, token in enumerate(ids):
            if isinstance(token, bool) or not isinstance(token, int) \
                    or not 0 <= token < vocab_size:
                raise BadRequest(f"{where}.chunks[{index}].tokens[{position}]: expected a "
                                 f"token id in [0, {vocab_size}), got {token!r}")
        tokens.extend(ids)
    if not tokens:
        raise BadRequest(f"{where}: needs at least one token")
    if len(tokens) > max_length:
        raise TooLarge(f"{where}: {len(tokens)} tokens, over the context of {max_length}")
    return tuple(tokens)


def _stops(value: Any, vocab_size: int) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """``stop``: a string, a list of strings, or a list of token ids."""
    if value is None:
        return (), ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise BadRequest("sampling_params.stop: expected a string, a list of strings or a "
                         "list of token ids")
    if all(isinstance(item, str) and item for item in value):
        return tuple(value), ()
    for index, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, int) or not 0 <= item < vocab_size:
            raise BadRequest(f"sampling_params.stop[{index}]: expected all non-empty strings "
                             f"or all token ids in [0, {vocab_size}), got {item!r}")
    return (), tuple(value)


def _refuse_unsupported(body: dict[str, Any]) -> None:
    if whole(body, "topk_prompt_logprobs", low=0, default=0) or \
            whole(body, "topk_sample_logprobs", low=0, default=0):
        raise BadRequest("topk_prompt_logprobs / topk_sample_logprobs: top-k logprobs are not "
                         "supported here; send 0 (the sampled tokens' logprobs and "
                         "prompt_logprobs are)")
    if whole(body, "prompt_alt_tokens_k", low=0, default=0):
        raise BadRequest("prompt_alt_tokens_k: prompt alt tokens are not supported here; "
                         "send 0")
    if body.get("target_prompt_logprobs") is not None:
        raise BadRequest("target_prompt_logprobs: not supported here; use prompt_logprobs "
                         "(compute_logprobs) on the sequences you want scored")
    if flag(body, "record_stability_info"):
        raise BadRequest("record_stability_info: stability records serve the stable_reinforce "
                         "loss, which this server does not have; sample without it")


def parse_sample(body: Any, vocab_size: int, limits: Limits) -> SampleJob:
    """An ``asample`` body (``SampleRequest``) as a ``SampleJob``. ``max_tokens`` null means
    as many as fit the context, up to ``limits.max_new_tokens``."""
    body = body_object(body)
    _refuse_unsupported(body)
    context = limits.max_sequence_tokens
    prompt = prompt_tokens(body.get("prompt"), vocab_size, context - 1)
    num_samples = whole(body, "num_samples", low=1, high=limits.max_num_samples, default=1)
    params = body.get("sampling_params")
    if not isinstance(params, dict):
        raise BadRequest(f"sampling_params: expected an object, got {_kind(params)}")
    where = "sampling_params."
    room = min(limits.max_new_tokens, context - len(prompt))
    max_tokens = whole(params, "max_tokens", low=1, high=limits.max_new_tokens, default=room,
                       where=where)
    if max_tokens > room:
        raise BadRequest(f"sampling_params.max_tokens: the prompt's {len(prompt)} tokens + "
                         f"{max_tokens} exceed the model's context of {context} tokens")
    top_k = whole(params, "top_k", low=-1, default=-1, where=where)
    stop_strings, stop_token_ids = _stops(params.get("stop"), vocab_size)
    want_prompt_logprobs = flag(body, "prompt_logprobs")
    last_n = whole(body, "prompt_logprobs_last_n", low=1, high=max(1, len(prompt) - 1),
                   default=None)
    if last_n is not None and not want_prompt_logprobs:
        raise BadRequest("prompt_logprobs_last_n: applies to prompt logprobs; set "
                         "prompt_logprobs")
    return SampleJob(
        prompt=prompt,
        num_samples=num_samples,
        max_tokens=max_tokens,
        temperature=real(params, "temperature", 1.0, low=0.0, high=100.0, where=where),
        top_p=real(params, "top_p", 1.0, low=1e-9, high=1.0, where=where),
        top_k=max(top_k, 0),  # the SDK's -1 and vLLM's 0 both mean off
        seed=whole(params, "seed", low=0, high=2**63 - 1 - num_samples, default=None,
                   where=where),
        stop_strings=stop_strings,
        stop_token_ids=stop_token_ids,
        prompt_logprobs=want_prompt_logprobs,
        prompt_logprobs_last_n=last_n,
    )
