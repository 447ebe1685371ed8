"""A model behind any OpenAI-compatible chat endpoint as an evaluation agent.

``posttrain eval --endpoint URL`` grades what vLLM, llama.cpp, ollama, a hosted API or
``posttrain serve`` answers, with the same rows, statistics and ``--compare`` as a model
loaded in-process. What the agent does with each conversation:

- sends it with the environment's tools as OpenAI function tools; an assistant turn of
  the conversation that holds ``<tool_call>`` blocks (a multi-turn episode's history) goes
  as structured ``tool_calls`` and each tool result as a ``tool`` message answering it, so
  strict servers accept the history;
- turns the reply back into the text the environment grades: ``message.tool_calls`` are
  written as ``<tool_call>{"name", "arguments"}</tool_call>`` blocks after the content,
  so a returned ``tool_calls`` and an in-text block are graded the same way;
- passes the sample's seed (servers that honour ``seed`` reproduce their samples);
- runs at most ``concurrency`` requests at once; 429 and 5xx answers are retried with
  exponential backoff (the ``openai`` client's, honouring ``Retry-After``);
- stops with one clear error on a refused key (401/403), an unknown model (404, listing
  the server's models), a server it cannot reach or that does not answer within
  ``timeout_s``, and an answer that is not a chat completion (HTML, not JSON, JSON of
  another shape): the line names the endpoint and quotes the first 200 characters it
  sent (``posttrain.foreign_answers``). Answers are read from the raw body, never from
  the client library's lenient models, so a wrong shape cannot surface later as an
  ``AttributeError``.

The graded rows' ``policy`` says which endpoint and model answered.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from posttrain.envs.wire import TOOL_CALL_OPEN, parse_tool_calls
from posttrain.errors import PosttrainError
from posttrain.foreign_answers import chat_reply, model_ids, quoted

Messages = list[dict[str, Any]]
#: the reply cap when none is given: real models' prose (the in-process default for them)
DEFAULT_MAX_TOKENS = 128


@dataclass(frozen=True)
class EndpointSettings:
    """Where and how to ask."""

    url: str  # the API base, e.g. http://127.0.0.1:8400/v1
    model: str | None = None  # None: the endpoint's only model
    key_env: str = "OPENAI_API_KEY"  # the variable holding the API key
    concurrency: int = 8
    max_retries: int = 5
    timeout_s: float = 300.0
    temperature: float = 0.8
    top_p: float = 0.95
    max_tokens: int = DEFAULT_MAX_TOKENS
    #: the flags that named this endpoint, for messages (a judge's are --judge-endpoint, ...)
    flag: str = "--endpoint"
    model_flag: str = "--endpoint-model"
    key_flag: str = "--endpoint-key-env"

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise PosttrainError(f"{self.flag} {self.url}: expected an http:// or https:// URL "
                                 "of an OpenAI-compatible API (e.g. http://127.0.0.1:8000/v1)")
        if self.concurrency < 1:
            raise PosttrainError(f"--endpoint-concurrency must be at least 1, got "
                                 f"{self.concurrency}")
        if self.max_retries < 0:
            raise PosttrainError(f"--endpoint-retries must be 0 or more, got {self.max_retries}")


def to_openai_messages(messages: Messages) -> list[dict[str, Any]]:
    """A conversation as OpenAI messages: ``<tool_call>`` blocks of assistant turns as
    ``tool_calls`` with ids, and each ``tool`` result answering the next pending id."""
    converted: list[dict[str, Any]] = []
    pending: list[str] = []
    for index, message in enumerate(messages):
        role, content = message.get("role"), message.get("content") or ""
        if role == "assistant" and TOOL_CALL_OPEN in content:
            calls = parse_tool_calls(content)
            if calls:
                ids = [f"call_{index}_{number}" for number in range(len(calls))]
                converted.append({
                    "role": "assistant",
                    "content": content[: content.index(TOOL_CALL_OPEN)].strip() or None,
                    "tool_calls": [{"id": call_id, "type": "function",
                                    "function": {"name": call["name"],
                                                 "arguments": json.dumps(call["arguments"])}}
                                   for call_id, call in zip(ids, calls, strict=True)]})
                pending = ids
                continue
        if role == "tool":
            entry = {"role": "tool", "content": content,
                     "tool_call_id": pending.pop(0) if pending else f"call_{index}"}
            converted.append(entry)
            continue
        converted.append({"role": role, "content": content})
    return converted


class EndpointAgent:
    """The batch-agent protocol over an OpenAI-compatible endpoint (module docstring)."""

    def __init__(self, settings: EndpointSettings, tools: list[dict[str, Any]] | None = None):
        try:
            import openai
        except ImportError:
            raise PosttrainError(f"{settings.flag} needs the openai client: pip install "
                                 "'posttrain[endpoint]'") from None
        self.settings = settings
        self.tools = list(tools or [])
        self._openai = openai
        self.client = openai.OpenAI(base_url=settings.url.rstrip("/"),
                                    api_key=os.environ.get(settings.key_env) or "no-key",
                                    max_retries=settings.max_retries,
                                    timeout=settings.timeout_s)
        self.model = settings.model or self._only_model()
        self.policy: dict[str, Any] = {"agent": "endpoint", "endpoint": settings.url,
                                       "endpoint_model": self.model}
        self.sampling: dict[str, Any] = {key: value for key, value in asdict(settings).items()
                                         if key in ("temperature", "top_p", "max_tokens")}

    @property
    def where(self) -> str:
        """The flag and URL that named this endpoint, the start of its error lines."""
        return f"{self.settings.flag} {self.settings.url}"

    def _model_names(self) -> list[str]:
        raw = self._call(lambda: self.client.models.with_raw_response.list())
        return model_ids(raw.http_response.text, self.where)

    def _only_model(self) -> str:
        names = self._model_names()
        if len(names) != 1:
            raise PosttrainError(f"{self.settings.flag} {self.settings.url} serves "
                                 f"{len(names)} models ({', '.join(names[:10]) or 'none'}): "
                                 f"name one with {self.settings.model_flag}")
        return names[0]

    def _call(self, request: Any) -> Any:
        """``request()`` with the endpoint's refusals turned into one clear error."""
        openai = self._openai
        where = self.where
        try:
            return request()
        except (openai.AuthenticationError, openai.PermissionDeniedError) as error:
            raise PosttrainError(
                f"{where} refused the API key (HTTP {error.status_code}: "
                f"{quoted(error.message)}); "
                f"the key is read from ${self.settings.key_env} (set it, or name another "
                f"variable with {self.settings.key_flag})") from None
        except openai.NotFoundError as error:
            raise PosttrainError(f"{where} answered HTTP 404: {quoted(error.message)}"
                                 f"{self._models_hint()}") from None
        except openai.RateLimitError as error:
            raise PosttrainError(
                f"{where} still answered 429 after {self.settings.max_retries} retries "
                f"({quoted(error.message)}); lower --endpoint-concurrency or raise "
                "--endpoint-retries") from None
        except openai.APITimeoutError:
            raise PosttrainError(f"{where}: no answer within {self.settings.timeout_s:g} s "
                                 f"(tried {self.settings.max_retries + 1} times)") from None
        except openai.APIConnectionError as error:
            # the cause says which: refused, reset, or an answer cut short
            raise PosttrainError(f"{where}: cannot reach it or it broke off its answer "
                                 f"({quoted(str(error.__cause__ or error))}); is the server "
                                 "running, and is the URL its API base (often ending in "
                                 "/v1)?") from None
        except openai.APIStatusError as error:
            raise PosttrainError(f"{where} answered HTTP {error.status_code}: "
                                 f"{quoted(error.message)}") from None
        except openai.APIError as error:  # anything else the client refused to read
            raise PosttrainError(f"{where}: {quoted(str(error))}") from None

    def check(self) -> None:
        """Ask the endpoint for its models now: a server that is down, a refused key or a
        model it does not serve stops here, before any work (one clear error)."""
        names = self._model_names()
        if self.model not in names:
            raise PosttrainError(f"{self.settings.flag} {self.settings.url} does not serve "
                                 f"{self.model!r}; it serves: {', '.join(names[:10])}")

    def _models_hint(self) -> str:
        try:
            names = self._model_names()
        except PosttrainError:  # the listing is only a hint
            return ""
        return f"; it serves: {', '.join(names[:10])}" if names else ""

    def _one(self, messages: Messages, seed: int) -> str:
        extra = {"tools": self.tools} if self.tools else {}
        raw = self._call(lambda: self.client.chat.completions.with_raw_response.create(
            model=self.model, messages=to_openai_messages(messages),
            temperature=self.settings.temperature, top_p=self.settings.top_p,
            max_tokens=self.settings.max_tokens, seed=int(seed), **extra))
        answer = raw.http_response
        where = self.where
        if answer.history:  # followed a redirect: say where the answer came from
            where += f" (redirected to {answer.url})"
        return chat_reply(answer.text, where)

    def reply_batch(self, conversations: list[Messages], seeds: list[int]) -> list[str]:
        """One reply per conversation, in order, at most ``concurrency`` in flight."""
        if len(conversations) != len(seeds):
            raise ValueError(f"{len(conversations)} conversations but {len(seeds)} seeds")
        with ThreadPoolExecutor(self.settings.concurrency) as pool:
            return list(pool.map(self._one, conversations, seeds))

    def __call__(self, messages: Messages, seed: int = 0) -> str:
        return self.reply_batch([messages], [seed])[0]
