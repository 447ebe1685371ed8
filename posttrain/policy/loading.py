"""A ``--base-model`` name to a loaded policy; a starter not yet built is built first.

The one place that joins the starters (``posttrain.policy.starters``) to the model loading
of ``posttrain.policy.models``: below this module nothing builds a model, so the starter
build itself can use the loaders, the sampler and the grading without a cycle. A starter
name is looked up in the registry's cache; only when its build is missing does loading
call the build step, by name, and the build says so on the console.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from posttrain.errors import PosttrainError
from posttrain.policy.model_agent import (
    EVAL_TEMPERATURE,
    EVAL_TOP_P,
    ModelAgent,
    default_max_new_tokens,
)
from posttrain.policy.models import (
    Policy,
    default_device,
    default_dtype,
    load_adapter,
    resolve_model_source,
)
from posttrain.policy.sampler import SamplingParams
from posttrain.policy.starter_names import is_starter_name
from posttrain.policy.starters.build import build_starter
from posttrain.policy.starters.registry import cached_starter


def resolve_base_model(
    base_model: str, *, show_progress: bool = True, env: str | None = None,
    prompts_file: str | None = None,
) -> tuple[str, dict[str, Any]]:
    """``(what from_pretrained reads, extra kwargs)`` for a ``--base-model`` value: a
    starter's built folder (``starter`` with ``env`` is that environment's own,
    ``posttrain.policy.starters.registry.recipe_for``), built now when the cache has none;
    else what ``posttrain.policy.models.resolve_model_source`` finds."""
    if is_starter_name(base_model):
        folder = cached_starter(base_model, env=env, prompts_file=prompts_file)
        if folder is None:  # first use on this machine: the build step (minutes)
            folder = build_starter(base_model, show_progress=show_progress, env=env,
                                   prompts_file=prompts_file)
        return str(folder), {}
    return resolve_model_source(base_model)


def load_policy(
    base_model: str,
    *,
    adapter: str | None = None,
    device: str | None = None,
    dtype: str | None = None,
    show_progress: bool = True,
    env: str | None = None,
    prompts_file: str | None = None,
) -> Policy:
    """Load model + tokenizer for ``base_model`` (see module docstring), then ``adapter``.

    ``device`` defaults to CUDA when present, else CPU; ``dtype`` to bfloat16 on
    CUDA, float32 on CPU. ``env`` (and ``prompts_file``) say whose ``starter`` is meant.
    The model is returned in eval mode. The tokenizer pads
    on the left (what batched generation needs) and always has a pad token.
    Raises ``PosttrainError`` for names that cannot be loaded, with what to do.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = device or default_device()
    dtype = dtype or default_dtype(device)
    source, kwargs = resolve_base_model(base_model, show_progress=show_progress, env=env,
                                        prompts_file=prompts_file)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=getattr(torch, dtype), **kwargs)
    except OSError as error:
        raise PosttrainError(f"cannot load {base_model!r}: {error}") from error
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.chat_template is None:
        raise PosttrainError(
            f"{base_model!r} has no chat template; posttrain needs a chat (instruct) model"
        )
    model.to(device)
    model.eval()
    policy = Policy(
        model=model,
        tokenizer=tokenizer,
        name=base_model,
        device=device,
        dtype=dtype,
        source=source if Path(source).is_dir() else None,
    )
    return load_adapter(policy, adapter) if adapter else policy


def agent_for_model(
    base_model: str,
    *,
    adapter: str | None = None,
    temperature: float = EVAL_TEMPERATURE,
    top_p: float = EVAL_TOP_P,
    top_k: int = 0,
    max_new_tokens: int | None = None,
    batch_size: int | None = None,
    env: str | None = None,
    prompts_file: str | None = None,
) -> ModelAgent:
    """Load ``base_model`` (+ ``adapter``; ``env``: whose ``starter``) and wrap it as an
    evaluation agent."""
    policy = load_policy(base_model, adapter=adapter, env=env, prompts_file=prompts_file)
    params = SamplingParams(
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        max_new_tokens=max_new_tokens or default_max_new_tokens(policy),
    )
    return ModelAgent(policy, params, batch_size=batch_size)
