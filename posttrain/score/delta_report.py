"""What a paired delta measured (``DeltaReport``, its guards and groups) and how it reads:
plain text for the console, markdown for report.md.

The computation is ``posttrain.score.delta``; this module only holds and renders its
result, so the recipes' report, ``eval --compare`` and the dashboard print one text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from posttrain.score.format import (
    JsonRecord,
    format_interval,
    format_p_value,
    format_rate,
    format_signed,
    sample_shape,
)
from posttrain.score.noise import NoiseBand
from posttrain.score.passat import PassAt


@dataclass
class GuardStats(JsonRecord):
    """A guard marker (e.g. well_formed) compared the same paired way as the target."""

    name: str
    before: float
    after: float
    delta: float | None
    ci95: tuple[float, float] | None
    p_value: float | None
    n_paired: int
    fell: bool
    degenerate: bool


@dataclass
class GroupDelta(JsonRecord):
    """The target's paired delta within one group (e.g. one category)."""

    name: str
    before: float
    after: float
    delta: float | None
    ci95: tuple[float, float] | None
    n_paired: int
    n_rows_before: int
    n_rows_after: int
    verdict: str
    down: bool
    low_n: bool
    tool_call_before: float | None
    tool_call_after: float | None
    noise_band: float | None


@dataclass
class DeltaReport(JsonRecord):
    """Everything ``delta`` measured; ``format()`` and ``format_markdown()`` render it."""

    ok: bool
    verdict: str
    target: str
    before: PassAt
    after: PassAt
    delta: float | None
    ci95: tuple[float, float] | None
    p_value: float | None
    se_paired: float | None
    n_paired: int
    n_unpaired_before: int
    n_unpaired_after: int
    noise: NoiseBand | None
    guards: list[GuardStats]
    regressions: list[str]
    degenerate_guards: list[str]
    groups: list[GroupDelta]
    groups_down: list[str]
    warnings: list[str]
    #: paired t interval (reference; the verdict uses the bootstrap interval)
    ci95_t: tuple[float, float] | None = None
    #: the band the verdict applied (computed over the paired scenarios), or None
    noise_band_used: float | None = None
    comparable: bool = True
    #: smallest gain this comparison detects with 80% power, from the observed paired sd
    detectable_effect: float | None = None
    alpha: float = 0.05
    by: str | None = None

    def format(self) -> str:
        """Readable plain text (``format_delta_text`` below)."""
        return format_delta_text(self)

    def format_markdown(self) -> str:
        """Markdown tables with the same content, for report.md."""
        return format_delta_markdown(self)

    def __str__(self) -> str:
        return self.format()


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


def delta_phrase(report: DeltaReport) -> str:
    """The delta, its interval and the verdict in one phrase (the report's delta line)."""
    return _delta_phrase(report)


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
