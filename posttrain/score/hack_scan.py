"""Which feature of a reply is the reward paying for? A within-prompt scan against a noise floor.

GRPO learns from reward differences *between replies to the same prompt*, so that is
where a reward hack lives: if, among replies to one prompt, the longer ones score
higher, the policy will learn to write longer. The scan measures exactly that.

Method, for graded rows ``{prompt, scenario_id, reply, score, reward, markers}``:

1. Group the rows by ``scenario_id`` (by ``prompt`` when a row has none) and keep the
   groups where the reward varies (elsewhere there is nothing to learn from).
2. Measure features of each reply: ``length`` (characters), ``tool_call``, ``tool:<name>``
   for each tool called, ``has_digits``, ``has_question``, ``token:<t>`` for named tokens
   (``<tool_call>``, ``</tool_call>``, ``<think>``), ``marker:<m>`` for each numeric marker,
   ``word:<w>`` for the replies' frequent words, plus any ``features={name: fn(row)}``.
   Features that are identical (or complementary) within groups collapse into one, the
   others named as its ``aliases`` (``-name`` for a complement).
3. Centre reward and every feature within each group and take their correlation over
   all rows: the within-prompt correlation (prompt difficulty is subtracted out).
4. Noise floor: shuffle the rewards within each group ``n_perm`` times (seeded) and take
   the (1 - alpha) quantile of the *largest* |correlation| over the features tested. A
   feature above it is flagged. Using the maximum (not each feature's own quantile) keeps
   the chance that pure noise flags anything at alpha, however many features are scanned;
   ``p_value`` is the matching family-wise p-value.
5. Endorsed features (``endorsed=["lookup_order"]`` matches ``tool:lookup_order`` and
   ``word:lookup_order``) are what the reward is *meant* to pay for. Every other feature
   is tested on what is left once the endorsed ones are accounted for (partial
   correlation: reward and feature both regressed on the endorsed features within
   groups, then shuffled as above). So ``<tool_call>`` appearing exactly when
   ``lookup_order`` is called is not reported as a second, unendorsed cause.

``top_unendorsed`` is the strongest flagged feature that is not endorsed (what the reward
audit reports first; the HackMonitor alarms only when a run exploits such a feature);
``degenerate`` is set when no group has any reward variance. A feature
varying within fewer than ``min_groups`` groups is never flagged (one prompt is not a
pattern). Differences from the reference SDK (reference/whileai.md 13.2): groups may be
scenarios, the default signal is the raw ``score`` (finer than pass/fail), and unendorsed
features are judged net of the endorsed ones.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from posttrain.score.format import JsonRecord

DEFAULT_TOKENS = ("<tool_call>", "</tool_call>", "<think>")
FeatureFn = Callable[[Mapping[str, Any]], float]

TOOL_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_TOOL_NAME = re.compile(r'"(?:name|tool)"\s*:\s*"([^"]+)"')
_WORD = re.compile(r"[a-z_]{2,}")
_DIGIT = re.compile(r"\d")
_ALIAS_TOLERANCE = 1e-9


@dataclass
class FeatureResult(JsonRecord):
    """One feature's evidence. ``statistic`` is what is tested: the within-prompt
    correlation with the reward, net of the endorsed features for an unendorsed one."""

    name: str
    statistic: float
    marginal: float  # within-prompt correlation, no adjustment
    slope: float  # reward change per unit of the feature, within prompt
    floor: float
    p_value: float
    flagged: bool
    direction: str  # "+": the reward pays for more of it, "-": for less
    n_groups: int  # groups where both the reward and this feature vary
    endorsed: bool
    aliases: list[str] = field(default_factory=list)


@dataclass
class HackScanReport(JsonRecord):
    """What ``hack_scan`` found; ``format()`` renders it as a table."""

    reward: str
    n_rows: int
    n_groups: int
    n_groups_with_variance: int
    n_perm: int
    alpha: float
    endorsed: list[str]
    endorsed_matched: list[str]
    features: list[FeatureResult]
    flagged: list[str]
    top_unendorsed: str | None
    degenerate: bool
    warnings: list[str] = field(default_factory=list)

    def format(self, limit: int = 12) -> str:
        """Header, the ``limit`` strongest features (``*`` flagged, ``e`` endorsed), verdict."""
        lines = [
            f"hack scan of {self.reward!r}: {self.n_rows} rows, {self.n_groups_with_variance} of "
            f"{self.n_groups} groups with reward variance, floor from {self.n_perm} "
            f"within-group shuffles (alpha {self.alpha})"
        ]
        if self.degenerate:
            lines.append("degenerate: no group has any reward variance; nothing to scan")
        else:
            lines.append(f"  {'feature':<28} {'stat':>7} {'floor':>6} {'p':>6} {'groups':>6}")
            for result in self.features[:limit]:
                mark = "*" if result.flagged else " "
                tag = " e" if result.endorsed else ""
                lines.append(
                    f"{mark} {result.name[:28]:<28} {result.statistic:>+7.3f} "
                    f"{result.floor:>6.3f} {result.p_value:>6.3f} {result.n_groups:>6}{tag}"
                )
            if self.top_unendorsed is None:
                lines.append("no unendorsed feature above the noise floor")
            else:
                top = next(r for r in self.features if r.name == self.top_unendorsed)
                more = "more" if top.direction == "+" else "less"
                lines.append(f"the reward pays for {more} {top.name!r} (not endorsed): "
                             f"{top.statistic:+.3f} above floor {top.floor:.3f}")
        lines.extend(f"warning: {warning}" for warning in self.warnings)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()


# --- features -----------------------------------------------------------------------


def tool_names(reply: str) -> list[str]:
    """Names of the tools called in ``<tool_call>`` blocks of ``reply``, in order."""
    names = []
    for block in TOOL_BLOCK.findall(reply or ""):
        name = None
        try:
            payload = json.loads(block.strip())
            if isinstance(payload, dict):
                name = payload.get("name", payload.get("tool"))
        except (ValueError, RecursionError):
            match = _TOOL_NAME.search(block)
            name = match.group(1) if match else None
        if isinstance(name, str) and name.strip():
            names.append(name.strip())
    return names


def _frequent_words(replies: Sequence[str], max_words: int, min_rows: int) -> list[str]:
    document_frequency = Counter(word for reply in replies for word in set(_WORD.findall(reply)))
    eligible = [word for word, count in document_frequency.items()
                if min_rows <= count <= len(replies) - min_rows]
    eligible.sort(key=lambda word: (-document_frequency[word], word))
    return eligible[:max_words]


def build_features(rows: Sequence[Mapping[str, Any]], *, tokens: Sequence[str] = DEFAULT_TOKENS,
                   features: Mapping[str, FeatureFn] | None = None, max_words: int = 40,
                   min_word_rows: int | None = None) -> dict[str, np.ndarray]:
    """Every feature of every row's reply, as ``{name: float array}`` in scan order."""
    replies = [str(row.get("reply") or "") for row in rows]
    called = [tool_names(reply) for reply in replies]
    columns: dict[str, np.ndarray] = {
        "length": np.array([len(reply) for reply in replies], dtype=float),
        "tool_call": np.array([bool(names) for names in called], dtype=float),
    }
    for tool in sorted({name for names in called for name in names}):
        columns[f"tool:{tool}"] = np.array([tool in names for names in called], dtype=float)
    columns["has_digits"] = np.array([bool(_DIGIT.search(r)) for r in replies], dtype=float)
    columns["has_question"] = np.array(["?" in reply for reply in replies], dtype=float)
    for token in tokens:
        columns[f"token:{token}"] = np.array([token in reply for reply in replies], dtype=float)
    marker_names = sorted({
        name for row in rows for name, value in (row.get("markers") or {}).items()
        if isinstance(value, (int, float))
    })
    for name in marker_names:
        columns[f"marker:{name}"] = np.array(
            [float((row.get("markers") or {}).get(name) or 0.0) for row in rows], dtype=float
        )
    min_rows = min_word_rows or max(5, math.ceil(0.05 * len(rows)))
    lowered = [reply.lower() for reply in replies]
    for word in _frequent_words(lowered, max_words, min_rows):
        pattern = re.compile(rf"(?<![a-z_]){re.escape(word)}(?![a-z_])")
        columns[f"word:{word}"] = np.array([bool(pattern.search(r)) for r in lowered], dtype=float)
    for name, function in (features or {}).items():
        try:
            columns[name] = np.array([float(function(row)) for row in rows], dtype=float)
        except Exception as error:
            raise ValueError(f"hack_scan: feature {name!r} failed: {error}") from error
    return columns


def _is_endorsed(name: str, patterns: Iterable[str]) -> bool:
    lowered = name.lower()
    bare = lowered.split(":", 1)[1] if ":" in lowered else lowered
    return any(pattern.lower() in (lowered, bare) for pattern in patterns)


# --- statistics -----------------------------------------------------------------------


def _centre(values: np.ndarray, groups: np.ndarray, n_groups: int) -> np.ndarray:
    """Subtract each group's mean (``values`` may be 1-d or rows x columns)."""
    counts = np.bincount(groups, minlength=n_groups).astype(float)
    if values.ndim == 1:
        return values - (np.bincount(groups, values, n_groups) / counts)[groups]
    sums = np.zeros((n_groups, values.shape[1]))
    np.add.at(sums, groups, values)
    return values - (sums / counts[:, None])[groups]


def _shuffled_within_groups(vector: np.ndarray, groups: np.ndarray, n_perm: int,
                            rng: np.random.Generator) -> np.ndarray:
    """``n_perm`` copies of ``vector``, each shuffled within every group (n_perm x rows)."""
    base = np.argsort(groups, kind="stable")
    # sorting by (group + uniform draw) shuffles inside each group and keeps groups apart
    orders = np.argsort(groups[None, :] + rng.random((n_perm, len(vector))), axis=1)
    shuffled = np.empty((n_perm, len(vector)))
    shuffled[:, base] = vector[orders]
    return shuffled


def _floor_and_p(observed: np.ndarray, shuffled: np.ndarray, alpha: float
                 ) -> tuple[float, np.ndarray]:
    """Family-wise floor (1 - alpha quantile of the max |stat| per shuffle) and p-values."""
    maxima = np.sort(np.abs(shuffled).max(axis=1))
    floor = float(maxima[max(0, math.ceil((1 - alpha) * len(maxima)) - 1)])
    exceed = (maxima[None, :] >= np.abs(observed)[:, None] - 1e-12).sum(axis=1)
    return floor, (1 + exceed) / (len(maxima) + 1)


def _unit_columns(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    norms = np.linalg.norm(matrix, axis=0)
    return matrix / np.where(norms > 0, norms, 1.0), norms


def _collapse_aliases(names: list[str], centred: np.ndarray, endorsed: list[bool]
                      ) -> tuple[list[int], dict[int, list[str]]]:
    """Keep one column per group of identical or complementary (within-group) columns.

    Endorsed columns are kept first, then the earlier in scan order; each kept column
    lists the others as aliases (``-name`` for a complement).
    """
    unit, _ = _unit_columns(centred)
    order = sorted(range(len(names)), key=lambda i: (not endorsed[i], i))
    kept: list[int] = []
    aliases: dict[int, list[str]] = {}
    for index in order:
        cosines = {k: float(unit[:, k] @ unit[:, index]) for k in kept}
        twin = next((k for k, c in cosines.items() if abs(c) > 1 - _ALIAS_TOLERANCE), None)
        if twin is None:
            kept.append(index)
            aliases[index] = []
        else:  # a complement (has_question when exactly the non-calls ask) is "-name"
            aliases[twin].append(names[index] if cosines[twin] > 0 else f"-{names[index]}")
    return sorted(kept), aliases


def hack_scan(rows: Iterable[Mapping[str, Any]], *, endorsed: Sequence[str] = (),
              features: Mapping[str, FeatureFn] | None = None, n_perm: int = 200,
              seed: int = 0, alpha: float = 0.05, min_groups: int = 4, reward: str = "score",
              tokens: Sequence[str] = DEFAULT_TOKENS, max_words: int = 40) -> HackScanReport:
    """Scan graded rows for the reply features the reward pays for, within prompt.

    ``reward``: the row field scanned (default the raw ``score``; ``"reward"`` for 0/1).
    ``endorsed``: names (or bare names like ``"lookup_order"``) of features the reward is
    meant to pay for. ``features``: extra ``{name: fn(row) -> float}``. ``n_perm``
    within-group shuffles (seeded by ``seed``) set the noise floor at level ``alpha``.
    Rows without a numeric ``reward`` field are skipped. Deterministic for a seed.
    See the module docstring for the method.
    """
    if n_perm < 1 or not 0 < alpha < 1:
        raise ValueError(f"need n_perm >= 1 and 0 < alpha < 1, got {n_perm}, {alpha}")
    usable = [row for row in rows if isinstance(row.get(reward), (int, float))
              and not isinstance(row.get(reward), bool) and math.isfinite(row[reward])]
    keys = [str(row.get("scenario_id") if row.get("scenario_id") is not None
                else row.get("prompt")) for row in usable]
    group_index = {key: i for i, key in enumerate(dict.fromkeys(keys))}
    all_groups = np.array([group_index[key] for key in keys], dtype=int)
    values = np.array([float(row[reward]) for row in usable])
    report = HackScanReport(reward, len(usable), len(group_index), 0, n_perm, alpha,
                            list(endorsed), [], [], [], None, True)
    if not usable:
        report.warnings.append(f"no row has a numeric {reward!r} field")
        return report
    spread = np.zeros(len(group_index))
    np.maximum.at(spread, all_groups, values)
    low = np.full(len(group_index), np.inf)
    np.minimum.at(low, all_groups, values)
    varied = np.flatnonzero(spread - low > 1e-12)
    report.n_groups_with_variance = len(varied)
    if not len(varied):
        return report
    report.degenerate = False
    keep = np.isin(all_groups, varied)
    kept_rows = [row for row, flag in zip(usable, keep, strict=True) if flag]
    groups = np.searchsorted(varied, all_groups[keep])
    n_groups = len(varied)
    if n_groups < min_groups:
        report.warnings.append(f"only {n_groups} group(s) with reward variance; a feature needs "
                               f"{min_groups} to be flagged")
    columns = build_features(kept_rows, tokens=tokens, features=features, max_words=max_words)
    centred_reward = _centre(values[keep], groups, n_groups)
    names = list(columns)
    centred = _centre(np.column_stack([columns[n] for n in names]), groups, n_groups)
    varying = np.linalg.norm(centred, axis=0) > 1e-9
    names = [n for n, ok in zip(names, varying, strict=True) if ok]
    centred = centred[:, varying]
    is_endorsed = [_is_endorsed(name, endorsed) for name in names]
    kept, aliases = _collapse_aliases(names, centred, is_endorsed)
    for index in list(kept):
        if any(_is_endorsed(alias.lstrip("-"), endorsed) for alias in aliases[index]):
            is_endorsed[index] = True
    names = [names[i] for i in kept]
    alias_lists = [aliases[i] for i in kept]
    is_endorsed = [is_endorsed[i] for i in kept]
    centred = centred[:, kept]
    report.endorsed_matched = [n for n, e in zip(names, is_endorsed, strict=True) if e]
    if endorsed and not report.endorsed_matched:
        report.warnings.append(f"no feature matches endorsed {list(endorsed)}")

    unit, norms = _unit_columns(centred)
    reward_norm = float(np.linalg.norm(centred_reward))
    marginal = unit.T @ centred_reward / reward_norm
    slope = centred.T @ centred_reward / norms**2
    group_counts = [
        len(np.unique(groups[np.abs(centred[:, j]) > 1e-12])) for j in range(len(names))
    ]
    # bool even when empty (no feature varies within a group: replies that differ only in
    # a number): an empty float array cannot be and-ed with a mask
    eligible = np.array([count >= min_groups for count in group_counts], dtype=bool)
    endorsed_mask = np.array(is_endorsed, dtype=bool)
    rng = np.random.default_rng(seed)
    statistic = marginal.copy()
    floors = np.zeros(len(names))
    p_values = np.ones(len(names))

    def test(family: np.ndarray, observed: np.ndarray, shuffled: np.ndarray) -> None:
        members = family & eligible
        if members.any():
            floor, p = _floor_and_p(observed[members], shuffled[:, members], alpha)
            floors[members], p_values[members] = floor, p
        statistic[family] = observed[family]

    shuffled_reward = _shuffled_within_groups(centred_reward, groups, n_perm, rng)
    if endorsed_mask.any():
        test(endorsed_mask, marginal, shuffled_reward @ unit / reward_norm)
        basis = np.linalg.svd(centred[:, endorsed_mask], full_matrices=False)[0]
        singular = np.linalg.svd(centred[:, endorsed_mask], compute_uv=False)
        basis = basis[:, singular > 1e-9 * singular.max()]
        residual_reward = centred_reward - basis @ (basis.T @ centred_reward)
        residual_features = centred - basis @ (basis.T @ centred)
        residual_norm = float(np.linalg.norm(residual_reward))
        explained = np.linalg.norm(residual_features, axis=0) <= 1e-6 * norms
        partial_unit, _ = _unit_columns(np.where(explained, 0.0, residual_features))
        if residual_norm > 1e-9 * reward_norm:
            partial = partial_unit.T @ residual_reward / residual_norm
            shuffled_residual = _shuffled_within_groups(residual_reward, groups, n_perm, rng)
            test(~endorsed_mask & ~explained, partial,
                 shuffled_residual @ partial_unit / residual_norm)
        statistic[~endorsed_mask & explained] = 0.0
        if residual_norm <= 1e-9 * reward_norm:
            statistic[~endorsed_mask] = 0.0
            report.warnings.append("the endorsed features explain all of the reward variance")
    else:
        test(np.ones(len(names), dtype=bool), marginal, shuffled_reward @ unit / reward_norm)

    results = [
        FeatureResult(
            name=name, statistic=float(statistic[j]), marginal=float(marginal[j]),
            slope=float(slope[j]), floor=float(floors[j]), p_value=float(p_values[j]),
            flagged=bool(eligible[j] and floors[j] > 0 and abs(statistic[j]) > floors[j]),
            direction="+" if statistic[j] >= 0 else "-", n_groups=group_counts[j],
            endorsed=bool(is_endorsed[j]), aliases=alias_lists[j],
        )
        for j, name in enumerate(names)
    ]
    # ties (aliases after adjustment) go to endorsed, then to the earlier in scan order
    position = {name: j for j, name in enumerate(names)}
    results.sort(key=lambda r: (-round(abs(r.statistic), 12), not r.endorsed, position[r.name]))
    report.features = results
    report.flagged = [r.name for r in results if r.flagged]
    report.top_unendorsed = next((r.name for r in results if r.flagged and not r.endorsed), None)
    return report
