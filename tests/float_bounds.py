"""Tolerances for two float computations of the same math whose sums are grouped
differently (another BLAS blocking, another batch shape, a weight merged into another),
derived from the arithmetic instead of read off one CPU.

A sum of ``n`` terms in a float type with unit roundoff ``u`` is off by at most
``n * u * (the sum of the terms' magnitudes)`` (the classic worst-case bound; Higham,
"Accuracy and Stability of Numerical Algorithms", section 3.1). A decoder's output goes
through one such sum per matrix product on its path: per layer, the attention and MLP
products (``hidden_size`` and ``intermediate_size`` terms), then the LM head
(``hidden_size`` terms). Errors entering earlier are carried forward, not multiplied away
(normalisation keeps the activations' scale), so the chain's bound adds up the layers'.
Two computations may each be off by it: their difference is bounded by twice that.
"""

from __future__ import annotations

from typing import Any

import pytest

#: unit roundoff (half an ulp at 1) of each float type
UNIT_ROUNDOFF = {"float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}


def decoder_terms(config: Any) -> int:
    """Summed terms along one output's path through a decoder with ``config``'s shape."""
    per_layer = config.hidden_size + config.intermediate_size
    return config.num_hidden_layers * per_layer + config.hidden_size


def difference_bound(config: Any, magnitude: float, dtype: str = "float32") -> float:
    """How far two groupings of one decoder forward may put an output whose size is about
    ``magnitude`` (the largest |value| compared), in ``dtype``'s arithmetic."""
    return 2 * decoder_terms(config) * UNIT_ROUNDOFF[dtype] * magnitude


def rounding_flip_bound(magnitude: float, dtype: str = "bfloat16") -> float:
    """How far apart two roundings to ``dtype`` of almost the same value may land: one ulp
    at ``magnitude``, at most ``2u * magnitude``. Under bf16 autocast a matrix product
    sums in float32 and rounds its result to bfloat16, so two groupings of the same sum
    (float32 results a few float32 ulps apart) come out equal or one bfloat16 ulp apart."""
    return 2 * UNIT_ROUNDOFF[dtype] * magnitude


def head_logprob_bound(hidden_size: int, max_logit: float, dtype: str = "bfloat16") -> float:
    """How far two groupings of the LM head may put a token's logprob when the hidden
    states they project are the same: each logit is a float32 sum of ``hidden_size``
    terms (off by ``2 * n * u32 * magnitude`` between groupings), rounded to ``dtype``
    (one more ulp); a logprob ``z_t - logsumexp(z)`` moves by at most twice the largest
    logit's move (the logsumexp moves by a probability-weighted mean of the logits')."""
    summed = 2 * hidden_size * UNIT_ROUNDOFF["float32"] * max_logit
    return 2 * (summed + rounding_flip_bound(max_logit, dtype))


def _native_bf16() -> bool:
    from posttrain.train.precision import cpu_has_native_bf16

    return cpu_has_native_bf16()


#: a check of bf16 autocast as a CPU with native bf16 runs it (SmolLM2, the recipes' choice
#: there): skipped where bf16 would be emulated, a hundred times slower, which is every CPU
#: without AVX512-BF16 or AMX and every pinned process (scripts/test.sh runs the suite
#: pinned; POSTTRAIN_NUMERICS=native bash scripts/test.sh runs these on such a CPU)
needs_native_bf16 = pytest.mark.skipif(
    not _native_bf16(), reason="bf16 autocast checked only where bf16 is native: this CPU "
    "has none, or the suite runs pinned (POSTTRAIN_NUMERICS=native runs it)")

