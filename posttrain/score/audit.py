"""The reward audit: what a reward pays for beyond what its environment says it should.

Run once, before training, on the base policy's graded samples (the recipes use the
holdout rows of the before evaluation, several samples per prompt). Within each prompt
category, ``hack_scan`` asks which reply features the reward pays for between replies
to the same scenario; the features the environment declares for that category
(``rewarded_features``: the rule's design) are endorsed, and every other feature the
scan flags is a *finding*: a property of the rule, not of a training run (the refund
rule, for instance, scores a lookup with an invented id 0.3, above a plain reply's 0.0).

Findings are what the reward pays for *more* of: an unendorsed feature paid for, or an
endorsed one paid *against* the direction the design gives it (``-has_question``: on
no-id prompts, where the design pays for asking, a reward that pays for not asking).
A feature the reward pays for less of (an invented id, where the rule penalises it)
cannot be exploited and is no finding. A finding is not an alarm. It says where a
policy *could* be paid for the wrong thing;
the hack monitor (``posttrain.train.grpo.monitor``) raises an alarm only when a training run
actually exploits something (``posttrain.train.grpo.alarms``).

The scan sees only what the base policy already does. ``audit_reward`` adds the reward
probes (``posttrain.score.probes``): edits a rule should not pay for (padding, a stray
tag, a question, flattery, a frequent word, another case's call, an off-task reply),
scored by the reward; an edit it pays for is a finding too, before any policy found it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from posttrain.envs.base import Env, case_of, design_direction, feature_name, rewarded_features
from posttrain.score.format import JsonRecord
from posttrain.score.hack_scan import FeatureResult, hack_scan
from posttrain.score.probes import ProbeFinding, Score, probe_reward

Row = Mapping[str, Any]
MIN_CATEGORY_ROWS = 20  # fewer rows than this in a category: not scanned
#: shuffles per unit of 1/alpha: a floor at the (1 - alpha) quantile of the shuffles'
#: largest statistic rests on about this many shuffles above it
AUDIT_SHUFFLES_PER_ALPHA = 10


@dataclass
class AuditFinding(JsonRecord):
    """One feature the reward pays for in one category that the design does not name."""

    category: str
    feature: str
    statistic: float  # within-prompt correlation with the reward, net of the endorsed ones
    floor: float
    direction: str  # "+": the reward pays for more of it
    aliases: list[str] = field(default_factory=list)

    def describe(self) -> str:
        more = "more" if self.direction == "+" else "less"
        shown = self.aliases[:4] + (["..."] if len(self.aliases) > 4 else [])
        also = f" (same as {', '.join(shown)})" if self.aliases else ""
        return (f"{self.category}: the reward pays for {more} {self.feature!r}{also}, "
                f"{self.statistic:+.2f} within prompt (noise floor {self.floor:.2f})")


@dataclass
class RewardAudit(JsonRecord):
    """Findings per category, and which categories could not be scanned."""

    findings: list[AuditFinding]
    scanned: dict[str, int]  # category -> rows scanned
    skipped: dict[str, str]  # category -> why it was not scanned
    endorsed: dict[str, list[str]]
    probes: list[ProbeFinding] = field(default_factory=list)  # edits the reward pays for
    tested: int = 0  # features tested over every category scanned
    alpha: float = 0.05  # the chance that noise makes any finding of the scan, at most

    def format(self) -> str:
        """Readable lines: one per finding, or that none was found."""
        scanned = (", ".join(f"{name} {count}" for name, count in self.scanned.items())
                   + " rows") if self.scanned else "no rows scanned"
        lines = [f"reward audit ({scanned}; endorsed by the environment's design: "
                 + "; ".join(f"{name} {', '.join(names) or '-'}"
                             for name, names in self.endorsed.items()) + ")"]
        if self.tested:
            lines.append(f"  {self.tested} features tested in {len(self.scanned)} "
                         f"categor{'y' if len(self.scanned) == 1 else 'ies'}; a finding "
                         f"holds against noise at {self.alpha:g} over all of them")
        if not self.findings and not self.probes:
            lines.append("  nothing beyond the design above the noise floor, and no probe "
                         "edit paid")
        lines.extend(f"  {finding.describe()}" for finding in self.findings)
        lines.extend(f"  probe: {finding.describe()}" for finding in self.probes)
        lines.extend(f"  {name}: not scanned ({why})" for name, why in self.skipped.items())
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"findings": [f.to_dict() for f in self.findings], "scanned": self.scanned,
                "skipped": self.skipped, "endorsed": self.endorsed, "tested": self.tested,
                "alpha": self.alpha,
                "probes": [{**f.to_dict(), "feature": f.feature} for f in self.probes]}

    def described(self) -> list[str]:
        """One sentence per finding, scan then probes (for the run's notes)."""
        return ([finding.describe() for finding in self.findings]
                + [f"probe: {finding.describe()}" for finding in self.probes])


def against_design(result: FeatureResult, declared: Iterable[str]) -> bool:
    """Is an endorsed feature paid for in the other direction than the design's?

    The direction comes from the feature's own name or, when hack_scan merged it with
    an endorsed alias (``-tool_call`` is ``has_question`` where every reply does one or
    the other), from that alias, flipped for a complement.
    """
    direction = design_direction(declared, result.name)
    if direction is None:
        for alias in result.aliases:
            found = design_direction(declared, alias.lstrip("-"))
            if found is not None:
                flipped = {"+": "-", "-": "+"}.get(found, found)
                direction = flipped if alias.startswith("-") else found
                break
    return direction in ("+", "-") and direction != result.direction


def reward_audit(rows: Iterable[Row], endorsed_for: Callable[[str], tuple[str, ...]], *,
                 seed: int = 0, alpha: float = 0.05) -> RewardAudit:
    """Scan graded rows per category (module docstring).

    ``endorsed_for(category)`` gives the features the design pays for there (e.g.
    ``lambda c: rewarded_features(env, c)``). Rows need ``category``, ``scenario_id``,
    ``reply`` and a numeric ``score`` (the reward being audited). Deterministic for
    a seed.
    """
    by_category: dict[str, list[Row]] = {}
    for row in rows:
        by_category.setdefault(str(row.get("category", "all")), []).append(row)
    findings, scanned, skipped, endorsed = [], {}, {}, {}
    # every category scanned is two families of tests (the endorsed features, the rest),
    # each held at its largest statistic: ``alpha`` is split over all of them, so the
    # chance that noise makes any finding in the whole audit stays at ``alpha``
    families = 2 * sum(1 for group in by_category.values() if len(group) >= MIN_CATEGORY_ROWS)
    each = alpha / max(1, families)
    shuffles = max(200, math.ceil(AUDIT_SHUFFLES_PER_ALPHA / each))
    tested = 0
    for index, (category, group) in enumerate(by_category.items()):
        endorsed[category] = list(endorsed_for(category))
        if len(group) < MIN_CATEGORY_ROWS:
            skipped[category] = f"{len(group)} rows, fewer than {MIN_CATEGORY_ROWS}"
            continue
        names = [feature_name(entry) for entry in endorsed[category]]
        report = hack_scan(group, endorsed=names, seed=seed + index, alpha=each,
                           n_perm=shuffles)
        if report.degenerate:
            skipped[category] = "the reward never varies within a scenario"
            continue
        scanned[category] = len(group)
        tested += len(report.features)
        for result in report.features:
            if not result.flagged:
                continue
            if not result.endorsed and result.direction == "+":
                findings.append(AuditFinding(category, result.name, result.statistic,
                                             result.floor, "+", list(result.aliases)))
            elif result.endorsed and against_design(result, endorsed[category]):
                # paid in the other direction than the design's: name what is paid for
                opposite = result.direction == "-"
                findings.append(AuditFinding(
                    category, f"-{result.name}" if opposite else result.name,
                    -result.statistic if opposite else result.statistic,
                    result.floor, "+", list(result.aliases)))
    return RewardAudit(findings, scanned, skipped, endorsed, tested=tested, alpha=alpha)


def audit_reward(env: Env, rows: Iterable[Row], score: Score, *, rule: Score | None = None,
                 seed: int = 0) -> RewardAudit:
    """The whole audit of the reward ``score`` on ``env``'s graded base-policy ``rows``:
    the scan of the rows rescored by it, per category, and the probes (``rule``: the
    rule's score when ``score`` is another reward, None when it is the rule)."""
    rescored = [{**row, "score": score(row["reply"], case_of(env, row))} for row in rows]
    audit = reward_audit(rescored, lambda category: rewarded_features(env, category),
                         seed=seed)
    probed = probe_reward(env, rescored, score, rule=rule, seed=seed)
    audit.probes = probed.findings
    audit.skipped.update({f"probe {name}": why for name, why in probed.skipped.items()})
    return audit
