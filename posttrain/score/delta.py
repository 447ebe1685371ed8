"""Before/after comparison of graded rows: a paired delta, a verdict, guards and groups.

Paired by scenario: for each scenario evaluated on both sides, its mean after minus its
mean before; the report gives the mean difference, a seeded paired-bootstrap percentile
interval, a sign-flip p-value and, for reference, the paired t interval and SE. Scenarios
on one side only are counted and left out; under half paired means NOT COMPARABLE.

Verdicts: ``moved`` (interval above 0 and |delta| outside the noise band), ``flat``
(interval covers 0), ``flat (within noise)`` (interval above 0, |delta| inside the
band), ``DOWN`` (interval below 0; the band is not applied, on purpose: a false alarm
costs a look, a missed regression costs a shipped one), plus ``insufficient data``
(under 3 paired scenarios, no interval) and ``NOT COMPARABLE``. ``ok`` is False when
the sides are not comparable, the target went DOWN or a guard fell; a group going DOWN
is a warning only.

The noise band is computed in ``posttrain.score.noise`` (see its docstring for why it
departs from the reference SDK).

Random streams: the target uses ``seed``, guard i ``seed + 1 + i``, group i
``seed + 100 + i``, so adding a guard never changes the target's interval.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import partial

from posttrain.score import stats
from posttrain.score.delta_report import DeltaReport, GroupDelta, GuardStats
from posttrain.score.guards import (
    NEGATED,
    SCOPED,
    choose_guards,
    guard_marker,
    guard_rows,
    guard_value,
)
from posttrain.score.noise import ONE_EVALUATION, NoiseBand, noise_band, split_by_eval_run
from posttrain.score.passat import (
    GroupStats,
    Row,
    ValueSpec,
    category_table,
    group_rows,
    has_marker,
    mean_rate,
    pass_at,
    scenario_key,
    scenario_means,
    tool_call_rate,
)

# category_table and GroupStats live with the single-run statistics; re-exported here.
__all__ = ["RUN_GUARDS", "DeltaReport", "GroupDelta", "GroupStats", "GuardStats", "NoiseBand",
           "PairedDifference", "category_table", "delta", "min_group_scenarios", "noise_band",
           "paired_difference", "run_verdict", "split_by_eval_run"]


def min_group_scenarios(alpha: float = 0.05) -> int:
    """Fewest paired scenarios a group needs before it can show a significant change.

    With n scenarios the smallest two-sided sign-flip p-value is 2 / 2^n, so below
    ceil(log2(2 / alpha)) (= 6 at alpha 0.05) no result can be significant.
    """
    return math.ceil(math.log2(2.0 / alpha))


# --- paired difference -----------------------------------------------------------------


@dataclass
class PairedDifference:
    """Per-scenario paired comparison of two sets of scenario means."""

    delta: float | None
    ci95: tuple[float, float] | None
    ci95_t: tuple[float, float] | None
    p_value: float | None
    se_paired: float | None
    shared: list[str]
    only_before: int
    only_after: int


def paired_difference(before: dict[str, float], after: dict[str, float], *, n_boot: int = 2000,
                      seed: int = 0, alpha: float = 0.05) -> PairedDifference:
    """Compare per-scenario means (scenario -> mean) over the scenarios both sides have.

    Bootstrap interval at level 1 - alpha (None under 3 paired scenarios), sign-flip
    p-value with ``n_boot`` flips, paired t interval and SE; all None with none paired.
    """
    shared = [key for key in before if key in after]
    differences = [after[key] - before[key] for key in shared]
    only_before, only_after = len(before) - len(shared), len(after) - len(shared)
    if not differences:
        return PairedDifference(None, None, None, None, None, shared, only_before, only_after)
    level = 1.0 - alpha
    ci = None
    if len(differences) >= 3:
        ci = stats.bootstrap_interval(differences, n_boot=n_boot, seed=seed, level=level)
    se = stats.standard_error(differences)
    return PairedDifference(
        delta=stats.mean(differences), ci95=ci, ci95_t=stats.t_interval(differences, level),
        p_value=stats.sign_flip_p_value(differences, n_perm=n_boot, seed=seed),
        se_paired=None if math.isnan(se) else se, shared=shared,
        only_before=only_before, only_after=only_after,
    )


def _verdict(paired: PairedDifference, band: float | None) -> str:
    if paired.delta is None:
        return "NOT COMPARABLE"
    if paired.ci95 is None:
        return "insufficient data"
    low, high = paired.ci95
    if low > 0:
        return "flat (within noise)" if band is not None and abs(paired.delta) <= band else "moved"
    if high < 0:
        return "DOWN"
    return "flat"


def _target_value(target: str) -> ValueSpec:
    if target in ("pass_at_1", "pass@1", "reward"):
        return "reward"
    return target


def _resolve_noise(noise: NoiseBand | Sequence[Sequence[Row]] | None, before: Sequence[Row],
                   value: ValueSpec) -> NoiseBand | None:
    if isinstance(noise, NoiseBand):
        return noise
    if noise is not None:
        return noise_band(noise, value=value)
    runs = split_by_eval_run(before)
    return noise_band(runs, value=value) if len(runs) >= 2 else None


def _compare_guard(name: str, before: Sequence[Row], after: Sequence[Row], *, n_boot: int,
                   seed: int, alpha: float) -> GuardStats:
    # ``not:<marker>`` guards the marker's absence, ``<guard>@<category>`` reads one
    # category's rows (posttrain.score.guards)
    before, after = guard_rows(name, before), guard_rows(name, after)
    value: ValueSpec = (f"marker:{name}" if not name.startswith(NEGATED) and SCOPED not in name
                        else partial(guard_value, name))
    means_before, means_after = scenario_means(before, value), scenario_means(after, value)
    paired = paired_difference(means_before, means_after, n_boot=n_boot, seed=seed, alpha=alpha)
    observed = {guard_value(name, row) for row in [*before, *after]}
    return GuardStats(
        name=name, before=stats.mean(list(means_before.values())),
        after=stats.mean(list(means_after.values())), delta=paired.delta, ci95=paired.ci95,
        p_value=paired.p_value, n_paired=len(paired.shared),
        fell=paired.ci95 is not None and paired.ci95[1] < 0, degenerate=len(observed) == 1,
    )


def _compare_groups(before: Sequence[Row], after: Sequence[Row], by: str, value: ValueSpec,
                    noise: NoiseBand | None, *, n_boot: int, seed: int, alpha: float,
                    pooled: dict[str, int]) -> list[GroupDelta]:
    groups_before, groups_after = group_rows(before, by), group_rows(after, by)
    names = [name for name in groups_before if name in groups_after]
    result = []
    for index, name in enumerate(names):
        rows_before, rows_after = groups_before[name], groups_after[name]
        paired = paired_difference(scenario_means(rows_before, value),
                                   scenario_means(rows_after, value),
                                   n_boot=n_boot, seed=seed + 100 + index, alpha=alpha)
        band = noise.band_for(paired.shared, **pooled) if noise is not None else None
        result.append(GroupDelta(
            name=name, before=mean_rate(rows_before, value), after=mean_rate(rows_after, value),
            delta=paired.delta, ci95=paired.ci95, n_paired=len(paired.shared),
            n_rows_before=len(rows_before), n_rows_after=len(rows_after),
            verdict=_verdict(paired, band), down=paired.ci95 is not None and paired.ci95[1] < 0,
            low_n=len(paired.shared) < min_group_scenarios(alpha),
            tool_call_before=tool_call_rate(rows_before),
            tool_call_after=tool_call_rate(rows_after), noise_band=band,
        ))
    return result


def _applied_band(noise: NoiseBand | None, shared: list[str], warnings: list[str], *,
                  before_evaluations: int, after_evaluations: int) -> float | None:
    """The band for this comparison's paired scenarios and pooled evaluations; notes what
    is missing or odd."""
    if noise is None or noise.band is None:
        said = noise.note if noise is not None else ""
        warnings.append(said if said and said != ONE_EVALUATION else
                        f"{ONE_EVALUATION} (re-evaluate the base policy with 2 or more "
                        "sampling seeds to measure one)")
        return None
    if noise.max_repeat_delta > noise.band:
        warnings.append(f"two evaluations of the base policy differ by "
                        f"{noise.max_repeat_delta:.2f}, more than the noise band "
                        f"±{noise.band:.2f}; check that they differ only in the sampling seed")
    pooled = {"before_evaluations": before_evaluations, "after_evaluations": after_evaluations}
    band = noise.band_for(shared, **pooled)
    if band is None:
        warnings.append("the noise repeats share too few scenarios with this comparison; "
                        "using their overall band")
        return noise.band_for(**pooled)
    return band


def _check_guards(guards: Sequence[str], before: list[Row], after: list[Row],
                  warnings: list[str], *, n_boot: int, seed: int,
                  alpha: float) -> list[GuardStats]:
    """Compare every guard marker present on all rows; guard i uses seed + 1 + i."""
    result = []
    for index, name in enumerate(guards):
        name = name.removeprefix("marker:")
        marker = guard_marker(name)
        if not (has_marker(before, marker) and has_marker(after, marker)):
            warnings.append(f"guard {name!r} is not on every row of both sides; not checked")
            continue
        result.append(_compare_guard(name, before, after, n_boot=n_boot,
                                     seed=seed + 1 + index, alpha=alpha))
    return result


def _evaluations(rows: Sequence[Row]) -> int:
    """How many evaluation runs (``eval_run`` values) the rows pool."""
    return len({row.get("eval_run", 0) for row in rows})


def _samples_per_evaluation(rows: Sequence[Row]) -> int | None:
    """Samples per prompt within one evaluation run (None when uneven)."""
    counts = Counter((row.get("eval_run", 0), scenario_key(row), str(row.get("prompt", "")))
                     for row in rows)
    sizes = set(counts.values())
    return sizes.pop() if len(sizes) == 1 else None


def delta(before: Iterable[Row], after: Iterable[Row], *, target: str = "pass_at_1",
          guards: Sequence[str] = ("well_formed",), by: str | None = None,
          noise: NoiseBand | Sequence[Sequence[Row]] | None = None, seed: int = 0,
          n_boot: int = 2000, alpha: float = 0.05) -> DeltaReport:
    """Paired before/after comparison of graded rows with a verdict (module docstring).

    ``target``: "pass_at_1" (the reward) or "marker:<name>". ``guards``: marker names
    that must not fall. ``by``: a row key (e.g. "category") for the group table.
    ``noise``: a NoiseBand, or one list of base-policy rows per re-evaluation; when None
    and ``before`` rows carry 2+ ``eval_run`` values, those repeats give the band.
    Raises ValueError when either side has no rows.
    """
    before, after = list(before), list(after)
    if not before or not after:
        side = "before" if not before else "after"
        raise ValueError(f"delta: no {side} rows; evaluate both policies on the same prompts")
    value = _target_value(target)
    before_stats = pass_at(before, seed=seed, n_boot=n_boot, value=value)
    after_stats = pass_at(after, seed=seed, n_boot=n_boot, value=value)
    noise_stats = _resolve_noise(noise, before, value)
    paired = paired_difference(before_stats.per_scenario, after_stats.per_scenario,
                               n_boot=n_boot, seed=seed, alpha=alpha)
    n_paired = len(paired.shared)
    n_union = n_paired + paired.only_before + paired.only_after
    comparable = n_paired > 0 and 2 * n_paired >= n_union
    warnings: list[str] = []

    pooled = {"before_evaluations": _evaluations(before), "after_evaluations": _evaluations(after)}
    band = _applied_band(noise_stats, paired.shared, warnings, **pooled)
    verdict = _verdict(paired, band) if comparable else "NOT COMPARABLE"
    if not comparable:
        warnings.append(f"NOT COMPARABLE: only {n_paired} of {n_union} scenarios were "
                        f"evaluated on both sides (need at least half)")
    elif paired.only_before or paired.only_after:
        warnings.append(f"{paired.only_before} scenario(s) only before and "
                        f"{paired.only_after} only after were left out of the paired delta")
    if 0 < n_paired < 3:
        warnings.append(f"no interval: {n_paired} paired scenario(s), a bootstrap needs 3")
    per_run_before, per_run_after = _samples_per_evaluation(before), _samples_per_evaluation(after)
    if per_run_before != per_run_after:
        warnings.append(f"samples per prompt and evaluation differ (before {per_run_before}, "
                        f"after {per_run_after}); the noise band assumes they match")

    guard_stats = _check_guards(guards, before, after, warnings, n_boot=n_boot, seed=seed,
                                alpha=alpha)
    regressions = [g.name for g in guard_stats if g.fell]
    degenerate = [g.name for g in guard_stats if g.degenerate]
    warnings.extend(f"guard {name} fell" for name in regressions)
    warnings.extend(f"guard {name} is constant on both sides: it did not fall, and it shows "
                    f"nothing else here" for name in degenerate)

    groups = []
    if by is not None:
        groups = _compare_groups(before, after, by, value, noise_stats, n_boot=n_boot,
                                 seed=seed, alpha=alpha, pooled=pooled)
    groups_down = [g.name for g in groups if g.down]
    warnings.extend(f"{by} {g.name} went DOWN: {g.delta:+.2f} "
                    f"[{g.ci95[0]:+.2f}, {g.ci95[1]:+.2f}]" for g in groups if g.down)
    low_n = [g.name for g in groups if g.low_n]
    if low_n:
        warnings.append(f"fewer than {min_group_scenarios(alpha)} paired scenarios (cannot show "
                        f"a significant change): {', '.join(low_n)}")

    detectable = None
    if paired.se_paired is not None and paired.se_paired > 0:
        sd = paired.se_paired * math.sqrt(n_paired)
        detectable = stats.detectable_effect(n_paired, sd, alpha=alpha)
        if verdict.startswith("flat"):
            warnings.append(f"with {n_paired} paired scenarios (sd of differences {sd:.2f}) "
                            f"a gain of about {detectable:+.2f} is found 80% of the time; "
                            f"smaller true gains often read flat")

    return DeltaReport(
        ok=comparable and verdict != "DOWN" and not regressions, verdict=verdict,
        target=target, before=before_stats, after=after_stats, delta=paired.delta,
        ci95=paired.ci95, p_value=paired.p_value, se_paired=paired.se_paired,
        n_paired=n_paired, n_unpaired_before=paired.only_before,
        n_unpaired_after=paired.only_after, noise=noise_stats, guards=guard_stats,
        regressions=regressions, degenerate_guards=degenerate, groups=groups,
        groups_down=groups_down, warnings=warnings, ci95_t=paired.ci95_t,
        noise_band_used=band, comparable=comparable, detectable_effect=detectable,
        alpha=alpha, by=by,
    )



#: guard markers a training run's verdict checks (they must not fall)
RUN_GUARDS = ("well_formed",)


def run_verdict(before: Iterable[Row], after: Iterable[Row], *,
                noise: NoiseBand | Sequence[Sequence[Row]] | None = None,
                guards: Sequence[str] | None = None, seed: int = 0) -> DeltaReport:
    """The verdict of a training run: the one function the recipes' report and
    ``posttrain eval --compare`` both call, so a run's own row files give its verdict.

    ``before``: every base evaluation's rows (their ``eval_run`` repeats are pooled on
    the before side and give the noise band); ``after``: the trained policy's rows.
    Grouped by category; the guards ``RUN_GUARDS`` where they can fail on the before rows,
    else a marker that can (``posttrain.score.guards``; the choice's notes end the
    warnings), unless ``guards`` names them.
    """
    before, notes = list(before), []
    if guards is None:
        choice = choose_guards(before, RUN_GUARDS)
        guards, notes = choice.names, choice.notes
    report = delta(before, after, guards=guards, by="category", noise=noise, seed=seed)
    report.warnings.extend(notes)
    return report
