"""The first-step comparison the micro-batch tests use (tests/adam_step.py) passes what one
AdamW step on rounded gradients can give and fails what it cannot."""

from __future__ import annotations

import pytest
import torch

from tests.adam_step import assert_same_first_step

LR = 1e-3
EPS = 1e-8


def _first_step(gradient: torch.Tensor) -> dict[str, torch.Tensor]:
    """An adapter after AdamW's first step from B = 0 (bias-corrected: -lr g / (|g| + eps))."""
    return {"x.lora_A.weight": torch.ones(2, 3),
            "x.lora_B.weight": -LR * gradient / (gradient.abs() + EPS)}


def test_rounded_gradients_pass_even_where_adam_is_ill_conditioned():
    torch.manual_seed(0)
    gradient = torch.randn(64, 64) * 1e-2
    gradient[0, 0] = 3e-9  # a gradient that cancelled to about eps: its step is ill-conditioned
    rounded = gradient * (1 + 1e-6 * torch.randn(64, 64))
    rounded[0, 0] = -2e-9  # the other summation order lands on the other side of zero
    assert_same_first_step(_first_step(gradient), _first_step(rounded))


def test_a_different_step_on_a_well_conditioned_element_fails():
    torch.manual_seed(0)
    gradient = torch.randn(64, 64) * 1e-2
    other = _first_step(gradient)
    other["x.lora_B.weight"][5, 5] *= 0.99  # 1% of lr: no rounding of |g| >> eps does this
    with pytest.raises(AssertionError):
        assert_same_first_step(_first_step(gradient), other)


def test_a_step_that_did_not_train_fails():
    zero = {"x.lora_A.weight": torch.ones(2, 3), "x.lora_B.weight": torch.zeros(4, 4)}
    with pytest.raises(AssertionError, match="did not train"):
        assert_same_first_step(zero, zero)
