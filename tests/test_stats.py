"""Pins for posttrain.score.stats.

Unless a comment says otherwise, every number below is a worked example from
shared/reference/dashboards-stats-style.md, section B.8 ("B.8.n" = item n), and guards
against a wrong convention (ddof, z value, correction factor, estimator form).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from posttrain.score import stats

TIGHT = 1e-12  # B.8: "tolerance 1e-12 relative unless noted"


def close(actual: float, expected: float, tolerance: float = TIGHT) -> bool:
    return math.isclose(actual, expected, rel_tol=tolerance, abs_tol=tolerance)


# --- quantiles -------------------------------------------------------------------------


def test_normal_quantile_matches_the_z_every_interval_uses():
    # B.8 preamble: z = Phi^-1(0.975) = 1.959963984540054
    assert close(stats.normal_quantile(0.975), 1.959963984540054)
    assert close(stats.Z95, stats.normal_quantile(0.975))


def test_normal_quantile_power_constant():
    # B.5: (z_.975 + z_.80)^2 = 7.848879734349088, the constant behind every power number
    z_sum = stats.normal_quantile(0.975) + stats.normal_quantile(0.8)
    assert close(z_sum**2, 7.848879734349088)


def test_normal_quantile_is_symmetric_and_inverts_the_cdf_in_the_tails():
    # guards the tail branches of Acklam's approximation (not only the central one)
    for p in (1e-12, 1e-6, 0.001, 0.02, 0.3, 0.5):
        upper = 1 - p
        z = stats.normal_quantile(1 - upper)  # the exact mirror of ``upper``
        assert stats.normal_quantile(upper) == -z
        assert close(stats.normal_cdf(z), 1 - upper, 1e-12)
    with pytest.raises(ValueError):
        stats.normal_quantile(1.0)


@pytest.mark.parametrize(("df", "expected"), [
    (2, 4.302652729749462),    # B.8.9 t_{.975,2}
    (4, 2.7764451051977934),   # B.8.9 t_{.975,4}
    (5, 2.5705818356363146),   # B.8.9 t_{.975,5} (also B.8.6)
    (9, 2.262157162798205),    # B.8.9 t_{.975,9} (also B.8.5)
])
def test_t_critical_pins(df, expected):
    # the brief asks for 1e-9; we hold 1e-12
    assert close(stats.t_critical(df), expected)


def test_t_quantile_closed_forms_for_one_and_two_degrees_of_freedom():
    # independent check (not from B.8): df=1 is Cauchy, tan(pi (p - 1/2));
    # df=2 has t = (2p - 1) / sqrt(2 p (1 - p))
    for p in (0.6, 0.9, 0.975, 0.999):
        assert close(stats.t_quantile(p, 1), math.tan(math.pi * (p - 0.5)), 1e-11)
        assert close(stats.t_quantile(p, 2), (2 * p - 1) / math.sqrt(2 * p * (1 - p)), 1e-11)
    assert stats.t_quantile(0.5, 7) == 0.0
    assert close(stats.t_quantile(0.025, 9), -2.262157162798205)


def test_t_quantile_approaches_the_normal_quantile_for_large_df():
    # continuity across the switch to the large-df expansion, and the limit
    assert abs(stats.t_critical(999) - stats.t_critical(1000)) < 1e-5
    assert close(stats.t_critical(10**9), stats.Z95, 1e-8)


# --- Wilson ------------------------------------------------------------------------------


@pytest.mark.parametrize(("successes", "n", "expected"), [
    (9, 100, (0.04807254000256516, 0.1622621285271631)),    # B.8.1
    (0, 20, (0.0, 0.16112515805281938)),                    # B.8.1 (lower bound clamped)
    (20, 20, (0.8388748419471806, 1.0)),                    # B.8.1
    (45, 50, (0.7863976856252035, 0.9565242350681096)),     # B.8.1
    (3, 8, (0.13684428582359737, 0.6942576053973728)),      # B.8.1
])
def test_wilson_interval_pins(successes, n, expected):
    low, high = stats.wilson_interval(successes, n)
    assert close(low, expected[0]) and close(high, expected[1])


def test_wilson_uses_the_exact_z_not_1_96():
    # B.8.1: with z = 1.96 exactly 9/100 gives 0.04807199516388488; we must not
    low, _ = stats.wilson_interval(9, 100)
    assert not close(low, 0.04807199516388488)
    assert close(stats.wilson_interval(9, 100, z=1.96)[0], 0.04807199516388488)


# --- standard errors ---------------------------------------------------------------------

CLUSTER_VALUES = [*[1, 1, 1, 0], *[0, 0, 1], *[1, 0, 0, 0, 0]]  # B.8.3 clusters A, B, C
CLUSTER_LABELS = ["A"] * 4 + ["B"] * 3 + ["C"] * 5


def test_naive_standard_errors_of_the_cluster_example():
    # B.8.3: naive SE ddof=1 0.1486470975026408; ddof=0 (Bernoulli form) 0.14231876063832777
    assert close(stats.standard_error(CLUSTER_VALUES), 0.1486470975026408)
    assert close(stats.standard_error(CLUSTER_VALUES, ddof=0), 0.14231876063832777)


def test_clustered_se_sandwich_with_and_without_correction():
    # B.8.3: sandwich 0.14467129622221983; with C/(C-1) (inspect_ai) 0.17718542808573712
    plain = stats.clustered_se(CLUSTER_VALUES, CLUSTER_LABELS, finite_cluster_correction=False)
    assert close(plain, 0.14467129622221983)
    assert close(stats.clustered_se(CLUSTER_VALUES, CLUSTER_LABELS), 0.17718542808573712)


def test_clustered_se_inspect_ai_cross_implementation_pin():
    # B.8.3: values 0..19, cluster = i mod 4 -> inspect 0.6454972243679028, sandwich
    # 0.5590169943749475, naive 1.3228756555322954 (clustering lowers the SE here)
    values = list(range(20))
    labels = [i % 4 for i in values]
    assert close(stats.clustered_se(values, labels), 0.6454972243679028)
    assert close(stats.clustered_se(values, labels, finite_cluster_correction=False),
                 0.5590169943749475)
    assert close(stats.standard_error(values), 1.3228756555322954)


def test_clustered_se_needs_two_clusters():
    assert math.isnan(stats.clustered_se([1, 0, 1], ["a", "a", "a"]))


# B.8.4: K = 4 samples per prompt, correct counts [4, 3, 0, 2, 1], P = 5
K_COUNTS = [4, 3, 0, 2, 1]
K_POOLED = [1.0 if k < c else 0.0 for c in K_COUNTS for k in range(4)]
K_PROMPTS = [p for p in range(5) for _ in range(4)]


def test_k_samples_per_prompt_means_first_equals_corrected_clustered_se():
    # B.8.4: SE over prompt means 0.1767766952966369 == clustered SE with P/(P-1) on the 20
    # pooled items: the convention pass_at reports as se_clustered
    prompt_means = [c / 4 for c in K_COUNTS]
    assert close(stats.mean(prompt_means), 0.5)
    assert close(stats.standard_error(prompt_means), 0.1767766952966369)
    assert close(stats.clustered_se(K_POOLED, K_PROMPTS), 0.1767766952966369)


def test_k_samples_per_prompt_other_conventions():
    # B.8.4: sandwich without correction 0.15811388300841897; naive i.i.d. 0.11470786693528086
    assert close(stats.clustered_se(K_POOLED, K_PROMPTS, finite_cluster_correction=False),
                 0.15811388300841897)
    assert close(stats.standard_error(K_POOLED), 0.11470786693528086)


def test_ideal_bootstrap_se_equals_exhaustive_enumeration():
    # B.8.7: all 27 resamples of [0, 1, 1] -> SE 0.2721655269759087 = sd(ddof=0)/sqrt(3),
    # versus CLT ddof=1 0.33333333333333337
    data = [0, 1, 1]
    resample_means = [sum(r) / 3 for r in itertools.product(data, repeat=3)]
    assert close(float(np.std(resample_means)), 0.2721655269759087)
    assert close(stats.ideal_bootstrap_se(data), 0.2721655269759087)
    assert close(stats.standard_error(data), 0.33333333333333337)


# --- paired differences (B.8.5, B.8.6) ---------------------------------------------------

BEFORE_5 = [1, 0, 1, 1, 0, 0, 1, 0, 1, 0]
AFTER_5 = [1, 1, 1, 1, 0, 1, 1, 0, 1, 1]
DIFFS_5 = [a - b for a, b in zip(AFTER_5, BEFORE_5, strict=True)]


def test_paired_example_5_standard_errors():
    # B.8.5: d = 0.3, paired SE 0.15275252316519466, unpaired 0.21343747458109497,
    # ideal paired-bootstrap SE 0.14491376746189438
    assert close(stats.mean(DIFFS_5), 0.3)
    assert close(stats.standard_error(DIFFS_5), 0.15275252316519466)
    unpaired = math.hypot(stats.standard_error(BEFORE_5), stats.standard_error(AFTER_5))
    assert close(unpaired, 0.21343747458109497)
    assert close(stats.ideal_bootstrap_se(DIFFS_5), 0.14491376746189438)


def test_paired_example_5_normal_versus_t_interval():
    # B.8.5: normal CI (0.0006105560485981654, 0.5993894439514018) excludes 0,
    # t_9 CI (-0.04555021441364382, 0.6455502144136438) covers it
    se = stats.standard_error(DIFFS_5)
    assert close(0.3 - stats.Z95 * se, 0.0006105560485981654, 1e-9)
    assert close(0.3 + stats.Z95 * se, 0.5993894439514018)
    low, high = stats.t_interval(DIFFS_5)
    assert close(low, -0.04555021441364382, 1e-11) and close(high, 0.6455502144136438)


def test_paired_example_6_with_four_samples_per_prompt():
    # B.8.6: counts out of 4 -> d = [0.5, 0, 0.25, 0, 0.25, 0.25], mean 0.20833333333333334,
    # paired SE 0.0768295371441074, t_5 CI (0.010836720710345332, 0.4058299459563214),
    # unpaired SE 0.19454362549881254
    before = [c / 4 for c in (1, 2, 0, 4, 3, 1)]
    after = [c / 4 for c in (3, 2, 1, 4, 4, 2)]
    diffs = [a - b for a, b in zip(after, before, strict=True)]
    assert close(stats.mean(diffs), 0.20833333333333334)
    assert close(stats.standard_error(diffs), 0.0768295371441074)
    assert close(math.hypot(stats.standard_error(before), stats.standard_error(after)),
                 0.19454362549881254)
    low, high = stats.t_interval(diffs)
    assert close(low, 0.010836720710345332, 1e-11) and close(high, 0.4058299459563214)


def test_sign_flip_p_value_approaches_the_exact_test_of_example_5():
    # B.8.5: 3 discordant pairs all one way -> exact McNemar p = 0.25; the exact sign-flip
    # test gives the same (2 of 8 sign patterns are as extreme). Monte Carlo SE ~0.003.
    p = stats.sign_flip_p_value(DIFFS_5, n_perm=20_000, seed=0)
    assert abs(p - 0.25) < 0.015


def test_sign_flip_p_value_edges():
    # all-zero differences: nothing to explain, p = 1
    assert stats.sign_flip_p_value([0.0] * 8) == 1.0
    # 20 identical gains: only 2 of 2^20 sign patterns are as extreme, so p is the floor
    assert stats.sign_flip_p_value([1.0] * 20, n_perm=999) == 1 / 1000


def test_sign_flip_p_value_is_deterministic_for_a_seed():
    diffs = [0.5, -0.25, 0.25, 0.0, 0.75, -0.5, 0.25]
    assert stats.sign_flip_p_value(diffs, seed=3) == stats.sign_flip_p_value(diffs, seed=3)


# --- bootstrap ---------------------------------------------------------------------------


def test_bootstrap_interval_is_deterministic_for_a_seed():
    values = [0.1, 0.4, 0.35, 0.8, 0.0, 1.0, 0.5, 0.25]
    first = stats.bootstrap_interval(values, n_boot=2000, seed=7)
    assert stats.bootstrap_interval(values, n_boot=2000, seed=7) == first
    assert stats.bootstrap_interval(values, n_boot=2000, seed=8) != first


def test_bootstrap_interval_brackets_the_mean_and_its_se_matches_theory():
    # the bootstrap SE converges to the ideal sd(ddof=0)/sqrt(n) (B.7)
    values = [c / 4 for c in K_COUNTS] * 4
    replicates = stats.bootstrap_means(values, n_boot=20_000, seed=1)
    assert abs(float(np.std(replicates)) - stats.ideal_bootstrap_se(values)) < 0.004
    low, high = stats.percentile_interval(replicates)
    assert low < stats.mean(values) < high


def test_percentile_interval_takes_the_documented_order_statistics():
    # with B = 2000 replicates 0..1999 the rule picks the 51st and the 1950th
    assert stats.percentile_interval(list(range(2000))) == (50.0, 1949.0)


def test_bootstrap_memory_blocks_do_not_change_the_numbers():
    # a large input is drawn in blocks; the block size must not leak into the result
    values = np.linspace(0, 1, 3000)
    replicates = stats.bootstrap_means(values, n_boot=1500, seed=2)
    rng = np.random.default_rng(2)
    direct = values[rng.integers(0, 3000, size=(1500, 3000))].mean(axis=1)
    assert np.allclose(replicates, direct, rtol=0, atol=1e-15)


# --- pass@k ------------------------------------------------------------------------------


@pytest.mark.parametrize(("n", "c", "k", "expected"), [
    (8, 3, 1, 0.375),                 # B.8.2 (product form gives 0.3749999999999999)
    (8, 3, 2, 0.6428571428571428),    # B.8.2: 9/14 (naive 0.609375)
    (8, 3, 4, 0.9285714285714286),    # B.8.2: 13/14 (naive 0.847412109375)
    (8, 3, 6, 1.0),                   # B.8.2: n - c < k
    (8, 0, 4, 0.0),                   # B.8.2 edge
    (8, 8, 1, 1.0),                   # B.8.2 edge
    (10, 1, 5, 0.5),                  # B.8.2 edge
])
def test_unbiased_pass_at_k(n, c, k, expected):
    assert close(stats.pass_at_k(n, c, k), expected)


@pytest.mark.parametrize(("k", "expected"), [
    (1, 0.375),                  # B.8.2 pass^1
    (2, 0.10714285714285714),    # B.8.2 pass^2 = 3/28
    (4, 0.0),                    # B.8.2 pass^4 with only 3 correct
])
def test_pass_pow_k(k, expected):
    assert close(stats.pass_pow_k(8, 3, k), expected)


def test_pass_at_k_across_four_problems():
    # B.8.2: n=8, k=4, c = [3, 0, 8, 5] -> per problem [13/14, 0, 1, 1],
    # mean 0.7321428571428572, SE (ddof=1) 0.2446276498575538
    per_problem = [stats.pass_at_k(8, c, 4) for c in (3, 0, 8, 5)]
    assert close(stats.mean(per_problem), 0.7321428571428572)
    assert close(stats.standard_error(per_problem), 0.2446276498575538)


def test_pass_at_k_rejects_k_above_n():
    with pytest.raises(ValueError, match="k=5"):
        stats.pass_at_k(4, 2, 5)


# --- power -------------------------------------------------------------------------------


@pytest.mark.parametrize(("effect", "variance", "expected"), [
    (0.03, 0.1, 873),     # B.8.8: Var(d) = 0.1, delta 0.03 -> 872.1 -> 873
    (0.03, 0.5, 4361),    # B.8.8: unpaired-like Var(d) = 0.5
    (0.05, 0.1, 314),     # B.8.8
])
def test_scenarios_needed_pins(effect, variance, expected):
    assert stats.scenarios_needed(effect, math.sqrt(variance)) == expected


def test_detectable_effect_inverts_scenarios_needed():
    # 873 scenarios at Var(d) = 0.1 detect 0.03 (B.8.8), and 872 do not quite
    sd = math.sqrt(0.1)
    assert stats.detectable_effect(873, sd) <= 0.03 < stats.detectable_effect(872, sd)
