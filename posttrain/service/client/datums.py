"""The datums and payloads of the service's training primitives, built on the caller's side.

The wire convention (Tinker's): a datum's ``model_input.token_ids`` is the full sequence
minus its last token and ``target_tokens`` the full sequence minus its first, so position
``i`` predicts token ``i + 1``; every per-token input has one value per input token.
Prompt positions carry weight 0, so only the completion is trained. Pure functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def rl_datum(
    prompt_tokens: Sequence[int],
    completion_tokens: Sequence[int],
    completion_logprobs: Sequence[float],
    advantage: float | Sequence[float],
) -> dict[str, Any]:
    """One policy-gradient datum for prompt + completion, in the wire convention.

    ``model_input`` is the full sequence minus its last token and ``target_tokens`` the
    full sequence minus its first, so position ``i`` predicts token ``i + 1``. Prompt
    positions get logprob 0, advantage 0 and weight 0; completion positions the sampled
    logprob, the advantage (one number for every token, or one per token) and weight 1.
    """
    prompt, completion = list(prompt_tokens), list(completion_tokens)
    if not prompt or not completion:
        raise ValueError("rl_datum needs a non-empty prompt and a non-empty completion")
    if len(completion_logprobs) != len(completion):
        raise ValueError(
            f"{len(completion)} completion tokens but {len(completion_logprobs)} logprobs"
        )
    if isinstance(advantage, (int, float)):
        per_token = [float(advantage)] * len(completion)
    else:
        per_token = [float(a) for a in advantage]
        if len(per_token) != len(completion):
            raise ValueError(f"{len(completion)} completion tokens but {len(per_token)} advantages")
    full = prompt + completion
    pad = [0.0] * (len(prompt) - 1)
    return {
        "model_input": {"token_ids": full[:-1]},
        "loss_fn_inputs": {
            "target_tokens": full[1:],
            "logprobs": pad + [float(lp) for lp in completion_logprobs],
            "advantages": pad + per_token,
            "weights": pad + [1.0] * len(completion),
        },
    }


def weighted_datum(
    prompt_tokens: Sequence[int], completion_tokens: Sequence[int], weight: float | Sequence[float]
) -> dict[str, Any]:
    """A ``cross_entropy`` datum: weight 0 on the prompt, ``weight`` on each completion token."""
    prompt, completion = list(prompt_tokens), list(completion_tokens)
    if not prompt or not completion:
        raise ValueError("weighted_datum needs a non-empty prompt and a non-empty completion")
    weights = ([float(weight)] * len(completion) if isinstance(weight, (int, float))
               else [float(w) for w in weight])
    full = prompt + completion
    return {
        "model_input": {"token_ids": full[:-1]},
        "loss_fn_inputs": {
            "target_tokens": full[1:],
            "weights": [0.0] * (len(prompt) - 1) + weights,
        },
    }


def forward_backward_payload(
    data: list[dict[str, Any]], loss_function: str, loss_config: dict[str, float] | None = None
) -> dict[str, Any]:
    """The ``forward_backward`` body: datums, loss name and its config (defaults when None)."""
    return {"data": data, "loss_function": loss_function, "loss_config": dict(loss_config or {})}
