"""In which precision a recipe's trainer computes: float32, or bfloat16 autocast.

Under bf16 autocast the matrix products of the forward and backward run in bfloat16 while
the weights, the LoRA adapter and AdamW's moments stay float32 (transformers' ``bf16=True``,
accelerate's mixed precision). On a GPU that has been the default all along. On a CPU it
pays where the CPU multiplies bfloat16 natively (AVX512-BF16 or AMX: about four times its
float32 peak here, benchmarks/RESULTS.md "Real weights at the machine's limit") and the
model is big enough for the products to dominate; elsewhere bfloat16 is emulated and
slower. Evaluation and sampling stay in the policy's own dtype either way.

``--precision auto`` (every recipe's default) picks bf16 on a GPU; on a CPU with native
bf16 and a model of 50M parameters or more, whichever a timed training pass found faster
on this machine (``posttrain.train.precision_probe``: a CPU flag does not say it, an Intel
Xeon with AMX ran SmolLM2's GRPO step slower under bf16); fp32 otherwise (the embedded
starters, whose recorded numbers were measured in float32). The run says which and why,
with the times it measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from posttrain.cpu_numerics import pinned_in
from posttrain.errors import PosttrainError
from posttrain.policy.model_agent import is_large_model
from posttrain.policy.models import models_dir
from posttrain.train.precision_probe import PrecisionMeasurement, measure_precision

PRECISIONS = ("auto", "fp32", "bf16")


@dataclass(frozen=True)
class PrecisionChoice:
    """The trainer's precision and why (said at the start of training)."""

    bf16: bool
    reason: str
    measured: PrecisionMeasurement | None = None  # what decided ``auto`` on this CPU

    def words(self) -> str:
        return ("bf16 autocast" if self.bf16 else "float32") + f" ({self.reason})"

    def to_dict(self) -> dict[str, Any]:
        """For the run's config and summary."""
        return {"bf16": self.bf16, "reason": self.reason,
                "measured": self.measured.to_dict() if self.measured else None}


def cpu_has_native_bf16() -> bool:
    """Does this CPU multiply bfloat16 natively (what oneDNN, behind torch's CPU matmuls,
    checks: AVX512-BF16 or AMX)?"""
    try:
        import torch

        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except Exception:  # an older torch without the check, or no oneDNN: say no
        return False


def precision_for(asked: str, policy: Any, *, say: Any = None) -> PrecisionChoice:
    """``choose_precision`` for a loaded ``policy`` on this machine: where ``auto`` would
    take bf16 on a CPU, a training pass is timed both ways first (or its time read from
    the models folder's cache; ``posttrain.train.precision_probe``)."""
    on_gpu = str(policy.device).startswith("cuda")
    large_model = is_large_model(policy)
    native_bf16 = cpu_has_native_bf16()
    measured = None
    if asked == "auto" and not on_gpu and native_bf16 and large_model:
        measured = measure_precision(policy.model, cache_dir=models_dir(),
                                     model_name=str(policy.name), say=say)
    return choose_precision(asked, on_gpu=on_gpu, large_model=large_model,
                            native_bf16=native_bf16, measured=measured, pinned=pinned_in())


def choose_precision(asked: str, *, on_gpu: bool, large_model: bool, native_bf16: bool,
                     measured: PrecisionMeasurement | None = None,
                     pinned: bool = False) -> PrecisionChoice:
    """The precision for ``--precision asked`` (module docstring); ``measured``: what a
    training pass took each way on this CPU, which decides ``auto`` there; ``pinned``:
    the process computes with the pinned kernels (``posttrain.cpu_numerics``), which keep
    bf16 off: not every CPU with AVX2 has it."""
    if asked not in PRECISIONS:
        raise PosttrainError(f"--precision {asked!r}: expected one of {', '.join(PRECISIONS)}")
    if asked == "fp32":
        return PrecisionChoice(False, "asked for (--precision fp32)")
    if asked == "bf16":
        if not on_gpu and not native_bf16:
            return PrecisionChoice(True, "asked for (--precision bf16); this CPU has no "
                                   "native bf16, so it is emulated and likely slower")
        return PrecisionChoice(True, "asked for (--precision bf16)")
    if on_gpu:
        return PrecisionChoice(True, "auto: a GPU")
    if pinned:
        return PrecisionChoice(False, "auto: the pinned CPU kernels (--numerics) compute "
                               "float32, as every CPU with AVX2 does")
    if not native_bf16:
        return PrecisionChoice(False, "auto: this CPU has no native bf16 (AVX512-BF16 or AMX)")
    if not large_model:
        return PrecisionChoice(False, "auto: a model under 50M parameters, like the embedded "
                               "starters, whose recorded numbers are float32")
    if measured is not None:
        if measured.bf16_faster:
            return PrecisionChoice(True, f"auto: {measured.words()}", measured)
        return PrecisionChoice(False, f"auto: {measured.words()}; bf16 does not pay here",
                               measured)
    return PrecisionChoice(True, "auto: a CPU with native bf16 and a model of 50M "
                           "parameters or more")
