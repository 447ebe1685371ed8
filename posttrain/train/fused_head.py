"""TRL's fused LM head on a CPU: score only the positions that carry a label.

TRL 1.16 computes every recipe's per-token logprobs through one fused LM head
(``trl.trainer.utils.add_fused_lm_head``): the hidden states are projected onto the
vocabulary in tiles and folded into log-softmax statistics, never materialising the
``batch x sequence x vocabulary`` logits. Where it has Triton (CUDA, XPU) it projects only
the positions whose label is not ``-100``; everywhere else it projects *every* position and
zeroes the unlabelled ones afterwards, because on XLA devices (Neuron) a changing number of
positions would recompile the graph on every batch.

A CPU runs eagerly and recompiles nothing, so scoring every position there only wastes the
work: in a GRPO or SFT step on a real model the prompt (a ~300-token system prompt on the
refund rule) is most of each sequence, and the head's per-position work (a projection onto
49k words, then several elementwise passes over them, forward and backward) was over half
of an SFT step on SmolLM2 (py-spy, benchmarks/RESULTS.md). The values at labelled positions
are the same either way; unlabelled positions read zero either way.

``labelled_positions_only`` makes TRL's choice "compact" for the CPU too, for the length of
a training run, and puts TRL's own test back afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


def compact_on(device_type: str, triton_choice: bool) -> bool:
    """Whether the fused head should score only the labelled positions on this device: where
    TRL would (its Triton devices) and on the CPU, which runs eagerly."""
    return triton_choice or device_type == "cpu"


@contextmanager
def labelled_positions_only() -> Iterator[None]:
    """For the duration, TRL's fused LM head projects only the labelled positions on a CPU
    as it does on CUDA (see the module doc). TRL's fused forward reads the device test from
    ``trl.trainer.utils`` at call time, so swapping that one name is enough; the kernels'
    own Triton-or-torch choice (in ``trl.kernels.chunked_logprob``) is left alone."""
    from trl.trainer import utils as trl_utils  # heavy (TRL, torch): only when training

    triton_test: Callable[[Any], bool] = trl_utils._use_triton

    def compact(device: Any) -> bool:
        return compact_on(device.type, triton_test(device))

    trl_utils._use_triton = compact
    try:
        yield
    finally:
        trl_utils._use_triton = triton_test
