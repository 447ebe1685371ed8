"""A run's human-readable outputs: ``report.md`` and ``curves.png``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from posttrain.atomic import atomic_writer, write_text_atomic
from posttrain.score.episode_stats import format_episode_change
from posttrain.terminal import printable


def _signal_lines(summary: dict[str, Any]) -> list[str]:
    """How much of the training data could teach anything: GRPO's groups with a reward
    spread, DPO's prompts with a better and a worse reply."""
    signal = summary.get("signal")
    if signal:
        spread = signal.get("reward_spread")
        return ["## Learning signal", "",
                f"- groups with all-equal rewards (no advantage): "
                f"{signal['dead_group_share']:.0%} on average over {signal['steps']} steps",
                *([f"- mean within-group reward spread: {spread:.3f}"]
                  if spread is not None else []), ""]
    pairs = summary.get("pair_report") or {}
    if pairs.get("prompts_seen"):
        seen, contrast = pairs["prompts_seen"], pairs.get("prompts_with_contrast") or 0
        return ["## Learning signal", "",
                f"- prompts with contrast (a better and a worse reply): {contrast} of {seen} "
                f"({contrast / seen:.0%}); the others gave no pair", ""]
    return []


def _category_lines(title: str, groups: list[dict[str, Any]] | None) -> list[str]:
    if not groups:
        return []
    lines = [
        f"### {title}",
        "",
        "| category | scenarios | prompts | pass@1 | 95% | tool-call rate |",
        "|---|---|---|---|---|---|",
    ]
    for group in groups:
        interval = group.get("ci95")
        shown = f"[{interval[0]:.2f}, {interval[1]:.2f}]" if interval else "n/a"
        rate = group.get("tool_call_rate")
        lines.append(
            f"| {group['name']} | {group['n_scenarios']} | {group['n_prompts']} | "
            f"{group['pass_at_1']:.2f} | {shown} | {'n/a' if rate is None else f'{rate:.2f}'} |"
        )
    return [*lines, ""]


def _cold_start_lines(summary: dict[str, Any]) -> list[str]:
    """A GRPO run's cold start: why it ran (or not), and each phase's own delta."""
    choice = summary.get("cold_start")
    if not choice:
        return []
    lines = ["## Cold start", "", f"{'Ran' if choice.get('run') else 'None'}: "
             f"{choice.get('reason')}.", ""]
    phases = summary.get("phases") or {}
    for key, words in (("cold_start", "Cold start (base -> cold start)"),
                       ("whole_run", "Whole run (base -> after RL)")):
        phase = phases.get(key)
        if phase:
            delta = phase["delta"]
            interval = delta.get("ci95")
            shown = f" [{interval[0]:+.2f}, {interval[1]:+.2f}]" if interval else ""
            value = delta.get("delta")
            number = f"{value:+.2f}" if isinstance(value, (int, float)) else "no delta"
            lines.append(f"- {words}: {number}{shown} -> **{phase['verdict']}**")
    if phases.get("rl"):
        lines += [f"- RL (cold start -> after RL), the run's verdict: "
                  f"**{phases['rl']['verdict']}** (below)"]
    return [*lines, ""] if phases else lines


def write_report_markdown(path: Path, summary: dict[str, Any], report: Any | None) -> Path:
    """The run's report: verdict, before/after with intervals, categories, alarms, timings."""
    status = summary.get("status")
    lines = [f"# {summary.get('recipe', 'run').upper()} run `{summary.get('run_name')}`", ""]
    lines.append(
        f"Status **{status}**; base model `{summary.get('base_model')}`"
        + (f" from run `{summary['from_run']}`" if summary.get("from_run") else "")
        + f"; learning rate {summary.get('learning_rate')}."
    )
    lines.append("")
    lines += _cold_start_lines(summary)
    if report is not None:
        heading = ("## RL: the cold-started policy and after RL on the holdout"
                   if summary.get("phases") else "## Before and after on the holdout")
        lines += [heading, "", report.format_markdown()]
    elif summary.get("before"):
        lines += ["## Before (no after-evaluation: the run did not finish training)", ""]
        before = summary["before"]
        lines += [f"pass@1 {before.get('pass_at_1')} (interval {before.get('ci95')})", ""]
    if summary.get("episodes_before") and summary.get("episodes_after"):
        lines += ["## Episodes", "",
                  format_episode_change(summary["episodes_before"], summary["episodes_after"]),
                  ""]
    lines += _category_lines("By category, before", summary.get("by_category_before"))
    lines += _category_lines("By category, after", summary.get("by_category_after"))
    if summary.get("pair_report"):
        lines += ["## Preference pairs", ""]
        lines += [f"- {key}: {value}" for key, value in summary["pair_report"].items()]
        lines.append("")
    if summary.get("demo_report"):
        demos = summary["demo_report"]
        lines += ["## Demonstrations", "",
                  f"- source: {demos['source']}",
                  f"- kept: {demos['kept']} of {demos['read']} ({demos['prompts']} distinct "
                  "prompts)",
                  f"- dropped: {demos['failed_rule']} failing the rule, {demos['duplicates']} "
                  f"duplicates, {demos['holdout_leaks']} on holdout prompts", ""]
    lines += _signal_lines(summary)
    lines += ["## Alarms", ""]
    alarms = summary.get("alarms") or []
    lines += [f"- step {a.get('step')}: **{a.get('kind')}**: {a.get('message')}" for a in alarms]
    lines += ["- none"] if not alarms else []
    lines += ["", "## Timings", ""]
    lines += [f"- {key}: {value}" for key, value in (summary.get("timings") or {}).items()]
    if summary.get("error"):
        lines += ["", "## Error", "", f"`{summary['error']}`"]
    # a file a user cats or pages: the environment's text in it is data (posttrain.terminal)
    return write_text_atomic(path, printable("\n".join(lines)) + "\n")


def write_curves_png(
    path: Path, curves: dict[str, list[tuple[int, float]]], *, title: str = ""
) -> Path:
    """One small panel per curve (reward, KL, completion length, ...) against the step."""
    import matplotlib

    matplotlib.use("Agg")  # no display here or in CI
    import matplotlib.pyplot as plt

    names = list(curves)
    columns = min(3, len(names))
    rows = (len(names) + columns - 1) // columns
    figure, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.0 * rows), squeeze=False)
    for axis, name in zip(axes.flat, names, strict=False):
        steps = [point[0] for point in curves[name]]
        values = [point[1] for point in curves[name]]
        axis.plot(steps, values, linewidth=1.2, color="#3366aa")
        axis.set_title(name.replace("_", " "))
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
    for axis in list(axes.flat)[len(names) :]:
        axis.set_visible(False)
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    try:
        with atomic_writer(path, "wb") as handle:
            figure.savefig(handle, format="png", dpi=110)
    finally:
        plt.close(figure)
    return path
