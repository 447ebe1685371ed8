"""pass@1 (and pass@k, pass^k) of graded rows, with an interval and n.

The unit of analysis is the scenario (``scenario_id``): one situation may be written as
several prompts, and each prompt may be sampled several times. All rows of a scenario pool
into one per-scenario rate, and pass@1 is the plain mean of those rates, so a scenario
with three phrasings weighs the same as one with a single phrasing.

Uncertainty is reported three ways, each where it is valid:

- ``ci95``: seeded percentile bootstrap over scenarios (resample whole scenarios). Needs at
  least 3 scenarios; with fewer it is None and ``note`` says why.
- ``se_clustered``: analytic SE, sd of the per-scenario rates (ddof=1) / sqrt(scenarios).
  With equal rows per scenario this equals the cluster-robust SE with the C/(C-1)
  correction on the pooled rows (see ``stats.clustered_se``).
- ``wilson95``: Wilson interval, only when every scenario has exactly one row and values
  are 0/1, the one case where independent Bernoulli trials are the right model.

The same machinery measures any 0/1 (or real) per-row value: ``value="marker:tool_call"``
gives a tool-call rate with the same interval rules.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from posttrain.score import stats
from posttrain.score.format import JsonRecord, format_interval, format_rate, json_safe, sample_shape

Row = Mapping[str, Any]
ValueSpec = str | Callable[[Row], float]

#: fewest scenarios a bootstrap interval is computed from (fewer gives a degenerate interval)
MIN_BOOTSTRAP_SCENARIOS = 3


def scenario_key(row: Row) -> str:
    """The scenario a row belongs to: ``scenario_id``, else the prompt text itself."""
    scenario = row.get("scenario_id")
    if scenario is None or scenario == "":
        return str(row.get("prompt", ""))
    return str(scenario)


def value_label(value: ValueSpec) -> str:
    """Short display name of a value spec: "pass@1" for reward, the marker name, etc."""
    if callable(value):
        return getattr(value, "__name__", "value")
    if value == "reward":
        return "pass@1"
    if value.startswith("marker:"):
        return value.split(":", 1)[1]
    return value


def value_getter(value: ValueSpec) -> Callable[[int, Row], float]:
    """Turn a value spec into ``get(row_index, row) -> float``.

    ``"reward"`` (or any other top-level key such as ``"score"``) reads that key;
    ``"marker:<name>"`` reads ``row["markers"][name]``; a callable is applied to the row.
    A missing value raises ValueError naming the row and what to do.
    """
    if callable(value):
        return lambda index, row: float(value(row))
    if value.startswith("marker:"):
        name = value.split(":", 1)[1]

        def get_marker(index: int, row: Row) -> float:
            markers = row.get("markers") or {}
            if name not in markers or markers[name] is None:
                raise ValueError(
                    f"row {index} (scenario {scenario_key(row)!r}) has no marker {name!r}; "
                    f"grade the rows with an environment that sets it, or drop it from "
                    f"the metrics")
            return float(markers[name])

        return get_marker

    def get_key(index: int, row: Row) -> float:
        if row.get(value) is None:
            raise ValueError(f"row {index} (scenario {scenario_key(row)!r}) has no {value!r}; "
                             f"grade the rows first")
        return float(row[value])

    return get_key


def scenario_values(rows: Iterable[Row], value: ValueSpec = "reward") -> dict[str, list[float]]:
    """Per-scenario lists of row values, in first-seen scenario order."""
    get = value_getter(value)
    grouped: dict[str, list[float]] = {}
    for index, row in enumerate(rows):
        grouped.setdefault(scenario_key(row), []).append(get(index, row))
    return grouped


def scenario_means(rows: Iterable[Row], value: ValueSpec = "reward") -> dict[str, float]:
    """Per-scenario mean value (all rows of a scenario pooled), first-seen order."""
    return {key: sum(vals) / len(vals) for key, vals in scenario_values(rows, value).items()}


@dataclass
class PassAt:
    """pass@1 of a set of graded rows with its interval and n (see module docstring)."""

    pass_at_1: float
    ci95: tuple[float, float] | None
    se_clustered: float | None
    wilson95: tuple[float, float] | None
    k: int | None
    pass_at_k: float | None
    pass_pow_k: float | None
    n_scenarios: int
    n_prompts: int
    samples_per_prompt: int | None
    n_rows: int
    per_scenario: dict[str, float] = field(repr=False)
    note: str = ""
    #: display name of what was measured ("pass@1", "tool_call", ...)
    label: str = "pass@1"
    #: scenarios with at least k rows, the ones pass@k and pass^k average over
    n_scenarios_at_k: int = 0

    def describe(self) -> str:
        """The rate, its interval and n without the label: "0.29 [0.22, 0.35] (n=...)"."""
        shape = sample_shape(self.n_prompts, self.samples_per_prompt, self.n_rows)
        scenarios = f"{self.n_scenarios} scenario{'s' if self.n_scenarios != 1 else ''}"
        return (f"{format_rate(self.pass_at_1)} {format_interval(self.ci95)} "
                f"(n={scenarios}, {shape})")

    def __str__(self) -> str:
        return f"{self.label} {self.describe()}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict: floats rounded to 6 places, intervals as lists, NaN as None."""
        return json_safe({
            "label": self.label, "pass_at_1": self.pass_at_1, "ci95": self.ci95,
            "se_clustered": self.se_clustered, "wilson95": self.wilson95, "k": self.k,
            "pass_at_k": self.pass_at_k, "pass_pow_k": self.pass_pow_k,
            "n_scenarios": self.n_scenarios, "n_scenarios_at_k": self.n_scenarios_at_k,
            "n_prompts": self.n_prompts, "samples_per_prompt": self.samples_per_prompt,
            "n_rows": self.n_rows, "per_scenario": self.per_scenario, "note": self.note,
        })


def _samples_per_prompt(rows: list[Row]) -> tuple[int, int | None]:
    """(number of distinct prompts, samples per prompt or None when uneven)."""
    counts: dict[tuple[str, str], int] = {}
    for row in rows:
        key = (scenario_key(row), str(row.get("prompt", "")))
        counts[key] = counts.get(key, 0) + 1
    sizes = set(counts.values())
    return len(counts), (sizes.pop() if len(sizes) == 1 else None)


def _pass_at_k_over_scenarios(
    grouped: dict[str, list[float]], k: int, notes: list[str],
) -> tuple[float | None, float | None, int]:
    """Mean unbiased pass@k and pass^k over scenarios with at least k rows."""
    if any(v not in (0.0, 1.0) for vals in grouped.values() for v in vals):
        notes.append(f"pass@{k} needs 0/1 values; not computed")
        return None, None, 0
    eligible = [vals for vals in grouped.values() if len(vals) >= k]
    if not eligible:
        notes.append(f"no scenario has {k} samples; pass@{k} not computed")
        return None, None, 0
    if len(eligible) < len(grouped):
        short = len(grouped) - len(eligible)
        notes.append(f"pass@{k} over {len(eligible)} of {len(grouped)} scenarios "
                     f"({short} have fewer than {k} samples)")
    at_k = [stats.pass_at_k(len(vals), int(sum(vals)), k) for vals in eligible]
    pow_k = [stats.pass_pow_k(len(vals), int(sum(vals)), k) for vals in eligible]
    return sum(at_k) / len(at_k), sum(pow_k) / len(pow_k), len(eligible)


def pass_at(rows: Iterable[Row], *, k: int | None = None, seed: int = 0, n_boot: int = 2000,
            value: ValueSpec = "reward") -> PassAt:
    """pass@1 over scenarios with a seeded bootstrap interval and n.

    ``value``: "reward" (0/1 pass), "marker:<name>", another row key, or row -> float.
    ``k``: for pass@k / pass^k; defaults to the samples per prompt when that is even and
    at least 2, else None (not computed). The interval is None, with a note, under 3
    scenarios. Raises ValueError on no rows, k < 1, or a row missing the value.
    """
    rows = list(rows)
    if not rows:
        raise ValueError("pass_at: no rows to score; grade some samples first")
    if k is not None and k < 1:
        raise ValueError(f"pass_at: k must be at least 1, got {k}")
    grouped = scenario_values(rows, value)
    per_scenario = {key: sum(vals) / len(vals) for key, vals in grouped.items()}
    rates = list(per_scenario.values())
    n_prompts, per_prompt = _samples_per_prompt(rows)
    notes: list[str] = []

    ci95 = None
    if len(rates) >= MIN_BOOTSTRAP_SCENARIOS:
        ci95 = stats.bootstrap_interval(rates, n_boot=n_boot, seed=seed)
    else:
        notes.append(f"no interval on {value_label(value)}: {len(rates)} scenario(s), and a "
                     f"bootstrap over scenarios needs {MIN_BOOTSTRAP_SCENARIOS}")
    se = stats.standard_error(rates)

    all_values = [v for vals in grouped.values() for v in vals]
    binary = all(v in (0.0, 1.0) for v in all_values)
    wilson = None
    if binary and all(len(vals) == 1 for vals in grouped.values()):
        wilson = stats.wilson_interval(int(sum(all_values)), len(all_values))
    if len(all_values) > 1 and len(set(all_values)) == 1:
        notes.append(f"every row scored {all_values[0]:g} ({len(all_values)} of "
                     f"{len(all_values)}); check the grader before reading this number")

    if k is None and per_prompt is not None and per_prompt >= 2:
        k = per_prompt
    at_k = pow_k = None
    n_at_k = 0
    if k is not None:
        at_k, pow_k, n_at_k = _pass_at_k_over_scenarios(grouped, k, notes)

    return PassAt(
        pass_at_1=sum(rates) / len(rates), ci95=ci95,
        se_clustered=None if math.isnan(se) else se, wilson95=wilson,
        k=k, pass_at_k=at_k, pass_pow_k=pow_k, n_scenarios=len(rates), n_prompts=n_prompts,
        samples_per_prompt=per_prompt, n_rows=len(rows), per_scenario=per_scenario,
        note="; ".join(notes), label=value_label(value), n_scenarios_at_k=n_at_k,
    )


def has_marker(rows: Iterable[Row], name: str) -> bool:
    """True when every row carries marker ``name``."""
    return all(name in (row.get("markers") or {}) for row in rows)


def mean_rate(rows: Iterable[Row], value: ValueSpec = "reward") -> float:
    """pass@1-style rate without intervals: the mean of per-scenario means."""
    means = list(scenario_means(rows, value).values())
    if not means:
        raise ValueError("mean_rate: no rows")
    return sum(means) / len(means)


def tool_call_rate(rows: Sequence[Row]) -> float | None:
    """Mean over scenarios of the ``tool_call`` marker; None if a row lacks it."""
    return mean_rate(rows, "marker:tool_call") if has_marker(rows, "tool_call") else None


def group_rows(rows: Iterable[Row], by: str) -> dict[str, list[Row]]:
    """Rows split by the value of row key ``by`` (as text), in first-seen order."""
    groups: dict[str, list[Row]] = {}
    for row in rows:
        groups.setdefault(str(row.get(by, "(missing)")), []).append(row)
    return groups


@dataclass
class GroupStats(JsonRecord):
    """One group of a single run: pass@1 with interval and n, and the tool-call rate."""

    name: str
    pass_at_1: float
    ci95: tuple[float, float] | None
    n_scenarios: int
    n_prompts: int
    n_rows: int
    tool_call_rate: float | None


def category_table(rows: Iterable[Row], *, by: str = "category", seed: int = 0,
                   n_boot: int = 2000) -> list[GroupStats]:
    """Single-run table: per group pass@1 with interval and n, tool-call rate, rows.

    Groups (values of row key ``by``) appear in first-seen order; the tool-call rate is
    None where a row lacks the ``tool_call`` marker. Group i bootstraps with ``seed + i``.
    """
    table = []
    for index, (name, group) in enumerate(group_rows(rows, by).items()):
        result = pass_at(group, seed=seed + index, n_boot=n_boot)
        table.append(GroupStats(
            name=name, pass_at_1=result.pass_at_1, ci95=result.ci95,
            n_scenarios=result.n_scenarios, n_prompts=result.n_prompts, n_rows=result.n_rows,
            tool_call_rate=tool_call_rate(group),
        ))
    return table


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
