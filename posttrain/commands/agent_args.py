"""Flags that choose what answers the prompts: the scripted agent or a model.

Shared by ``posttrain eval`` and anything else that evaluates a policy.
"""

from __future__ import annotations

import argparse
from typing import Any

from posttrain.commands.dataclass_args import real_number, whole_in, whole_number
from posttrain.envs import DEFAULT_ENV, get_env
from posttrain.envs.base import (
    BehaviourHelp,
    Env,
    ScriptedAgentSource,
    has_hook,
    require_hook,
)
from posttrain.errors import PosttrainError
from posttrain.policy.endpoint_agent import DEFAULT_MAX_TOKENS, EndpointAgent, EndpointSettings
from posttrain.policy.loading import agent_for_model
from posttrain.policy.model_agent import EVAL_TEMPERATURE, MODEL_MAX_NEW_TOKENS
from posttrain.policy.models import adapter_folder
from posttrain.policy.sampler import SamplingParams
from posttrain.policy.vllm_sampler import VllmAgent, check_vllm_sampler


def parse_behaviour(text: str) -> tuple[str, dict[str, float]]:
    """Parse ``CATEGORY=move:p[,move:p...]``, e.g. ``with_id=right:0.3,refund_first:0.3``.

    The category and the moves are the environment's (checked when the agent is built,
    once ``--env`` is known); here only the shape and the numbers.
    """
    category, _, spec = text.partition("=")
    if not category or not spec:
        raise argparse.ArgumentTypeError(f"{text!r}: expected CATEGORY=move:p[,move:p]")
    values: dict[str, float] = {}
    for part in spec.split(","):
        key, _, number = part.partition(":")
        try:
            values[key] = float(number)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: {number!r} is not a number") from None
    return category, values


def add_agent_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("what answers the prompts")
    group.add_argument(
        "--agent",
        choices=("seeded", "model", "endpoint"),
        default=None,
        help="'seeded': the scripted agent (no model); 'model': a language model loaded "
        "here (implied by --base-model); 'endpoint': a model behind an OpenAI-compatible "
        "API (implied by --endpoint). Default: seeded unless --base-model or --endpoint "
        "is given",
    )
    group.add_argument(
        "--behaviour",
        action="append",
        type=parse_behaviour,
        default=[],
        metavar="CATEGORY=move:p,...",
        help="the scripted agent's moves per category, as probabilities; repeatable. The "
        f"moves are the environment's; {_default_behaviour_help()}",
    )
    group.add_argument(
        "--agent-seed", type=whole_number, default=0, help="the scripted agent's seed (default 0)"
    )
    group.add_argument(
        "--base-model",
        default=None,
        help="model to evaluate: starter, starter-2m, smollm2, a hub id, a local folder "
        "or a .gguf file",
    )
    group.add_argument("--adapter", default=None, help="LoRA adapter folder or run folder")
    group.add_argument(
        "--temperature", type=real_number, default=0.8, help="sampling temperature (default 0.8)"
    )
    group.add_argument("--top-p", type=real_number, default=0.95,
                       help="nucleus sampling (default 0.95)")
    group.add_argument(
        "--sampler",
        choices=("transformers", "vllm"),
        default="transformers",
        help="what samples a model: transformers (posttrain's own loop, any device; default) "
        "or vllm (needs the vllm package and a CUDA GPU; a hub model or local folder)",
    )
    add_endpoint_args(parser)
    group.add_argument(
        "--max-new-tokens",
        type=whole_in(high=1_000_000),
        default=None,
        help="reply length cap in tokens (default: the model's evaluation default)",
    )


def add_endpoint_args(parser: argparse.ArgumentParser,
                      what: str = "the environment's tools are sent as tools and tool calls "
                                  "come back graded like in-text <tool_call> blocks") -> None:
    """``--endpoint`` and its companions: a model behind an OpenAI-compatible API."""
    endpoint = parser.add_argument_group("a model behind an endpoint (vLLM, llama.cpp, "
                                         "ollama, a hosted API, posttrain serve)")
    endpoint.add_argument(
        "--endpoint", default=None, metavar="URL",
        help=f"the OpenAI-compatible API base, e.g. http://127.0.0.1:8000/v1; {what}")
    endpoint.add_argument(
        "--endpoint-model", default=None, metavar="NAME",
        help="the model to ask for (default: the endpoint's only model)")
    endpoint.add_argument(
        "--endpoint-key-env", default="OPENAI_API_KEY", metavar="VAR",
        help="environment variable holding the API key (default OPENAI_API_KEY; a local "
        "server without a key needs none)")
    endpoint.add_argument(
        "--endpoint-concurrency", type=whole_in(high=1024), default=8, metavar="N",
        help="requests in flight at once (default 8)")
    endpoint.add_argument(
        "--endpoint-retries", type=whole_in(high=100), default=5, metavar="N",
        help="retries of a 429 or 5xx answer, with exponential backoff (default 5)")


def endpoint_settings(args: argparse.Namespace, *, temperature: float, top_p: float,
                      max_tokens: int) -> Any:
    """The ``EndpointSettings`` the ``--endpoint`` flags describe."""
    return EndpointSettings(
        url=args.endpoint, model=args.endpoint_model, key_env=args.endpoint_key_env,
        concurrency=args.endpoint_concurrency, max_retries=args.endpoint_retries,
        temperature=temperature, top_p=top_p, max_tokens=max_tokens)


def _default_behaviour_help() -> str:
    """The default environment's moves, for ``--help`` (it is not yet known which
    environment ``--env`` will name)."""
    env = get_env()
    return f"for {DEFAULT_ENV}: {env.behaviour_help()}" if has_hook(env, BehaviourHelp) else ""


def build_agent(args: argparse.Namespace, env: Env) -> Any:
    """The agent the flags describe. A model is loaded only when asked for."""
    endpoint = getattr(args, "endpoint", None)
    kind = args.agent or ("endpoint" if endpoint else "model" if args.base_model else "seeded")
    if kind == "endpoint":
        return endpoint_agent(args, env)
    if endpoint:
        raise PosttrainError(f"--endpoint asks an endpoint; it does not go with --agent {kind}")
    if kind == "seeded":
        if getattr(args, "sampler", "transformers") == "vllm":
            raise PosttrainError("--sampler vllm samples a model: give --base-model")
        if args.base_model or args.adapter:
            raise PosttrainError("--base-model/--adapter need --agent model (or no --agent)")
        scripted = require_hook(env, ScriptedAgentSource, "has no scripted agent",
                                "evaluate a model with --base-model").scripted_agent
        behaviour = dict(args.behaviour)
        unknown = [name for name in behaviour if name not in env.categories]
        if unknown:
            raise PosttrainError(f"--behaviour {unknown[0]}=...: unknown category; use one of "
                                 f"{', '.join(env.categories)}")
        try:
            return scripted(seed=args.agent_seed, behaviour=behaviour)
        except ValueError as error:
            raise PosttrainError(f"--behaviour: {error}") from None
    if not args.base_model:
        raise PosttrainError("--agent model needs --base-model (e.g. --base-model starter)")
    if getattr(args, "sampler", "transformers") == "vllm":
        return vllm_agent(args)
    return agent_for_model(
        args.base_model,
        adapter=args.adapter,
        temperature=args.temperature,
        top_p=args.top_p,
        max_new_tokens=args.max_new_tokens,
        env=args.env,  # ``starter`` is this environment's own when it has no other
        prompts_file=getattr(args, "prompts_file", None),
    )


def vllm_agent(args: argparse.Namespace) -> Any:
    """``--sampler vllm``: the model on a vLLM engine (refused here when it cannot run)."""
    check_vllm_sampler(args.base_model)
    adapter = str(adapter_folder(args.adapter)) if args.adapter else None
    params = SamplingParams(
        temperature=EVAL_TEMPERATURE if args.temperature is None else args.temperature,
        top_p=args.top_p,
        max_new_tokens=args.max_new_tokens or MODEL_MAX_NEW_TOKENS,
    )
    return VllmAgent(args.base_model, adapter, params)


def endpoint_agent(args: argparse.Namespace, env: Env) -> Any:
    """``--endpoint``: the model behind an OpenAI-compatible API, asked with ``env``'s tools."""
    if not args.endpoint:
        raise PosttrainError("--agent endpoint needs --endpoint URL (an OpenAI-compatible "
                             "API base, e.g. http://127.0.0.1:8000/v1)")
    if args.base_model or args.adapter:
        raise PosttrainError("--endpoint asks a model served elsewhere: leave out "
                             "--base-model/--adapter (name the served model with "
                             "--endpoint-model)")
    if getattr(args, "sampler", "transformers") != "transformers":
        raise PosttrainError("--sampler is for models loaded here; the endpoint samples itself")
    settings = endpoint_settings(args, temperature=args.temperature, top_p=args.top_p,
                                 max_tokens=args.max_new_tokens or DEFAULT_MAX_TOKENS)
    return EndpointAgent(settings, tools=getattr(env, "tools", None))
