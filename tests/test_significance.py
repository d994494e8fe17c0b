"""Paired tests against values computed by hand, by exact enumeration, or with scipy."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from e2mc.evaluation.significance import (
    bootstrap_difference_ci,
    cohens_d_paired,
    compare_predictions,
    mcnemar_test,
    paired_permutation_test,
    pooled_permutation_test,
)


def correctness(n10: int, n01: int, n11: int = 30, n00: int = 10) -> tuple[np.ndarray, ...]:
    """Fixed paired vectors with the given cell counts (A right/B wrong = n10)."""
    a = np.array([1] * n10 + [0] * n01 + [1] * n11 + [0] * n00)
    b = np.array([0] * n10 + [1] * n01 + [1] * n11 + [0] * n00)
    return a, b


def two_sided_sign_test(n10: int, n01: int) -> float:
    """Exact two-sided binomial p by hand: 2 * P(X >= max) for X ~ Bin(n, 1/2), capped at 1."""
    n, hi = n10 + n01, max(n10, n01)
    tail = sum(math.comb(n, k) for k in range(hi, n + 1)) / 2**n
    return min(1.0, 2 * tail)


def test_mcnemar_exact_matches_hand_binomial():
    a, b = correctness(15, 5)
    res = mcnemar_test(a, b)
    assert (res.n10, res.n01, res.method) == (15, 5, "exact-binomial")
    assert res.p_value == pytest.approx(two_sided_sign_test(15, 5), rel=1e-12)
    assert res.p_value == pytest.approx(0.04138946533203125, rel=1e-12)  # 2*21700/2^20


def test_mcnemar_chi2_matches_formula_and_scipy():
    a, b = correctness(40, 20)
    res = mcnemar_test(a, b)
    stat = (20 - 40) ** 2 / 60
    assert res.method == "chi2"
    assert res.statistic == pytest.approx(stat)
    # chi2 with 1 dof: sf(x) = erfc(sqrt(x / 2))
    assert res.p_value == pytest.approx(math.erfc(math.sqrt(stat / 2)), rel=1e-10)
    cc = mcnemar_test(a, b, continuity=True)
    assert cc.statistic == pytest.approx(19**2 / 60)
    assert cc.p_value == pytest.approx(stats.chi2.sf(19**2 / 60, 1))
    assert cc.p_value > res.p_value


def test_mcnemar_switches_at_25_and_handles_no_discordance():
    assert mcnemar_test(*correctness(13, 12)).method == "chi2"
    assert mcnemar_test(*correctness(12, 11)).method == "exact-binomial"
    res = mcnemar_test(*correctness(0, 0))
    assert res.p_value == 1.0
    # Symmetric in which model is better.
    assert mcnemar_test(*correctness(5, 15)).p_value == mcnemar_test(*correctness(15, 5)).p_value


def test_permutation_converges_to_exact_sign_test_on_correctness():
    a, b = correctness(15, 5)
    p = paired_permutation_test(a, b, n_resamples=40_000, seed=1)
    exact = two_sided_sign_test(15, 5)
    # Monte Carlo SE = sqrt(p(1-p)/R) ~ 1e-3
    assert abs(p - exact) < 5e-3


def test_permutation_matches_full_enumeration_on_real_scores():
    rng = np.random.default_rng(0)
    a = rng.normal(0.4, 1, 10)
    b = rng.normal(0.0, 1, 10)
    d = a - b
    obs = abs(d.sum())
    flips = np.array(list(itertools.product([-1, 1], repeat=10)))
    exact = np.mean(np.abs(flips @ d) >= obs - 1e-12)
    p = paired_permutation_test(a, b, n_resamples=40_000, seed=3)
    assert abs(p - exact) < 0.01
    # scipy's randomized paired permutation test agrees as well
    ref = stats.permutation_test((a, b), lambda x, y: np.mean(x - y), permutation_type="samples",
                                 n_resamples=40_000, random_state=0).pvalue
    assert abs(p - ref) < 0.01


def test_permutation_edge_cases():
    a = np.array([1, 0, 1, 1])
    assert paired_permutation_test(a, a) == 1.0
    p = paired_permutation_test(*correctness(200, 0), n_resamples=999, seed=0)
    assert p == pytest.approx(1 / 1000)  # +1 correction: never 0
    assert paired_permutation_test(*correctness(9, 4), seed=5) == \
        paired_permutation_test(*correctness(9, 4), seed=5)
    with pytest.raises(ValueError, match="equal length"):
        paired_permutation_test(np.ones(3), np.ones(4))


def test_cohens_d_paired_formula():
    a = np.array([3.0, 5.0, 4.0, 6.0, 7.0])
    b = np.array([2.0, 5.0, 2.0, 5.0, 4.0])
    d = a - b  # 1, 0, 2, 1, 3 -> mean 1.4, sd sqrt(1.3)
    assert cohens_d_paired(a, b) == pytest.approx(1.4 / math.sqrt(1.3))
    assert cohens_d_paired(b, a) == pytest.approx(-d.mean() / d.std(ddof=1))
    assert cohens_d_paired(a, a) == 0.0


def test_bootstrap_ci_matches_naive_index_resampling():
    a, b = correctness(40, 25, n11=100, n00=35)
    low, high = bootstrap_difference_ci(a, b, n_resamples=20_000, seed=0)
    rng = np.random.default_rng(1)
    idx = rng.integers(0, len(a), size=(20_000, len(a)))
    naive = (a[idx] - b[idx]).mean(axis=1)
    ref_low, ref_high = np.quantile(naive, [0.025, 0.975])
    assert low == pytest.approx(ref_low, abs=0.006)
    assert high == pytest.approx(ref_high, abs=0.006)
    # Normal approximation of the paired difference: mean +- 1.96 * sd(d)/sqrt(n)
    d = a - b
    half = 1.96 * d.std(ddof=1) / math.sqrt(len(d))
    assert (high - low) / 2 == pytest.approx(half, rel=0.08)
    assert low < d.mean() < high


def test_compare_predictions_bundle():
    labels = np.array([0, 1, 2, 0, 1, 2, 0, 1])
    pa = np.array([0, 1, 2, 0, 1, 2, 0, 0])  # 7/8
    pb = np.array([0, 0, 2, 1, 1, 2, 0, 0])  # 5/8
    out = compare_predictions(pa, pb, labels, n_resamples=500)
    assert out["acc_a"] == pytest.approx(87.5) and out["acc_b"] == pytest.approx(62.5)
    assert out["difference"] == pytest.approx(25.0)
    assert (out["n10"], out["n01"]) == (2, 0)
    assert out["mcnemar_p"] == pytest.approx(0.5)  # 2 * (1/2)^2
    with pytest.raises(ValueError, match="equal shapes"):
        compare_predictions(pa, pb[:-1], labels)


def test_pooled_permutation_reduces_to_the_paired_test_for_one_or_identical_repeats():
    rng = np.random.default_rng(4)
    a, b = rng.integers(0, 2, 300), rng.integers(0, 2, 300)
    single = paired_permutation_test(a, b, n_resamples=2000, seed=1)
    diff, p = pooled_permutation_test([(a, b)], n_resamples=2000, seed=1)
    assert p == single and diff == pytest.approx(a.mean() - b.mean())
    assert pooled_permutation_test([(a, b)] * 3, n_resamples=2000, seed=1)[1] == single


def test_pooled_permutation_uses_the_evidence_of_every_repeat():
    # Three repeats on the same 300 items, each discordant on its own 10 items (8 for A, 2
    # for B): alone each is the exact sign test of 8 vs 2 (p = 0.109); pooled, each item's mean
    # difference is +-1/3 on 30 items, i.e. the exact sign test of 24 vs 6 (p = 0.0014).
    pairs = []
    for r in range(3):
        a, b = np.zeros(300), np.zeros(300)
        items = np.arange(10 * r, 10 * r + 10)
        a[items[:8]], b[items[8:]] = 1, 1
        pairs.append((a, b))
        assert paired_permutation_test(a, b, n_resamples=20_000) > 0.09
    diff, p = pooled_permutation_test(pairs, n_resamples=20_000)
    assert diff == pytest.approx(18 / 3 / 300)
    assert p == pytest.approx(stats.binomtest(24, 30).pvalue, abs=0.0015)


def test_pooled_permutation_rejects_mismatched_repeats():
    with pytest.raises(ValueError, match="at least one"):
        pooled_permutation_test([])
    with pytest.raises(ValueError, match="same items"):
        pooled_permutation_test([(np.ones(5), np.zeros(5)), (np.ones(6), np.zeros(6))])
