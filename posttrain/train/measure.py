"""Measuring a recipe's policies and writing what a person reads at the end.

``evaluate_policy`` samples the holdout with the run's evaluation settings;
``finish_summary`` turns the before/after rows into the paired delta, the guard
check and the category table, writes ``summary.json``, ``report.md`` and
``curves.png``, and prints the report.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from posttrain.policy.model_agent import ModelAgent, default_max_new_tokens
from posttrain.policy.models import Policy
from posttrain.policy.sampler import SamplingParams
from posttrain.policy.vllm_sampler import VllmAgent
from posttrain.runs.model_card import complete_adapter_folder, push_adapter
from posttrain.runs.report import write_curves_png, write_report_markdown
from posttrain.score.delta import noise_band, run_verdict
from posttrain.score.delta_report import delta_phrase
from posttrain.score.episode_stats import episode_stats, format_episode_change
from posttrain.score.evaluate import evaluate
from posttrain.score.format import json_safe
from posttrain.score.passat import PassAt, category_table, pass_at
from posttrain.train.context import RecipeContext, TrainOutcome
from posttrain.train.distributed import gather_in_order, shard, sharding_not_applied


@dataclass
class PolicyEvaluation:
    """One policy's holdout rows per evaluation run; ``rows`` pools every run."""

    runs: list[list[dict[str, Any]]]
    seconds: float

    @property
    def rows(self) -> list[dict[str, Any]]:
        return [row for rows in self.runs for row in rows]

    def pass_at(self, seed: int = 0) -> PassAt:
        return pass_at(self.rows, seed=seed)

    def joined(self, more: PolicyEvaluation) -> PolicyEvaluation:
        """This policy's evaluations followed by ``more`` of its later repeats."""
        return PolicyEvaluation(runs=[*self.runs, *more.runs],
                                seconds=self.seconds + more.seconds)

    def describe(self) -> str:
        line = str(self.pass_at())
        if len(self.runs) > 1:
            rates = [pass_at(rows).pass_at_1 for rows in self.runs]
            line += "; repeats " + ", ".join(f"{rate:.3f}" for rate in rates)
        return line


def evaluation_sampling(settings: Any, policy: Policy) -> SamplingParams:
    """How the holdout is sampled: the run's evaluation temperature and top-p, and the
    reply cap that fits the model. The hack monitor samples the same way."""
    return SamplingParams(
        temperature=settings.eval_temperature,
        top_p=settings.eval_top_p,
        max_new_tokens=default_max_new_tokens(policy),
    )


def evaluation_agent(settings: Any, policy: Policy, params: SamplingParams) -> Any:
    """What samples the holdout: the policy in memory through posttrain's own sampler, or
    with ``--sampler vllm`` a vLLM engine on the base model and the adapter saved on disk
    (the after-evaluation runs once the trainer wrote ``adapter/``)."""
    if getattr(settings, "sampler", "transformers") != "vllm":
        return ModelAgent(policy, params)
    return VllmAgent(settings.base_model or policy.name, policy.adapter, params)


def evaluate_policy(
    context: RecipeContext, policy: Policy, *, repeats: int, label: str,
    first_repeat: int = 0,
) -> PolicyEvaluation:
    """Sample ``eval_samples`` replies per holdout prompt, ``repeats`` times (seeded; the
    evaluation runs from ``first_repeat`` on, see ``posttrain.score.evaluate``).

    Launched as several processes, each samples its share of the prompts and the rows are
    gathered back in the holdout's order on every process (``posttrain.train.distributed``).
    """
    settings = context.settings
    ranks = context.ranks
    holdout = context.data.holdout
    mine = shard(holdout, ranks)
    params = evaluation_sampling(settings, policy)
    was_training = policy.model.training
    policy.model.eval()
    agent = None
    try:
        agent = evaluation_agent(settings, policy, params)
        evaluation = evaluate(
            context.env,
            mine,
            agent,
            samples=settings.eval_samples,
            seed=settings.eval_seed,
            repeats=repeats,
            first_repeat=first_repeat,
            label=label,
            show_progress=ranks.is_main,
        )
    finally:
        if was_training:
            policy.model.train()
        if hasattr(agent, "close"):  # a vLLM engine gives its GPU memory back
            agent.close()
    samples = settings.eval_samples
    runs = [
        # rows come in prompt order, `samples` per prompt: one group per prompt of my share
        gather_in_order([rows[i * samples:(i + 1) * samples] for i in range(len(mine))],
                        len(holdout), ranks)
        for rows in evaluation.runs
    ]
    return PolicyEvaluation(runs=runs, seconds=evaluation.seconds)


def _noise(evaluation: PolicyEvaluation) -> Any:
    """The noise band of a policy's repeated evaluations (None from one evaluation)."""
    return noise_band(evaluation.runs) if len(evaluation.runs) > 1 else None


def _base_noise(base: PolicyEvaluation) -> Any:
    """The base policy's noise band for the phases measured from it when a cold start ran:
    by design the base is then evaluated once, and the band says why it has none."""
    if len(base.runs) > 1:
        return _noise(base)
    band = noise_band(base.runs)
    band.note = ("no noise band for this phase: the base is evaluated once when a cold start "
                 "follows (RL's verdict takes its band from the cold-started policy's "
                 "evaluations)")
    return band


def _history_curves(history: list[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    curves: dict[str, list[tuple[int, float]]] = {}
    names = {
        "reward": "reward",
        "kl": "kl",
        "completions/mean_length": "completion_length",
        "loss": "loss",
        "rewards/margins": "margins",
        "rewards/accuracies": "accuracies",
    }
    for entry in history:
        step = entry.get("step")
        for key, name in names.items():
            if step is not None and isinstance(entry.get(key), (int, float)):
                curves.setdefault(name, []).append((int(step), float(entry[key])))
    return curves


def finish_summary(
    context: RecipeContext | None,
    summary: dict[str, Any],
    before: PolicyEvaluation | None,
    after: PolicyEvaluation | None,
    outcome: TrainOutcome,
    timings: dict[str, float],
    cold_start: PolicyEvaluation | None = None,
) -> dict[str, Any]:
    """Complete the summary, write the run folder's report files, print the report.

    ``cold_start``: the policy after a GRPO run's supervised cold start (its first phase),
    evaluated on the same holdout. The run's verdict is then RL's own (cold start -> after
    RL), and the summary's ``phases`` holds the cold start's (base -> cold start) and the
    whole run's (base -> after)."""
    if context is None:
        return summary
    say = context.say
    summary.update(
        {
            "base_model": context.settings.base_model,
            "from_run": context.settings.from_run,
            "learning_rate": context.learning_rate,
            "data": context.data.counts(),
            "alarms": outcome.alarms,
            "stop_reason": outcome.stop_reason,
            "world_size": context.ranks.world,
            "timings": {key: round(value, 2) for key, value in timings.items()},
            **outcome.extra,
        }
    )
    launch_warning = sharding_not_applied(summary.get("trainer_distributed_type"))
    if launch_warning:
        summary["launch_warning"] = launch_warning
        say(f"! {launch_warning}")
    report = None
    phases: list[tuple[str, Any]] = []  # (what, its report) said before RL's own
    whole = None  # base -> after, when a cold start ran first
    base = before
    if base is not None and cold_start is not None:
        cold_report = run_verdict(base.rows, cold_start.rows, noise=_base_noise(base))
        phases.append(("cold start (base -> cold start)", cold_report))
        summary["phases"] = {"base": base.pass_at().to_dict(),
                             "cold_start": {"after": cold_start.pass_at().to_dict(),
                                            "delta": cold_report.to_dict(),
                                            "verdict": cold_report.verdict}}
        before = cold_start  # RL's baseline: what the cold start left
    if before is not None:
        noise = _noise(before)
        summary["before"] = before.pass_at().to_dict()
        summary["noise"] = noise.to_dict() if noise else None
        summary["by_category_before"] = [g.to_dict() for g in category_table(before.rows)]
        summary["episodes_before"] = episode_stats(before.rows)
        if after is not None:
            # the same call on the same rows as `posttrain eval --compare` of the run's files
            report = run_verdict(before.rows, after.rows, noise=noise)
            if base is not before and base is not None:
                whole = run_verdict(base.rows, after.rows, noise=_base_noise(base))
                summary["phases"]["whole_run"] = {"delta": whole.to_dict(),
                                                  "verdict": whole.verdict}
                summary["phases"]["rl"] = {"verdict": report.verdict}
            summary["after"] = after.pass_at().to_dict()
            summary["by_category_after"] = [g.to_dict() for g in category_table(after.rows)]
            summary["delta"] = report.to_dict()
            summary["episodes_after"] = episode_stats(after.rows)
            summary["verdict"] = report.verdict
            summary["ok"] = report.ok
    curves = _history_curves(outcome.history)
    summary["curves"] = {name: points[-1][1] for name, points in curves.items() if points}
    summary = json_safe(summary)
    folder = context.folder
    if outcome.policy is not None:
        complete_adapter_folder(folder.adapter, context.policy.tokenizer, summary,
                                {"recipe": summary.get("recipe"),
                                 "settings": context.settings.to_config()})
        repo = getattr(context.settings, "push_to_hub", None)
        if (repo and context.ranks.is_main and summary.get("status") == "done"
                and folder.adapter.is_dir()):
            summary["push_to_hub"] = push_adapter(folder.adapter, repo)
            pushed = summary["push_to_hub"]
            say(f"pushed the adapter to {pushed['url']}" if "url" in pushed
                else f"! the upload to {repo} failed ({pushed['error']}); the adapter is in "
                     f"{folder.adapter}")
    folder.write_json("summary.json", summary)
    write_report_markdown(folder.file("report.md"), summary, report)
    if curves:
        write_curves_png(folder.file("curves.png"), curves, title=context.settings.run_name)
    say("")
    for what, phase_report in phases:
        say(f"== {what}")
        say(phase_report.format())
        say("")
    if report is not None:
        if phases:
            say("== RL (cold start -> after RL): the run's verdict")
        say(report.format())
        if whole is not None:
            say(f"whole run (base -> after RL): {delta_phrase(whole)}")
            if report.verdict != "moved" and whole.verdict == "moved":
                say(f"! the run's gain is the cold start's: RL itself reads {report.verdict}")
        if summary.get("episodes_before") and summary.get("episodes_after"):
            say(format_episode_change(summary["episodes_before"], summary["episodes_after"]))
    elif before is not None:
        say(f"no after-evaluation (run {summary['status']}); before: {before.describe()}")
    for alarm in outcome.alarms:
        say(f"alarm  {alarm.get('kind')} at step {alarm.get('step')}: {alarm.get('message')}")
    parts = ", ".join(f"{k.removesuffix('_s')} {v:.0f}s" for k, v in summary["timings"].items())
    say(f"timings: {parts}")
    say(
        f"status: {summary['status']}; saved {folder.path}/ (summary.json, report.md"
        + (", curves.png" if curves else "")
        + ")"
    )
    return summary
