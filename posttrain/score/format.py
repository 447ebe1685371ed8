"""Plain-text rendering of rates, intervals and p-values, and the JSON-safe record base.

A delta report's own text and markdown are ``posttrain.score.delta_report``.

Kept apart from the statistics so that the numbers can be tested without string
matching, and the wording can change without touching the math. Rates print with two
decimals, differences with a sign, and a missing interval as ``[n/a]``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any


def format_rate(value: float | None) -> str:
    """0.2875 -> "0.29"; None or NaN -> "n/a"."""
    if value is None or math.isnan(value):
        return "n/a"
    return f"{value:.2f}"


def format_signed(value: float | None) -> str:
    """0.16 -> "+0.16", -0.15 -> "-0.15"; None or NaN -> "n/a"."""
    if value is None or math.isnan(value):
        return "n/a"
    return f"{value:+.2f}"


def format_interval(interval: Sequence[float] | None, *, signed: bool = False) -> str:
    """(0.22, 0.35) -> "[0.22, 0.35]"; signed -> "[+0.09, +0.23]"; None -> "[n/a]"."""
    if interval is None:
        return "[n/a]"
    show = format_signed if signed else format_rate
    return f"[{show(interval[0])}, {show(interval[1])}]"


def format_p_value(p: float | None) -> str:
    """p=0.012; under 0.001 -> "p<0.001"; None -> "p=n/a"."""
    if p is None:
        return "p=n/a"
    return "p<0.001" if p < 0.001 else f"p={p:.3f}"


def sample_shape(n_prompts: int, samples_per_prompt: int | None, n_rows: int) -> str:
    """"163 prompts x 4" when every prompt has 4 samples, else "163 prompts, 650 samples"."""
    prompts = f"{n_prompts} prompt{'s' if n_prompts != 1 else ''}"
    if samples_per_prompt is None:
        return f"{prompts}, {n_rows} samples"
    return f"{prompts} x {samples_per_prompt}"


def json_safe(value: Any, digits: int = 6) -> Any:
    """Copy of ``value`` that ``json.dumps`` accepts: floats rounded, NaN/inf -> None.

    Tuples become lists, mapping keys become strings, objects with ``to_dict`` use it.
    """
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return None if not math.isfinite(value) else round(value, digits)
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, Mapping):
        return {str(key): json_safe(item, digits) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item, digits) for item in value]
    if hasattr(value, "item"):  # numpy scalar
        return json_safe(value.item(), digits)
    raise TypeError(f"json_safe: cannot serialise {type(value).__name__}")


class JsonRecord:
    """Mixin for dataclasses: ``to_dict()`` is ``json_safe`` of the fields."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict of every field: floats rounded to 6 places, NaN -> None."""
        return json_safe(dict(vars(self)))
