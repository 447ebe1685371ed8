"""The grader model an inspect task's model-graded scorers call: ``--env-judge-endpoint``.

inspect reaches a model through a provider (``ModelAPI``); its OpenAI providers need
openai >= 3.4, which posttrain's pin (2.54) and verifiers (< 3) do not allow. So posttrain
registers a small provider of its own, ``posttrain-judge``, that sends the scorer's chat
messages to an OpenAI-compatible endpoint with the official client posttrain already
pins, and scores a reply with that model as inspect's active model and its ``grader``
role (what ``model_graded_qa`` / ``model_graded_fact`` and custom graders ask for).
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any

from posttrain.envs.ecosystem.spec import JudgeEndpoint
from posttrain.errors import PosttrainError
from posttrain.foreign_answers import chat_reply, model_ids, quoted

PROVIDER = "posttrain-judge"


@functools.cache
def register_provider() -> type:
    """Define and register the ``posttrain-judge`` provider, once per process. (Defined
    here, not at the module's top, so posttrain imports without inspect_ai installed.)"""
    from inspect_ai.model import GenerateConfig, ModelAPI, ModelOutput, ModelUsage, modelapi

    @modelapi(name=PROVIDER)
    class EndpointJudgeAPI(ModelAPI):
        """Chat completions from an OpenAI-compatible endpoint (text in, text out; the
        judge gets no tools)."""

        def __init__(self, model_name: str, base_url: str | None = None,
                     api_key: str | None = None, config: Any = None,
                     **model_args: Any) -> None:
            super().__init__(model_name=model_name, base_url=base_url, api_key=api_key,
                             config=config or GenerateConfig())
            from openai import AsyncOpenAI

            self.client = AsyncOpenAI(base_url=base_url, api_key=api_key or "no-key")

        async def generate(self, input: list[Any], tools: list[Any], tool_choice: Any,
                           config: Any) -> Any:
            extra: dict[str, Any] = {}
            if config.temperature is not None:
                extra["temperature"] = config.temperature
            if config.max_tokens is not None:
                extra["max_tokens"] = config.max_tokens
            # plain role/content dicts (the judge gets no tools; a tool message reads as user)
            messages: Any = [{"role": message.role if message.role != "tool" else "user",
                              "content": message.text} for message in input]
            where = f"--env-judge-endpoint {self.base_url}"
            # the raw body, read with suspicion: a proxy's HTML or JSON of another shape
            # is one line naming the judge, not an AttributeError inside inspect's scorer
            body = await _judge_answer(self.client, where, model=self.model_name,
                                       messages=messages, **extra)
            output = ModelOutput.from_content(model=self.model_name,
                                              content=chat_reply(body, where))
            # the endpoint's own counts: inspect would otherwise count tokens with
            # tiktoken, whose vocabulary is a download
            counts = usage_counts(body)
            output.usage = ModelUsage(input_tokens=counts[0], output_tokens=counts[1],
                                      total_tokens=counts[2])
            return output

    return EndpointJudgeAPI


async def _judge_answer(client: Any, where: str, **request: Any) -> str:
    """The judge's raw answer to one chat request; the client's errors as one line."""
    import openai

    try:
        raw = await client.chat.completions.with_raw_response.create(**request)
    except openai.APIStatusError as error:
        raise PosttrainError(f"{where} answered HTTP {error.status_code}: "
                             f"{quoted(error.message)}") from None
    except openai.APIError as error:  # unreachable, timed out, or an answer cut short
        raise PosttrainError(f"{where}: {quoted(str(error.__cause__ or error))}") from None
    return raw.http_response.text


def usage_counts(body: str) -> tuple[int, int, int]:
    """(prompt, completion, total) tokens from a chat completion's ``usage``; zeros for
    what is missing or not a whole number (the counts are a report, not a reward)."""
    try:
        usage = json.loads(body).get("usage")
    except (ValueError, AttributeError):
        usage = None
    usage = usage if isinstance(usage, dict) else {}
    counts = [usage.get(key) for key in ("prompt_tokens", "completion_tokens", "total_tokens")]
    whole = [value if isinstance(value, int) and not isinstance(value, bool) else 0
             for value in counts]
    return whole[0], whole[1], whole[2]


def judge_model(judge: JudgeEndpoint) -> Any:
    """The grader at ``judge`` as an inspect ``Model`` (its only model when none is
    named)."""
    from inspect_ai.model import get_model

    register_provider()
    api_key = os.environ.get(judge.key_env) or "no-key"
    name = judge.model or _only_model(judge.url, api_key)
    return get_model(f"{PROVIDER}/{name}", base_url=judge.url, api_key=api_key,
                     memoize=False)


def _only_model(url: str, api_key: str) -> str:
    from openai import OpenAI, OpenAIError

    where = f"--env-judge-endpoint {url}"
    try:
        raw = OpenAI(base_url=url, api_key=api_key).models.with_raw_response.list()
    except OpenAIError as error:
        raise PosttrainError(f"{where}: cannot list its models ({quoted(str(error))}); name "
                             "one with --env-judge-model") from None
    names = model_ids(raw.http_response.text, where)
    if len(names) != 1:
        raise PosttrainError(f"--env-judge-endpoint {url} serves {len(names)} models "
                             f"({', '.join(names[:5])}); name one with --env-judge-model")
    return names[0]


async def graded_by(judge: Any, scoring: Any) -> Any:
    """Await ``scoring`` (a coroutine of scorers) with ``judge`` as inspect's active model
    and its ``grader`` role. The context variables are set inside this task only."""
    # inspect sets these when its own eval runs a sample; posttrain scores outside eval
    from inspect_ai.model import GenerateConfig
    from inspect_ai.model._model import init_active_model, init_model_roles

    init_active_model(judge, GenerateConfig())
    init_model_roles({"grader": judge})
    return await scoring
