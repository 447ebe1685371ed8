"""What a run measured, summed up, written and said: four jobs, four functions.

1. ``summarize`` (pure): the summary of a run from what its phases measured, with the
   verdict of every phase: the cold start's (base -> cold start) when one ran, RL's or
   the recipe's own (the run's verdict), and the whole run's (base -> after);
2. ``write_run_files``: ``summary.json``, ``report.md`` and ``curves.png`` in the folder;
3. ``finish_adapter``: the adapter folder made servable (tokenizer, model card) and, with
   ``--push-to-hub``, uploaded;
4. ``say_report``: the console's report.

``finish_run`` calls them in that order; ``posttrain.train.recipe.finishing`` calls it
however the run ended.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from posttrain.runs.model_card import complete_adapter_folder, push_adapter
from posttrain.runs.report import write_curves_png, write_report_markdown
from posttrain.score.delta import DeltaReport, noise_band, run_verdict
from posttrain.score.delta_report import delta_phrase
from posttrain.score.episode_stats import episode_stats, format_episode_change
from posttrain.score.format import json_safe
from posttrain.score.passat import category_table
from posttrain.train.context import RecipeContext, TrainOutcome
from posttrain.train.distributed import sharding_not_applied
from posttrain.train.measure import PolicyEvaluation

#: trainer log keys drawn as curves, and their names there
CURVE_NAMES = {
    "reward": "reward",
    "kl": "kl",
    "completions/mean_length": "completion_length",
    "loss": "loss",
    "rewards/margins": "margins",
    "rewards/accuracies": "accuracies",
}
COLD_START_NO_BAND = (
    "no noise band for this phase: the base is evaluated once when a cold start follows "
    "(RL's verdict takes its band from the cold-started policy's evaluations)")


@dataclass
class RunSummary:
    """A run's summary (``summary.json``) and the verdicts it was made from."""

    summary: dict[str, Any]
    report: DeltaReport | None = None  # the run's verdict (RL's, after a cold start)
    phases: list[tuple[str, DeltaReport]] = field(default_factory=list)  # said before it
    whole: DeltaReport | None = None  # base -> after, when a cold start ran first
    baseline: PolicyEvaluation | None = None  # the verdict's "before" side
    curves: dict[str, list[tuple[int, float]]] = field(default_factory=dict)


def history_curves(history: list[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """The trainer's logged values by curve name, as (step, value) points."""
    curves: dict[str, list[tuple[int, float]]] = {}
    for entry in history:
        step = entry.get("step")
        for key, name in CURVE_NAMES.items():
            if step is not None and isinstance(entry.get(key), (int, float)):
                curves.setdefault(name, []).append((int(step), float(entry[key])))
    return curves


def _noise(evaluation: PolicyEvaluation, *, cold_start_follows: bool = False) -> Any:
    """The noise band of a policy's repeated evaluations: None from one evaluation, or,
    for a base evaluated once because a cold start followed, a band that says why."""
    if len(evaluation.runs) > 1:
        return noise_band(evaluation.runs)
    if not cold_start_follows:
        return None
    band = noise_band(evaluation.runs)
    band.note = COLD_START_NO_BAND
    return band


def summarize(summary: dict[str, Any], before: PolicyEvaluation | None,
              after: PolicyEvaluation | None, outcome: TrainOutcome,
              cold_start: PolicyEvaluation | None = None) -> RunSummary:
    """The run's summary from what it measured (pure: nothing written or said).

    ``summary``: what the run knows of itself (name, status, settings' echoes, plan);
    ``cold_start``: the policy after a GRPO run's cold start, evaluated on the same
    holdout. The run's verdict is then RL's own (cold start -> after), and ``phases``
    in the summary holds the cold start's (base -> cold start) and the whole run's."""
    summary = {"alarms": outcome.alarms, "stop_reason": outcome.stop_reason, **summary,
               **outcome.extra}
    result = RunSummary(summary, baseline=before)
    base = before
    if base is not None and cold_start is not None:
        cold = run_verdict(base.rows, cold_start.rows,
                           noise=_noise(base, cold_start_follows=True))
        result.phases.append(("cold start (base -> cold start)", cold))
        summary["phases"] = {"base": base.pass_at().to_dict(),
                             "cold_start": {"after": cold_start.pass_at().to_dict(),
                                            "delta": cold.to_dict(), "verdict": cold.verdict}}
        before = result.baseline = cold_start  # RL's baseline: what the cold start left
    if before is not None:
        noise = _noise(before)
        summary.update(before=before.pass_at().to_dict(),
                       noise=noise.to_dict() if noise else None,
                       by_category_before=[g.to_dict() for g in category_table(before.rows)],
                       episodes_before=episode_stats(before.rows))
        if after is not None:
            # the same call on the same rows as `posttrain eval --compare` of the run's files
            report = result.report = run_verdict(before.rows, after.rows, noise=noise)
            if base is not None and base is not before:
                whole = result.whole = run_verdict(base.rows, after.rows,
                                                   noise=_noise(base, cold_start_follows=True))
                summary["phases"]["whole_run"] = {"delta": whole.to_dict(),
                                                  "verdict": whole.verdict}
                summary["phases"]["rl"] = {"verdict": report.verdict}
            summary.update(after=after.pass_at().to_dict(),
                           by_category_after=[g.to_dict() for g in category_table(after.rows)],
                           delta=report.to_dict(), episodes_after=episode_stats(after.rows),
                           verdict=report.verdict, ok=report.ok)
    result.curves = history_curves(outcome.history)
    summary["curves"] = {name: points[-1][1] for name, points in result.curves.items()
                         if points}
    result.summary = json_safe(summary)
    return result


def write_run_files(context: RecipeContext[Any], result: RunSummary) -> None:
    """``summary.json``, ``report.md`` and (when the trainer logged any) ``curves.png``."""
    folder = context.folder
    folder.write_json("summary.json", result.summary)
    write_report_markdown(folder.file("report.md"), result.summary, result.report)
    if result.curves:
        write_curves_png(folder.file("curves.png"), result.curves,
                         title=context.settings.run_name)


def finish_adapter(context: RecipeContext[Any], summary: dict[str, Any]) -> None:
    """The trained adapter's folder made servable (tokenizer, model card with the
    verdict) and, with ``--push-to-hub`` on a finished run, uploaded; the upload's
    answer goes in ``summary``."""
    folder = context.folder
    complete_adapter_folder(folder.adapter, context.policy.tokenizer, summary,
                            {"recipe": summary.get("recipe"),
                             "settings": context.settings.to_config()})
    repo = getattr(context.settings, "push_to_hub", None)
    if (not repo or not context.ranks.is_main or summary.get("status") != "done"
            or not folder.adapter.is_dir()):
        return
    pushed = summary["push_to_hub"] = push_adapter(folder.adapter, repo)
    context.say(f"pushed the adapter to {pushed['url']}" if "url" in pushed
                else f"! the upload to {repo} failed ({pushed['error']}); the adapter is in "
                     f"{folder.adapter}")


def say_report(context: RecipeContext[Any], result: RunSummary) -> None:
    """The console's report: each phase's verdict, the run's, alarms, timings, files."""
    say, summary, report = context.say, result.summary, result.report
    say("")
    for what, phase_report in result.phases:
        say(f"== {what}")
        say(phase_report.format())
        say("")
    if report is not None:
        if result.phases:
            say("== RL (cold start -> after RL): the run's verdict")
        say(report.format())
        if result.whole is not None:
            say(f"whole run (base -> after RL): {delta_phrase(result.whole)}")
            if report.verdict != "moved" and result.whole.verdict == "moved":
                say(f"! the run's gain is the cold start's: RL itself reads {report.verdict}")
        if summary.get("episodes_before") and summary.get("episodes_after"):
            say(format_episode_change(summary["episodes_before"], summary["episodes_after"]))
    elif (summary.get("plan") or {}).get("plan_only"):
        say(f"plan only: nothing trained; before: {result.baseline.describe()}"
            if result.baseline is not None else "plan only: nothing trained")
    elif result.baseline is not None:
        say(f"no after-evaluation (run {summary['status']}); before: "
            f"{result.baseline.describe()}")
    for alarm in summary["alarms"]:
        say(f"alarm  {alarm.get('kind')} at step {alarm.get('step')}: {alarm.get('message')}")
    parts = ", ".join(f"{k.removesuffix('_s')} {v:.0f}s" for k, v in summary["timings"].items())
    say(f"timings: {parts}")
    say(f"status: {summary['status']}; saved {context.folder.path}/ (summary.json, report.md"
        + (", curves.png" if result.curves else "") + ")")


def finish_run(context: RecipeContext[Any], summary: dict[str, Any],
               before: PolicyEvaluation | None, after: PolicyEvaluation | None,
               outcome: TrainOutcome, timings: dict[str, float],
               cold_start: PolicyEvaluation | None = None) -> dict[str, Any]:
    """Summarize the run, finish its adapter, write its files and say its report;
    returns the summary (``summary.json``)."""
    summary = {**summary,
               "base_model": context.settings.base_model,
               "from_run": context.settings.from_run,
               "learning_rate": context.learning_rate,
               "data": context.data.counts(),
               "alarms": outcome.alarms,
               "stop_reason": outcome.stop_reason,
               "world_size": context.ranks.world,
               "timings": {key: round(value, 2) for key, value in timings.items()}}
    launch_warning = sharding_not_applied(outcome.extra.get("trainer_distributed_type"))
    if launch_warning:
        summary["launch_warning"] = launch_warning
        context.say(f"! {launch_warning}")
    result = summarize(summary, before, after, outcome, cold_start=cold_start)
    if outcome.policy is not None:
        finish_adapter(context, result.summary)
    write_run_files(context, result)
    say_report(context, result)
    return result.summary
