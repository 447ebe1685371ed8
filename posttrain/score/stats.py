"""Statistics primitives for evaluation reports: pure functions, no I/O, no scipy.

Everything here works on plain sequences of floats. The scoring modules
(``passat``, ``delta``) decide *what* the units are; by project convention the unit
of analysis is the scenario, so "values" below are usually per-scenario means.

Conventions (decided once, pinned in ``tests/test_stats.py`` against the worked
numbers of ``reference/dashboards-stats-style.md`` B.8):

- Standard errors use the sample variance (ddof=1) unless a function says otherwise.
- The clustered SE of a pooled mean is the sandwich form with inspect_ai's finite-cluster
  correction C/(C-1). Our reports compute per-scenario means first and take the ddof=1 SE
  across scenarios; with equal cluster sizes the two coincide exactly.
- Randomness (bootstrap, sign-flip test) comes from ``numpy.random.default_rng(seed)``
  (PCG64): the same seed and the same inputs give the same numbers.
- Percentile intervals take order statistics of the sorted replicates:
  lower = sorted[floor(B * (1 - level) / 2)], upper = sorted[ceil(B * (1 + level) / 2) - 1],
  the rule the reference SDK uses (with B = 2000: the 51st and the 1950th replicate).
- Quantiles of the normal and Student-t distributions are computed here (Acklam's rational
  approximation polished by one Halley step; the t quantile by bisection on a t tail
  written with the regularized incomplete beta function), accurate to ~1e-13.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

import numpy as np

#: the two-sided 95% normal quantile, Phi^-1(0.975); every 95% interval uses this value
Z95 = 1.959963984540054

# Bootstrap and permutation replicates are drawn in blocks of at most this many numbers,
# so memory stays bounded (~32 MB) whatever the number of scenarios.
_BLOCK_ELEMENTS = 4_000_000


# --- distributions -------------------------------------------------------------------


def normal_cdf(x: float) -> float:
    """Standard normal cumulative probability Phi(x)."""
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


# Coefficients of Acklam's rational approximation to the normal quantile.
_ACKLAM_A = (-3.969683028665376e01, 2.209460984245205e02, -2.759285104469687e02,
             1.383577518672690e02, -3.066479806614716e01, 2.506628277459239e00)
_ACKLAM_B = (-5.447609879822406e01, 1.615858368580409e02, -1.556989798598866e02,
             6.680131188771972e01, -1.328068155288572e01)
_ACKLAM_C = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e00,
             -2.549732539343734e00, 4.374664141464968e00, 2.938163982698783e00)
_ACKLAM_D = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00,
             3.754408661907416e00)
_ACKLAM_P_LOW = 0.02425
# From this many degrees of freedom on, the t quantile uses its normal expansion.
_LARGE_DF = 1000.0


def _polynomial(coefficients: Sequence[float], x: float) -> float:
    result = 0.0
    for coefficient in coefficients:
        result = result * x + coefficient
    return result


def normal_quantile(p: float) -> float:
    """Inverse standard normal CDF: the z with Phi(z) = p, for 0 < p < 1.

    Acklam's approximation (relative error 1.15e-9) followed by one Halley step
    against ``math.erfc``, which brings it to double precision.
    Raises ValueError outside (0, 1).
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"normal_quantile: p must be in (0, 1), got {p!r}")
    if p > 0.5:
        # 1 - p is exact here, and the refinement below is precise only in the lower half
        # (Phi(x) - p cancels catastrophically near 1).
        return -normal_quantile(1.0 - p)
    if p < _ACKLAM_P_LOW:
        q = math.sqrt(-2.0 * math.log(p))
        x = _polynomial(_ACKLAM_C, q) / (_polynomial(_ACKLAM_D, q) * q + 1.0)
    else:
        q = p - 0.5
        r = q * q
        x = _polynomial(_ACKLAM_A, r) * q / (_polynomial(_ACKLAM_B, r) * r + 1.0)
    # Halley refinement: the error of Phi(x) - p divided by the density, with curvature.
    error = normal_cdf(x) - p
    step = error * math.sqrt(2.0 * math.pi) * math.exp(x * x / 2.0)
    return x - step / (1.0 + x * step / 2.0)


def _incomplete_beta_fraction(a: float, b: float, x: float) -> float:
    """Continued fraction of I_x(a, b) (modified Lentz), valid for x < (a+1)/(a+b+2)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 10_000):
        m2 = 2 * m
        for numerator in (m * (b - m) * x / ((a + m2 - 1.0) * (a + m2)),
                          -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1.0))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1.0) < 1e-16:
            break
    return result


def regularized_incomplete_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, for a, b > 0 and 0 <= x <= 1."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"regularized_incomplete_beta: x must be in [0, 1], got {x!r}")
    if x in (0.0, 1.0):
        return x
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                 + a * math.log(x) + b * math.log1p(-x))
    front = math.exp(log_front)
    # The continued fraction converges fast only on one side of the mean; use symmetry.
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _incomplete_beta_fraction(a, b, x) / a
    return 1.0 - front * _incomplete_beta_fraction(b, a, 1.0 - x) / b


def student_t_upper_tail(t: float, df: float) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom (df > 0, any real t)."""
    if df <= 0:
        raise ValueError(f"student_t_upper_tail: df must be positive, got {df!r}")
    if t < 0:
        return 1.0 - student_t_upper_tail(-t, df)
    t2 = t * t
    if t2 < df:
        # Near the centre write the tail through the central mass: better precision.
        central = regularized_incomplete_beta(0.5, df / 2.0, t2 / (df + t2))
        return 0.5 * (1.0 - central)
    return 0.5 * regularized_incomplete_beta(df / 2.0, 0.5, df / (df + t2))


def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p for Student's t with ``df`` degrees of freedom.

    Bisection on the upper tail to full double precision (about 60 halvings), so it is
    robust for any df > 0, including df = 1 (Cauchy). From df = 1000 on, the log-gamma
    terms of the beta function cancel badly, so the Cornish-Fisher expansion around the
    normal quantile (Abramowitz & Stegun 26.7.5) is used instead; both agree to ~1e-13
    there. Raises ValueError for p outside (0, 1) or df <= 0.
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"t_quantile: p must be in (0, 1), got {p!r}")
    if df <= 0:
        raise ValueError(f"t_quantile: df must be positive, got {df!r}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    if p == 0.5:
        return 0.0
    if df >= _LARGE_DF:
        return _t_quantile_expansion(p, df)
    tail = 1.0 - p
    low, high = 0.0, max(1.0, normal_quantile(p))
    while student_t_upper_tail(high, df) > tail:
        low, high = high, 2.0 * high
    for _ in range(200):
        middle = 0.5 * (low + high)
        if middle in (low, high):
            break
        if student_t_upper_tail(middle, df) > tail:
            low = middle
        else:
            high = middle
    return 0.5 * (low + high)


def _t_quantile_expansion(p: float, df: float) -> float:
    x = normal_quantile(p)
    x2 = x * x
    g1 = (x2 + 1) * x / 4
    g2 = ((5 * x2 + 16) * x2 + 3) * x / 96
    g3 = (((3 * x2 + 19) * x2 + 17) * x2 - 15) * x / 384
    g4 = ((((79 * x2 + 776) * x2 + 1482) * x2 - 1920) * x2 - 945) * x / 92160
    return x + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4


def t_critical(df: float, level: float = 0.95) -> float:
    """Two-sided critical value: the t_{(1+level)/2, df} quantile (df=9 -> 2.2622)."""
    return t_quantile((1.0 + level) / 2.0, df)


# --- means, standard errors, intervals -------------------------------------------------


def mean(values: Sequence[float]) -> float:
    """Arithmetic mean; ValueError on an empty sequence."""
    if len(values) == 0:
        raise ValueError("mean: no values")
    return float(np.mean(np.asarray(values, dtype=float)))


def standard_error(values: Sequence[float], ddof: int = 1) -> float:
    """SE of the mean, sd(values, ddof) / sqrt(n). NaN when n <= ddof."""
    array = np.asarray(values, dtype=float)
    if array.size <= ddof:
        return math.nan
    return float(np.std(array, ddof=ddof) / math.sqrt(array.size))


def clustered_se(values: Sequence[float], clusters: Sequence[Hashable], *,
                 finite_cluster_correction: bool = True) -> float:
    """Cluster-robust SE of the pooled item mean (sandwich form, Miller 2024 App. A).

    SE^2 = (1/n^2) * sum over clusters of (sum of the cluster's deviations from the grand
    mean)^2, multiplied by C/(C-1) when ``finite_cluster_correction`` (inspect_ai's choice
    and ours). With equal cluster sizes the corrected value equals ``standard_error`` of
    the per-cluster means. NaN with fewer than 2 clusters (no spread to measure).
    """
    array = np.asarray(values, dtype=float)
    if array.size != len(clusters):
        raise ValueError(f"clustered_se: {array.size} values but {len(clusters)} cluster labels")
    deviation_sums: dict[Hashable, float] = {}
    grand_mean = float(array.mean()) if array.size else math.nan
    for value, cluster in zip(array, clusters, strict=True):
        deviation_sums[cluster] = deviation_sums.get(cluster, 0.0) + (value - grand_mean)
    n_clusters = len(deviation_sums)
    if n_clusters < 2:
        return math.nan
    variance = sum(s * s for s in deviation_sums.values()) / array.size**2
    if finite_cluster_correction:
        variance *= n_clusters / (n_clusters - 1)
    return math.sqrt(variance)


def ideal_bootstrap_se(values: Sequence[float]) -> float:
    """The B -> infinity bootstrap SE of a mean: sd(values, ddof=0) / sqrt(n).

    Smaller than the ddof=1 SE by sqrt((n-1)/n); useful to sanity-check a bootstrap.
    """
    return standard_error(values, ddof=0)


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for ``successes`` out of ``n`` independent trials.

    Clamped to [0, 1] (the bounds at 0/n and n/n come out as +-1e-17 otherwise).
    Valid for one sample per independent unit; not for clustered data.
    """
    if n <= 0:
        raise ValueError(f"wilson_interval: n must be positive, got {n}")
    if not 0 <= successes <= n:
        raise ValueError(f"wilson_interval: successes must be in [0, {n}], got {successes}")
    p_hat = successes / n
    z2 = z * z
    denominator = 1.0 + z2 / n
    centre = (p_hat + z2 / (2 * n)) / denominator
    half_width = (z / denominator) * math.sqrt(p_hat * (1 - p_hat) / n + z2 / (4 * n * n))
    return max(0.0, centre - half_width), min(1.0, centre + half_width)


def clopper_pearson_upper(successes: int, n: int, level: float = 0.95) -> float:
    """The exact (Clopper-Pearson) one-sided upper bound of a rate seen as ``successes``
    of ``n`` independent trials: the largest rate under which so few successes still
    happen with probability ``1 - level``. 0 of n gives ``1 - (1 - level) ** (1 / n)``
    (about 3/n at 95%, the "rule of three"); n of n gives 1. Conservative: the true rate
    is under it at least ``level`` of the time."""
    if n <= 0:
        raise ValueError(f"clopper_pearson_upper: n must be positive, got {n}")
    if not 0 <= successes <= n:
        raise ValueError(f"clopper_pearson_upper: successes must be in [0, {n}], "
                         f"got {successes}")
    if not 0 < level < 1:
        raise ValueError(f"clopper_pearson_upper: level must be in (0, 1), got {level}")
    if successes == n:
        return 1.0
    if successes == 0:  # closed form; the bisection below agrees to its tolerance
        return 1.0 - (1.0 - level) ** (1.0 / n)
    # P(X <= successes; n, p) = 1 - I_p(successes + 1, n - successes), decreasing in p:
    # the bound is where it falls to 1 - level
    low, high = successes / n, 1.0
    for _ in range(60):
        middle = (low + high) / 2
        if regularized_incomplete_beta(successes + 1, n - successes, middle) < level:
            low = middle
        else:
            high = middle
    return high


def t_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float] | None:
    """mean +- t_{n-1} * SE (ddof=1): the small-sample interval of a mean.

    For paired differences this is the paired t interval. None with fewer than 2 values.
    """
    if len(values) < 2:
        return None
    centre = mean(values)
    half_width = t_critical(len(values) - 1, level) * standard_error(values)
    return centre - half_width, centre + half_width


# --- resampling ------------------------------------------------------------------------


def _block_rows(n_draws: int, width: int) -> int:
    return max(1, min(n_draws, _BLOCK_ELEMENTS // max(1, width)))


def bootstrap_means(values: Sequence[float], *, n_boot: int = 2000, seed: int = 0) -> np.ndarray:
    """``n_boot`` means of resamples (with replacement) of ``values``.

    Each value is one cluster (for us: one scenario's mean), so this is the cluster
    bootstrap. Deterministic for a seed (``numpy.random.default_rng(seed)``).
    """
    array = np.asarray(values, dtype=float)
    if array.size == 0:
        raise ValueError("bootstrap_means: no values")
    if n_boot < 1:
        raise ValueError(f"bootstrap_means: n_boot must be at least 1, got {n_boot}")
    rng = np.random.default_rng(seed)
    out = np.empty(n_boot)
    rows = _block_rows(n_boot, array.size)
    for start in range(0, n_boot, rows):
        stop = min(n_boot, start + rows)
        indices = rng.integers(0, array.size, size=(stop - start, array.size))
        out[start:stop] = array[indices].mean(axis=1)
    return out


def percentile_interval(replicates: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of bootstrap replicates by the order-statistic rule above."""
    ordered = np.sort(np.asarray(replicates, dtype=float))
    count = ordered.size
    if count == 0:
        raise ValueError("percentile_interval: no replicates")
    # round() first so that 0.975 * 2000 lands on 1950, not 1950.0000000000002.
    low_index = math.floor(round(count * (1.0 - level) / 2.0, 9))
    high_index = math.ceil(round(count * (1.0 + level) / 2.0, 9)) - 1
    low_index = min(max(low_index, 0), count - 1)
    high_index = min(max(high_index, low_index), count - 1)
    return float(ordered[low_index]), float(ordered[high_index])


def bootstrap_interval(values: Sequence[float], *, n_boot: int = 2000, seed: int = 0,
                       level: float = 0.95) -> tuple[float, float]:
    """Seeded percentile bootstrap interval of the mean of ``values`` (one per cluster)."""
    return percentile_interval(bootstrap_means(values, n_boot=n_boot, seed=seed), level)


def sign_flip_p_value(differences: Sequence[float], *, n_perm: int = 2000,
                      seed: int = 0) -> float:
    """Two-sided sign-flip permutation p-value for "the mean difference is 0".

    Under the null each paired difference is as likely to have either sign, so we flip
    signs at random ``n_perm`` times and count resamples whose |mean| is at least the
    observed |mean|. Returns (extreme + 1) / (n_perm + 1): never 0, valid for any n_perm.
    All-zero differences give 1.0.
    """
    array = np.asarray(differences, dtype=float)
    if array.size == 0:
        raise ValueError("sign_flip_p_value: no differences")
    observed = abs(float(array.mean()))
    # Tolerance: a resample that reproduces the observed mean must count as extreme even
    # when float summation order makes it differ in the last bit.
    threshold = observed - 1e-12 * max(1.0, observed)
    rng = np.random.default_rng(seed)
    extreme = 0
    rows = _block_rows(n_perm, array.size)
    for start in range(0, n_perm, rows):
        stop = min(n_perm, start + rows)
        signs = rng.integers(0, 2, size=(stop - start, array.size)) * 2 - 1
        extreme += int(np.count_nonzero(np.abs((signs * array).mean(axis=1)) >= threshold))
    return (extreme + 1) / (n_perm + 1)


# --- pass@k ----------------------------------------------------------------------------


def _check_counts(n: int, c: int, k: int, name: str) -> None:
    if not 0 <= c <= n:
        raise ValueError(f"{name}: correct count c={c} must be in [0, n={n}]")
    if not 1 <= k <= n:
        raise ValueError(f"{name}: k={k} must be in [1, n={n}] (need at least k samples)")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021): chance at least one of k draws passes.

    1 - C(n-c, k) / C(n, k), computed as the stable product 1 - prod_{j=n-c+1}^{n} (1 - k/j);
    exactly 1.0 when n - c < k. ``n`` samples of which ``c`` passed, 1 <= k <= n.
    """
    _check_counts(n, c, k, "pass_at_k")
    if n - c < k:
        return 1.0
    product = 1.0
    for j in range(n - c + 1, n + 1):
        product *= 1.0 - k / j
    return 1.0 - product


def pass_pow_k(n: int, c: int, k: int) -> float:
    """Unbiased pass^k (tau-bench): chance all of k draws pass, C(c, k) / C(n, k)."""
    _check_counts(n, c, k, "pass_pow_k")
    product = 1.0
    for j in range(k):
        product *= (c - j) / (n - j)
    return max(0.0, product)


# --- power -----------------------------------------------------------------------------


def _z_sum(alpha: float, power: float) -> float:
    if not 0.0 < alpha < 1.0 or not 0.0 < power < 1.0:
        raise ValueError(f"alpha and power must be in (0, 1), got {alpha!r}, {power!r}")
    return normal_quantile(1.0 - alpha / 2.0) + normal_quantile(power)


def scenarios_needed(effect: float, sd_diff: float, alpha: float = 0.05,
                     power: float = 0.8) -> int:
    """Paired scenarios needed to detect a mean difference ``effect`` (Miller 2024).

    n = ceil(((z_{1-alpha/2} + z_power) * sd_diff / effect)^2), where ``sd_diff`` is the
    standard deviation of per-scenario differences. Two-sided test at ``alpha``.
    """
    if effect == 0:
        raise ValueError("scenarios_needed: effect must be non-zero")
    n = (_z_sum(alpha, power) * sd_diff / effect) ** 2
    # Round away float dust first so that an exact integer is not bumped up by one.
    return max(1, math.ceil(round(n, 9)))


def detectable_effect(n_scenarios: int, sd_diff: float, alpha: float = 0.05,
                      power: float = 0.8) -> float:
    """Smallest mean difference ``n_scenarios`` paired scenarios detect with ``power``.

    The inverse of ``scenarios_needed``: (z_{1-alpha/2} + z_power) * sd_diff / sqrt(n).
    """
    if n_scenarios < 1:
        raise ValueError(f"detectable_effect: n_scenarios must be positive, got {n_scenarios}")
    return _z_sum(alpha, power) * sd_diff / math.sqrt(n_scenarios)


def sign_test_upper(wins: int, losses: int) -> float:
    """One-sided exact sign test: the chance of at least ``wins`` of ``wins + losses``
    discordant pairs going one way when each way is equally likely (McNemar's exact
    test for paired 0/1 outcomes). 1.0 with no discordant pair."""
    n = wins + losses
    if wins < 0 or losses < 0:
        raise ValueError(f"counts must be >= 0, got {wins}, {losses}")
    if n == 0:
        return 1.0
    return sum(math.comb(n, k) for k in range(wins, n + 1)) / 2**n
