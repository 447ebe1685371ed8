"""The eval noise band: how far a paired delta moves between evaluations of one policy.

Noise band, a deliberate departure from the reference SDK: it uses t_{R-1} * run_std *
sqrt(2) over R base re-evaluations, so with the usual R = 2 (t_1 = 12.7) almost any
real gain reads as noise. We estimate the null distribution of the paired delta itself:
two evaluations of the SAME policy are compared scenario by scenario, exactly as
before/after are. The per-scenario differences d_s of every pair of repeats give, with
their variance pooled over pairs, the SE of a null delta sd(d_s)/sqrt(S); the band is
t_{S-1} times it, the 95% half-width of a delta between two runs of one policy. The
scenarios carry the degrees of freedom, so two repeats already give a usable band. The
ddof=1 spread is centred, so it cannot see a uniform shift between repeats; a repeat-to-
repeat delta larger than the band is therefore reported as a warning.
run_std (sd of the repeats' pass@1), each repeat's pass@1 and the largest repeat-to-
repeat delta are reported beside it. ``band`` is for single evaluations on both sides;
a comparison whose before side pools the R repeats (the recipes and ``eval --compare``
do) applies ``band_for(..., before_evaluations=R)``, sqrt((1/R + 1)/2) of it. With one
evaluation there is no band: ``moved`` rests on the interval alone and the report says
"no noise band: 1 evaluation".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

import numpy as np

from posttrain.score import stats
from posttrain.score.format import JsonRecord, json_safe
from posttrain.score.passat import Row, ValueSpec, scenario_means

#: a noise band's note when only one evaluation was made
ONE_EVALUATION = "no noise band: 1 evaluation"


@dataclass
class NoiseBand(JsonRecord):
    """How far a paired delta moves between evaluations of the same policy."""

    band: float | None
    level: float
    n_repeats: int
    n_scenarios: int
    df: int | None
    sd_null_difference: float | None
    run_std: float | None
    pass_at_1: list[float]
    max_repeat_delta: float | None
    note: str = ""
    #: per repeat pair, scenario -> difference of means (kept for group bands)
    pair_differences: list[dict[str, float]] = field(default_factory=list, repr=False)

    def null_spread(self, scenarios: Iterable[str] | None = None) -> tuple[float, int] | None:
        """(pooled sd of per-scenario null differences, fewest scenarios in a pair).

        Restricted to ``scenarios`` when given; None when no repeat pair shares 2 of them.
        """
        wanted = None if scenarios is None else set(scenarios)
        variances, counts = [], []
        for differences in self.pair_differences:
            values = [d for key, d in differences.items() if wanted is None or key in wanted]
            if len(values) >= 2:
                variances.append(float(np.var(values, ddof=1)))
                counts.append(len(values))
        if not variances:
            return None
        return math.sqrt(sum(variances) / len(variances)), min(counts)

    def band_for(self, scenarios: Iterable[str] | None = None, *, before_evaluations: int = 1,
                 after_evaluations: int = 1) -> float | None:
        """Band for a delta over ``scenarios`` (all when None): t_{n-1} * sd / sqrt(n).

        ``sd`` is that of a difference between two single evaluations (2 sigma^2 per
        scenario). When a side pools several evaluations its sampling noise shrinks:
        the band is scaled by ``sqrt((1 / before + 1 / after) / 2)`` (0.87 for a
        before side of 2 pooled evaluations against 1 after).
        """
        spread = self.null_spread(scenarios)
        if spread is None:
            return None
        sd, count = spread
        pooled = math.sqrt((1.0 / before_evaluations + 1.0 / after_evaluations) / 2.0)
        return stats.t_critical(count - 1, self.level) * sd / math.sqrt(count) * pooled

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict, without the per-scenario differences."""
        fields = {key: item for key, item in vars(self).items() if key != "pair_differences"}
        return json_safe(fields)


def split_by_eval_run(rows: Iterable[Row]) -> list[list[Row]]:
    """Rows grouped by ``eval_run`` (missing counts as 0), in eval_run order."""
    runs: dict[Any, list[Row]] = {}
    for row in rows:
        runs.setdefault(row.get("eval_run", 0), []).append(row)
    return [runs[key] for key in sorted(runs, key=str)]


def noise_band(repeats: Sequence[Sequence[Row]], *, seed: int = 0, value: ValueSpec = "reward",
               level: float = 0.95) -> NoiseBand:
    """Noise band from repeated evaluations of one policy (see the module docstring).

    ``repeats``: one list of graded rows per evaluation (different sampling seeds).
    ``seed`` is accepted so every call here shares one shape; the band is analytic, so
    it does not depend on it. One repeat gives ``band=None`` with a note.
    """
    del seed  # analytic: nothing is resampled
    if not repeats:
        raise ValueError("noise_band: no evaluations given; pass one list of rows per repeat")
    means = [scenario_means(rows, value) for rows in repeats]
    rates = [stats.mean(list(m.values())) for m in means]
    common = set(means[0]).intersection(*means[1:])
    result = NoiseBand(band=None, level=level, n_repeats=len(repeats), n_scenarios=len(common),
                       df=None, sd_null_difference=None, run_std=None, pass_at_1=rates,
                       max_repeat_delta=None)
    if len(repeats) < 2:
        result.note = ONE_EVALUATION
        return result
    for first, second in combinations(means, 2):
        result.pair_differences.append(
            {key: second[key] - first[key] for key in first if key in second})
    result.run_std = float(stats.standard_error(rates) * math.sqrt(len(rates)))
    result.max_repeat_delta = max(abs(a - b) for a, b in combinations(rates, 2))
    spread = result.null_spread()
    if spread is None:
        result.note = "no noise band: the repeats share fewer than 2 scenarios"
        return result
    result.sd_null_difference, result.df = spread[0], spread[1] - 1
    result.band = result.band_for()
    return result
