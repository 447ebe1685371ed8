"""OpenAI-compatible sampling on ``posttrain serve``: ``POST /v1/chat/completions`` and
``GET /v1/models``, for eval harnesses, agents and anything else that speaks OpenAI's chat API.

**Models** (the request's ``model`` field, listed by ``GET /v1/models``):

- the base model, by the name the server was started with (``starter``, a hub id, ...);
- ``<run_id>:<version>``: a sampler version a live run saved (``save_weights_for_sampler``),
  and ``<run_id>`` for its newest one;
- ``<run_id>/<name>``: an adapter a run exported (``export_lora``), read from the state
  folder, so it outlives the run and a restart.

**Prompt.** The messages (``system``, ``user``, ``assistant`` with ``tool_calls``, ``tool``)
go through the model's chat template with the request's ``tools``. A template that cannot
render tool turns (the starter's plain ChatML) is swapped, for this request only, for
ChatML with Qwen's tool layout (``posttrain.policy.tool_turns``); when the template does
not render a tool list, the tools are listed at the end of the system message as JSON
schemas inside ``<tools>`` with a line saying how to call one, unless the system message
names every tool already (an environment's own prompt, such as the refund desk's, which
its model was trained on: adding a second list would only change that prompt).

**Reply.** ``<tool_call>{"name", "arguments"}</tool_call>`` blocks in the generated text
come back as ``message.tool_calls`` (``finish_reason: "tool_calls"``), the text before them
as ``content``. ``n`` samples use seeds ``seed + i`` (a seed is drawn when none is given);
``stop`` strings end a reply and are not part of it; ``logprobs: true`` gives each sampled
token's log-probability (raw logits, temperature 1, as the training primitives report
them); ``top_logprobs`` above 0 and ``stream: true`` are refused (400), never faked.

Sampling runs on the engine's compute thread, one request at a time with the training
primitives. Errors use the service's envelope, whose ``error.message`` is where OpenAI
clients look.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posttrain.envs.wire import parse_tool_calls
from posttrain.policy.sampler import SamplingParams
from posttrain.policy.tool_turns import TOOL_CHATML_TEMPLATE, renders_tool_turns
from posttrain.service.engine.errors import BadRequest, NotFound, ServiceError
from posttrain.service.engine.sampler_models import ModelSource
from posttrain.service.engine.text_encoding import Encoder

MAX_SAMPLES = 16
MAX_STOPS = 4
DEFAULT_MAX_TOKENS = 256
TOOL_CALL_END = "</tool_call>"
MESSAGE_ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass(frozen=True)
class ChatRequest:
    """A checked ``/v1/chat/completions`` body."""

    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    n: int
    temperature: float
    top_p: float
    max_tokens: int | None  # None: as many as fit, up to DEFAULT_MAX_TOKENS
    seed: int | None
    stop: tuple[str, ...]
    logprobs: bool


def _number(body: dict, key: str, default: float, low: float, high: float) -> float:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise BadRequest(f"{key}: expected a number from {low:g} to {high:g}, got {value!r}")
    return float(value)


def _whole(body: dict, key: str, default: int | None, low: int, high: int) -> int | None:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BadRequest(f"{key}: expected a whole number from {low} to {high}, got {value!r}")
    return value


def _content_text(content: Any, where: str) -> str:
    """A message's content: a string, or a list of text parts (images are refused)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for index, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" \
                    or not isinstance(part.get("text"), str):
                raise BadRequest(f"{where}.content[{index}]: only text parts "
                                 '({"type": "text", "text": ...}) can be sampled here')
            parts.append(part["text"])
        return "".join(parts)
    raise BadRequest(f"{where}.content: expected a string or a list of text parts")


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """An assistant message's ``tool_calls`` as the chat templates expect them (arguments
    as an object)."""
    if not isinstance(calls, list):
        raise BadRequest(f"{where}.tool_calls: expected a list")
    rendered = []
    for index, call in enumerate(calls):
        here = f"{where}.tool_calls[{index}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise BadRequest(f'{here}: expected {{"type": "function", "function": '
                             '{"name", "arguments"}}')
        arguments = function.get("arguments", "{}")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments or "{}")
            except ValueError:
                raise BadRequest(f"{here}.function.arguments: not valid JSON") from None
        if not isinstance(arguments, dict):
            raise BadRequest(f"{here}.function.arguments: expected a JSON object")
        rendered.append({"type": "function",
                         "function": {"name": function["name"], "arguments": arguments}})
    return rendered


def _messages(raw: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, list) or not raw:
        raise BadRequest("messages: expected a non-empty list of messages")
    messages = []
    for index, message in enumerate(raw):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise BadRequest(f"{where}: expected an object with role and content")
        role = message.get("role")
        if role not in MESSAGE_ROLES:
            raise BadRequest(f"{where}.role: expected one of {', '.join(MESSAGE_ROLES)}, "
                             f"got {role!r}")
        entry: dict[str, Any] = {"role": "system" if role == "developer" else role,
                                 "content": _content_text(message.get("content"), where)}
        if role == "assistant" and message.get("tool_calls"):
            entry["tool_calls"] = _tool_calls(message["tool_calls"], where)
        if role == "tool" and isinstance(message.get("name"), str):
            entry["name"] = message["name"]
        messages.append(entry)
    return messages


def _tools(raw: Any) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise BadRequest("tools: expected a list of function tools")
    for index, tool in enumerate(raw):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" \
                or not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise BadRequest(f'tools[{index}]: expected {{"type": "function", "function": '
                             '{"name", "description"?, "parameters"?}}')
    return raw


def parse_chat_request(body: Any, max_tokens_limit: int) -> ChatRequest:
    """Check a chat-completions body; ``BadRequest`` names the field."""
    if not isinstance(body, dict):
        raise BadRequest("body: expected a JSON object")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise BadRequest("model: expected the name of a model (GET /v1/models lists them)")
    if body.get("stream"):
        raise BadRequest("stream: streaming is not supported; send stream: false")
    if _whole(body, "top_logprobs", 0, 0, 20):
        raise BadRequest("top_logprobs: only the sampled token's logprob is available; "
                         "send 0 (or leave it out) with logprobs: true")
    if body.get("tool_choice") not in (None, "auto", "none"):
        raise BadRequest('tool_choice: only "auto" and "none" are supported')
    stop = body.get("stop")
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    if len(stops) > MAX_STOPS or not all(isinstance(s, str) and s for s in stops):
        raise BadRequest(f"stop: expected a string or a list of at most {MAX_STOPS} "
                         "non-empty strings")
    limit = _whole(body, "max_completion_tokens", None, 1, max_tokens_limit)
    limit = _whole(body, "max_tokens", limit, 1, max_tokens_limit)
    logprobs = body.get("logprobs", False)
    if not isinstance(logprobs, bool) and logprobs is not None:
        raise BadRequest("logprobs: expected true or false")
    tools = [] if body.get("tool_choice") == "none" else _tools(body.get("tools"))
    return ChatRequest(
        model=body["model"], messages=_messages(body.get("messages")), tools=tools,
        n=int(_whole(body, "n", 1, 1, MAX_SAMPLES) or 1),
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 1e-9, 1.0),
        max_tokens=limit,
        seed=_whole(body, "seed", None, 0, 2**62),
        stop=stops, logprobs=bool(logprobs))


# ------------------------------------------------------------------ prompts


def _renders_tools(tokenizer: Any, template: str | None) -> bool:
    probe = [{"type": "function", "function": {"name": "probe_tool_name", "parameters": {}}}]
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "u"}], tools=probe,
                                             chat_template=template, tokenize=False)
    except Exception:  # a template may refuse tools outright
        return False
    return "probe_tool_name" in text


def tools_section(tools: list[dict[str, Any]]) -> str:
    """The tool list for a template that does not render one itself."""
    schemas = "\n".join(json.dumps(tool, sort_keys=True) for tool in tools)
    return ("\n\nTools you can call, as JSON schemas:\n<tools>\n" + schemas + "\n</tools>\n"
            'To call one, reply with <tool_call>{"name": <tool name>, "arguments": '
            "<JSON object>}</tool_call>.")


def _lists_tools(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> bool:
    """Does the system message describe every tool already (an environment's own prompt,
    like posttrain's refund desk, written in the format its model was trained on)?"""
    system = messages[0]["content"] if messages and messages[0]["role"] == "system" else ""
    return all(f'"{tool["function"]["name"]}"' in system for tool in tools)


def render_prompt(encoder: Encoder, messages: list[dict[str, Any]],
                  tools: list[dict[str, Any]]) -> list[int]:
    """Prompt token ids: the messages through the chat template (module docstring), at a
    bounded cost (``posttrain.service.engine.text_encoding``)."""
    tokenizer = encoder.tokenizer
    template = None if renders_tool_turns(tokenizer) else TOOL_CHATML_TEMPLATE
    messages = [dict(message) for message in messages]
    kwargs: dict[str, Any] = {}
    if tools and _renders_tools(tokenizer, template):
        kwargs["tools"] = tools
    elif tools and not _lists_tools(messages, tools):
        if messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": ""})
        messages[0]["content"] = (messages[0]["content"] + tools_section(tools)).lstrip()
    try:
        return encoder.encode_chat(messages, chat_template=template, **kwargs)
    except ServiceError:
        raise  # the length checks: 413 / 400 with what to do
    except Exception as error:  # the template's own refusal (a role order it rejects)
        raise BadRequest(f"messages: the model's chat template refused them: {error}") from None


# ------------------------------------------------------------------ models


class ChatModels:
    """What ``model`` names resolve to (module docstring), and the model list; the engine
    finds the models (``engine.sampler_models``)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.created = int(time.time())

    def _export_folders(self) -> dict[str, Path]:
        return {f"{run_id}/{name}": folder
                for run_id, name, folder in self.engine.sampler_models.exported_adapters()}

    def _live_versions(self) -> dict[str, tuple[str, int]]:
        names: dict[str, tuple[str, int]] = {}
        for run_id, versions in self.engine.sampler_models.sampler_versions().items():
            for version in versions:
                names[f"{run_id}:{version}"] = (run_id, version)
            if versions:
                names[run_id] = (run_id, versions[-1])
        return names

    def list(self) -> list[dict[str, Any]]:
        """The entries of ``GET /v1/models``: the base model, live sampler versions,
        exported adapters."""
        created = self.created
        entries = [{"id": self.engine.base_model, "object": "model", "created": created,
                    "owned_by": "posttrain", "kind": "base"}]
        entries += [{"id": name, "object": "model", "created": created, "owned_by": "posttrain",
                     "kind": "sampler"} for name in self._live_versions()]
        entries += [{"id": name, "object": "model", "created": int(folder.stat().st_mtime),
                     "owned_by": "posttrain", "kind": "adapter"}
                    for name, folder in self._export_folders().items()]
        return entries

    def resolve(self, name: str) -> Any:
        """A callable ``() -> torch model`` for the compute thread, or ``NotFound``."""
        models = self.engine.sampler_models
        if name == self.engine.base_model:
            return lambda: models.model_for(ModelSource("base"))
        live = self._live_versions()
        if name in live:
            run_id, version = live[name]
            return lambda: models.model_for(ModelSource("snapshot", run_id, version))
        if name in self._export_folders():
            run_id, export = name.split("/", 1)
            return lambda: models.model_for(ModelSource("export", run_id, name=export))
        known = ", ".join(entry["id"] for entry in self.list()[:12])
        raise NotFound(f"model: no model {name!r} here; GET /v1/models lists them ({known})")


# ------------------------------------------------------------------ completions


def _split_stop(text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
    """The text without a final stop string the caller asked for (OpenAI leaves it out)."""
    for stop in stops:
        if text.endswith(stop):
            return text[: -len(stop)], True
    return text, False


def choice_of(index: int, completion: Any, request: ChatRequest, tokenizer: Any
              ) -> dict[str, Any]:
    """One OpenAI ``choice`` from a sampled completion."""
    text, stopped = _split_stop(completion.text, request.stop)
    message: dict[str, Any] = {"role": "assistant", "content": text}
    finish = "length" if completion.stop_reason == "length" else "stop"
    calls = parse_tool_calls(text) if request.tools and "<tool_call>" in text else None
    if calls:
        message["content"] = text[: text.index("<tool_call>")].strip() or None
        message["tool_calls"] = [
            {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
             "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])}}
            for call in calls]
        finish = "tool_calls"
    elif stopped:
        finish = "stop"
    logprobs = None
    if request.logprobs:
        logprobs = {"content": [
            {"token": tokenizer.decode([token]), "logprob": logprob,
             "bytes": list(tokenizer.decode([token]).encode("utf-8")), "top_logprobs": []}
            for token, logprob in zip(completion.token_ids, completion.logprobs, strict=True)]}
    return {"index": index, "message": message, "finish_reason": finish, "logprobs": logprobs}


def completion_budget(prompt_tokens: int, asked: int | None, context: int) -> int:
    """How many tokens the reply may have: ``asked`` (``max_tokens``), or up to
    ``DEFAULT_MAX_TOKENS`` of what the context leaves when None. ``BadRequest`` when the
    prompt leaves no room, or less than ``asked``; the message gives counts, never text."""
    room = context - prompt_tokens
    if room < 1:
        raise BadRequest(f"messages: the prompt is {prompt_tokens} tokens, longer than the "
                         f"model's context of {context} tokens (with room for at least one "
                         "more); shorten the messages")
    if asked is not None and asked > room:
        raise BadRequest(f"max_tokens: the prompt is {prompt_tokens} tokens, so at most "
                         f"{room} more fit the model's context of {context} tokens; got "
                         f"{asked}")
    return asked if asked is not None else min(DEFAULT_MAX_TOKENS, room)


def complete(engine: Any, models: ChatModels, body: Any) -> dict[str, Any]:
    """Answer one ``/v1/chat/completions`` body."""
    request = parse_chat_request(body, engine.limits.max_sequence_tokens)
    model_for = models.resolve(request.model)
    tokenizer = engine.policy.tokenizer
    prompt = render_prompt(engine.encoder, request.messages, request.tools)
    context = engine.limits.max_sequence_tokens
    max_tokens = completion_budget(len(prompt), request.max_tokens, context)
    seed = request.seed if request.seed is not None else random.SystemRandom().randrange(2**62)
    stops = tuple(dict.fromkeys((*request.stop, *((TOOL_CALL_END,) if request.tools else ()))))
    params = SamplingParams(temperature=request.temperature, top_p=request.top_p,
                            max_new_tokens=max_tokens, stop_strings=stops)

    def sample() -> list[Any]:
        sampler = engine.sampler_models.sampler_for(model_for())
        return sampler.sample_tokens([prompt] * request.n,
                                     [seed + i for i in range(request.n)], params)

    completions = engine.compute.run(sample)
    generated = sum(len(completion.token_ids) for completion in completions)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request.model,
        "system_fingerprint": f"posttrain-seed-{seed}",
        "choices": [choice_of(index, completion, request, tokenizer)
                    for index, completion in enumerate(completions)],
        "usage": {"prompt_tokens": len(prompt), "completion_tokens": generated,
                  "total_tokens": len(prompt) + generated},
    }
