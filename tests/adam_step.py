"""Two LoRA adapters after one optimizer step from the same start, on gradients that
agree up to float32 rounding (micro-batches against one pass): how close they must be.

Why not one absolute tolerance. LoRA's ``B`` starts at zero, so ``A`` gets no gradient in
the first step and ``B`` moves by AdamW's first step, which with bias correction is
``-lr * g / (|g| + eps)`` per element (``eps`` = 1e-8, transformers' ``adam_epsilon``).
Its sensitivity to the gradient, ``lr * eps / (|g| + eps)**2``, is tiny where ``|g|`` is
well above ``eps`` and as large as ``lr / eps`` where ``|g|`` is near it: a gradient
element that sums terms of opposite sign to about 1e-8 moves by a different fraction of
``lr`` under another summation order. Which elements land there depends on the CPU's
kernels (a LoRA weight differed by 1.36e-5 on an Intel Xeon with AMX, against 1e-5
allowed), so the comparison is split by the element's own conditioning:

- ``well`` elements, ``|update| >= (1 - WELL) * lr`` (so ``|g| >= eps / WELL``, 1e-5):
  their updates may differ by ``lr * eps * |dg| / |g|**2 <= lr * WELL * |dg| / |g|``; the
  gradients' relative rounding ``|dg| / |g|`` is below ``GRADIENT_ROUNDING`` for sums of
  up to ~1e5 float32 terms, so the bound is ``lr * WELL * GRADIENT_ROUNDING``;
- the rest, ill-conditioned: any Adam step moves an element by at most ``lr``, so two of
  them differ by at most ``2 * lr``; they must be few (``MAX_ILL_SHARE``), or the
  comparison would prove little.
"""

from __future__ import annotations

from typing import Any

#: 1 - |update| / lr below which an element's gradient is within 1e3 * eps of zero
WELL = 1e-3
#: relative error of a float32 sum of n terms in any order is at most about n * 2**-24;
#: a LoRA gradient element sums at most ~1e5 products here (tokens x features)
GRADIENT_ROUNDING = 1e-2
#: ill-conditioned elements allowed, as a share of the moved ones (measured: none or a
#: handful in ~10k on the starters)
MAX_ILL_SHARE = 0.01


def assert_same_first_step(reference: dict[str, Any], other: dict[str, Any]) -> None:
    """``reference`` and ``other`` (state dicts of adapters after one step) agree as one
    AdamW step on float32-rounded gradients can (module docstring). The step's learning
    rate is read off ``reference``: the largest update is ``lr`` to within ``WELL``."""
    moved = {key: tensor for key, tensor in reference.items() if float(tensor.abs().max()) > 0
             and "lora_B" in key}
    assert moved, "no LoRA B weight moved: the step did not train"
    lr = max(float(tensor.abs().max()) for tensor in moved.values())
    ill = total = 0
    for key, tensor in reference.items():
        difference = (other[key] - tensor).abs()
        if key not in moved:  # A (no gradient in the first step) and unmoved weights
            assert float(difference.max()) <= lr * WELL * GRADIENT_ROUNDING, key
            continue
        well = tensor.abs() >= (1 - WELL) * lr
        total += tensor.numel()
        ill += int((~well).sum())
        if bool(well.any()):
            assert float(difference[well].max()) <= lr * WELL * GRADIENT_ROUNDING, key
        assert float(difference.max()) <= 2 * lr, key
    assert ill <= MAX_ILL_SHARE * total, f"{ill} of {total} elements ill-conditioned"
