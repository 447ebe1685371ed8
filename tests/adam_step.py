"""Two LoRA adapters after one optimizer step from the same start, on gradients that
agree up to float32 rounding (micro-batches against one pass): how close they must be.

Why not one absolute tolerance. LoRA's ``B`` starts at zero, so ``A`` gets no gradient in
the first step and ``B`` moves by AdamW's first step, which with bias correction is
``u = -lr * g / (|g| + eps)`` per element (``eps`` = 1e-8, transformers' ``adam_epsilon``).
A gradient that differs by ``dg`` moves ``u`` by ``lr * eps * |dg| / (|g| + eps)**2``:
nothing where ``|g|`` is far above ``eps``, up to ``lr`` where ``|g|`` is near it. Which
elements land near ``eps`` depends on the CPU's kernels (a LoRA weight differed by 1.36e-5
on an Intel Xeon with AMX against a flat 1e-5 allowed), so each element gets its own bound.

The bound. ``r = |u| / lr = |g| / (|g| + eps)`` is read off the adapter itself, and with
it ``|g| = eps * r / (1 - r)``. The two runs' gradients differ by a rounding relative to
the element (``ROUNDING * |g|``) plus one relative to the terms summed into it, which
after clipping to ``max_grad_norm`` are at most ``CLIP`` (``ROUNDING * CLIP``). Put into
the derivative above, ``|du| <= lr * (ROUNDING * r * (1 - r) + ROUNDING * CLIP * (1 - r)**2
/ eps)``, at most ``2 * lr`` (each step moves an element by at most ``lr``), plus the
ulps AdamW's own float32 arithmetic rounds ``u`` by (``STORAGE``). ``ROUNDING`` is the
relative error of float32 arithmetic over the forward and backward of a small model whose
batch shapes differ between the two runs: 1e-3 (``n * 2**-24`` for n ~ 1.6e4 operations
in a chain); the largest seen here was 0.003 * lr, on an element whose gradient was
0.7 * eps.

Elements near ``eps`` are bounded loosely: a first Adam step is nearly ``lr * sign(g)``,
so it says little about the gradient's scale. The callers also compare the step's loss
and gradient norm, which do.
"""

from __future__ import annotations

from typing import Any

#: transformers' AdamW epsilon (TrainingArguments.adam_epsilon)
ADAM_EPS = 1e-8
#: float32 relative rounding over a small model's forward and backward (module docstring)
ROUNDING = 1e-3
#: the recipes' max_grad_norm: after clipping no gradient term is larger
CLIP = 1.0
#: AdamW computes u through about five float32 operations (the moments and their bias
#: corrections, sqrt, + eps, the division, times lr), each rounding by half an ulp, in each
#: of the two runs: up to ~5 ulps of lr apart where the gradients agree (2 seen); 8 allowed
STORAGE = 8 * 2.0**-23


def first_step_bounds(reference: Any, lr: float) -> Any:
    """Per element, how far another run may be from ``reference`` (an adapter weight after
    AdamW's first step from zero at learning rate ``lr``), by the module docstring's bound;
    ``r`` is read off the reference, so a wrong element cannot loosen its own bound."""
    slack = (1 - reference.abs() / lr).clamp(0, 1)
    r = 1 - slack
    share = ROUNDING * r * slack + ROUNDING * CLIP * slack**2 / ADAM_EPS
    return lr * (share.clamp(max=2.0) + STORAGE)


def assert_same_first_step(reference: dict[str, Any], other: dict[str, Any]) -> None:
    """``reference`` and ``other`` (state dicts of adapters after one step) agree as one
    AdamW step on float32-rounded gradients can (module docstring). The step's learning
    rate is read off ``reference``: the largest update is ``lr`` to within rounding."""
    moved = {key: tensor for key, tensor in reference.items()
             if "lora_B" in key and float(tensor.abs().max()) > 0}
    assert moved, "no LoRA B weight moved: the step did not train"
    lr = max(float(tensor.abs().max()) for tensor in moved.values())
    for key, tensor in reference.items():
        difference = (other[key] - tensor).abs()
        if key not in moved:  # A (no gradient in a first step): the same bytes
            assert float(difference.max()) <= lr * STORAGE, key
            continue
        bounds = first_step_bounds(tensor, lr)
        worst = int((difference - bounds).argmax())
        assert bool((difference <= bounds).all()), (
            f"{key}: element {worst} differs by {float(difference.flatten()[worst]):.3g}, "
            f"bound {float(bounds.flatten()[worst]):.3g} (lr {lr:.3g})")
