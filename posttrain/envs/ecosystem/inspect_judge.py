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
import os
from typing import Any

from posttrain.envs.ecosystem.spec import JudgeEndpoint
from posttrain.errors import PosttrainError

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
            response = await self.client.chat.completions.create(
                model=self.model_name, messages=messages, **extra)
            output = ModelOutput.from_content(
                model=self.model_name, content=response.choices[0].message.content or "")
            usage = response.usage
            # the endpoint's own counts: inspect would otherwise count tokens with
            # tiktoken, whose vocabulary is a download
            output.usage = ModelUsage(
                input_tokens=usage.prompt_tokens if usage else 0,
                output_tokens=usage.completion_tokens if usage else 0,
                total_tokens=usage.total_tokens if usage else 0)
            return output

    return EndpointJudgeAPI


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

    try:
        names = [model.id for model in OpenAI(base_url=url, api_key=api_key).models.list()]
    except OpenAIError as error:
        raise PosttrainError(f"--env-judge-endpoint {url}: cannot list its models "
                             f"({error}); name one with --env-judge-model") from None
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
