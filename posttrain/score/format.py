"""Plain-text and markdown rendering of rates, intervals and delta reports.

Kept apart from the statistics so that the numbers can be tested without string
matching, and the wording can change without touching the math. Rates print with two
decimals, differences with a sign, and a missing interval as ``[n/a]``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from posttrain.score.delta import DeltaReport, GroupDelta
    from posttrain.score.passat import GroupStats


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


# --- delta report ---------------------------------------------------------------------


def _noise_phrase(report: DeltaReport) -> str:
    if report.noise_band_used is not None and report.noise is not None:
        return (f"noise band ±{report.noise_band_used:.2f} from "
                f"{report.noise.n_repeats} base evaluations")
    if report.noise is not None and report.noise.note:
        return report.noise.note
    return "no noise band: 1 evaluation"


def _delta_phrase(report: DeltaReport, *, markdown: bool = False) -> str:
    verdict = f"**{report.verdict}**" if markdown else report.verdict
    arrow = "→" if markdown else "->"
    shown = format_signed(report.delta)
    if markdown:
        shown = f"**{shown}**"
    return (f"{shown} {format_interval(report.ci95, signed=True)} paired over "
            f"{report.n_paired} scenarios, {format_p_value(report.p_value)}  {arrow} {verdict} "
            f"({_noise_phrase(report)})")


def _guard_status(guard: Any) -> str:
    if guard.degenerate:
        return "degenerate: constant on both sides"
    return "FELL" if guard.fell else "held"


def _group_flags(group: GroupDelta) -> str:
    flags = []
    if group.down:
        flags.append("DOWN")
    if group.low_n:
        flags.append("low n")
    if group.verdict == "flat (within noise)":
        flags.append("within noise")
    return ", ".join(flags)


def _rate_pair(before: float | None, after: float | None) -> str:
    return f"{format_rate(before)} -> {format_rate(after)}"


def format_delta_text(report: DeltaReport) -> str:
    """Readable plain-text delta report: sides, delta and verdict, guards, groups, warnings."""
    label = report.before.label
    lines = [
        f"{label} before {report.before.describe()}",
        f"{label} after  {report.after.describe()}",
        f"delta  {_delta_phrase(report)}",
    ]
    for guard in report.guards:
        if guard.degenerate:
            lines.append(f"guard  {guard.name} {_rate_pair(guard.before, guard.after)} "
                         f"({_guard_status(guard)})")
        else:
            lines.append(f"guard  {guard.name} {_rate_pair(guard.before, guard.after)}  "
                         f"{format_signed(guard.delta)} "
                         f"{format_interval(guard.ci95, signed=True)}  {_guard_status(guard)}")
    if report.groups:
        head = f"by {report.by}"
        width = max(14, len(head) + 2, *(len(g.name) + 2 for g in report.groups))
        lines.append(f"{head:<{width}}{'n':>3}  {label + ' before -> after':<25}"
                     f"{'delta [95%]':<23}{'tool-call rate':<17}flag")
        for group in report.groups:
            shift = f"{format_signed(group.delta)} {format_interval(group.ci95, signed=True)}"
            row = (f"{group.name:<{width}}{group.n_paired:>3}  "
                   f"{_rate_pair(group.before, group.after):<25}{shift:<23}"
                   f"{_rate_pair(group.tool_call_before, group.tool_call_after):<17}"
                   f"{_group_flags(group)}")
            lines.append(row.rstrip())
    lines.extend(f"! {warning}" for warning in report.warnings)
    return "\n".join(lines)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines.extend("| " + " | ".join(cells) + " |" for cells in rows)
    return lines


def format_delta_markdown(report: DeltaReport) -> str:
    """The same content as ``format_delta_text`` as markdown tables (for report.md)."""
    label = report.before.label
    sides = []
    for name, side in (("before", report.before), ("after", report.after)):
        shape = sample_shape(side.n_prompts, side.samples_per_prompt, side.n_rows)
        sides.append((name, format_rate(side.pass_at_1), format_interval(side.ci95),
                      f"{side.n_scenarios} scenarios, {shape}"))
    lines = _table(("", label, "95% interval", "n"), sides)
    lines += ["", f"delta {_delta_phrase(report, markdown=True)}"]
    if report.guards:
        rows = [(g.name, format_rate(g.before), format_rate(g.after), format_signed(g.delta),
                 format_interval(g.ci95, signed=True), _guard_status(g)) for g in report.guards]
        lines += ["", *_table(("guard", "before", "after", "delta", "95%", "status"), rows)]
    if report.groups:
        rows = [(g.name, str(g.n_paired), format_rate(g.before), format_rate(g.after),
                 format_signed(g.delta), format_interval(g.ci95, signed=True),
                 _rate_pair(g.tool_call_before, g.tool_call_after), _group_flags(g))
                for g in report.groups]
        header = (report.by, "n", f"{label} before", f"{label} after", "delta", "95%",
                  "tool-call rate", "flag")
        lines += ["", *_table(header, rows)]
    if report.warnings:
        lines += ["", *(f"- {warning}" for warning in report.warnings)]
    return "\n".join(lines) + "\n"


def format_group_table(table: Sequence[GroupStats], *, by: str = "category") -> str:
    """Single-run table by group: scenarios, prompts, pass@1 with interval, tool-call rate."""
    width = max(14, len(by) + 5, *(len(group.name) + 2 for group in table))
    lines = [
        f"{'by ' + by:<{width}}{'scenarios':>10}{'prompts':>9}  {'pass@1 [95%]':<21}tool-call rate"
    ]
    for group in table:
        rate = f"{format_rate(group.pass_at_1)} {format_interval(group.ci95)}"
        lines.append(
            f"{group.name:<{width}}{group.n_scenarios:>10}{group.n_prompts:>9}  {rate:<21}"
            f"{format_rate(group.tool_call_rate)}"
        )
    return "\n".join(lines)
