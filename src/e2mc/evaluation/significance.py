"""Paired significance tests on per-image scores of models A and B on the same images (paper,
app. C): ``n10`` = A right and B wrong; a positive difference means A is better."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

#: Below this many discordant pairs McNemar uses the exact binomial test.
EXACT_MCNEMAR_BELOW = 25


def _paired(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.ndim != 1 or a.shape != b.shape:
        raise ValueError(f"paired scores must be 1-D arrays of equal length, got {a.shape} "
                         f"and {b.shape}")
    if len(a) == 0:
        raise ValueError("paired scores are empty")
    return a, b


def _binary(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a, b = _paired(a, b)
    if not (np.isin(a, (0, 1)).all() and np.isin(b, (0, 1)).all()):
        raise ValueError("correctness vectors must contain only 0/1 (or booleans)")
    return a.astype(bool), b.astype(bool)


@dataclass(frozen=True)
class McNemarResult:
    n10: int
    n01: int
    statistic: float
    p_value: float
    method: str


def mcnemar_test(correct_a: np.ndarray, correct_b: np.ndarray, exact: bool | None = None,
                 continuity: bool = False) -> McNemarResult:
    """McNemar's test on paired correctness vectors: exact binomial on ``n10`` when ``exact``
    (None: below :data:`EXACT_MCNEMAR_BELOW` discordant pairs), else chi-square (1 dof) on
    ``(n01 - n10)^2 / (n01 + n10)`` (Edwards' ``-1`` with ``continuity``)."""
    a, b = _binary(correct_a, correct_b)
    n10 = int(np.sum(a & ~b))
    n01 = int(np.sum(~a & b))
    n = n10 + n01
    use_exact = n < EXACT_MCNEMAR_BELOW if exact is None else exact
    if n == 0:
        return McNemarResult(n10, n01, 0.0, 1.0, "exact-binomial" if use_exact else "chi2")
    if use_exact:
        p = stats.binomtest(n10, n, 0.5, alternative="two-sided").pvalue
        return McNemarResult(n10, n01, float(n10), float(p), "exact-binomial")
    diff = abs(n01 - n10) - (1.0 if continuity else 0.0)
    stat = max(diff, 0.0) ** 2 / n
    return McNemarResult(n10, n01, float(stat), float(stats.chi2.sf(stat, df=1)),
                         "chi2-continuity" if continuity else "chi2")


def paired_permutation_test(scores_a: np.ndarray, scores_b: np.ndarray,
                            n_resamples: int = 10_000, seed: int = 0,
                            batch: int = 1000) -> float:
    """Two-sided paired sign-flip test of ``mean(a - b) = 0`` with ``n_resamples`` random sign
    vectors: ``p = (1 + #{|sum s*d| >= |sum d|}) / (1 + n_resamples)`` (never 0); zero
    differences are dropped first."""
    a, b = _paired(scores_a, scores_b)
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    d = a - b
    d = d[d != 0]
    if len(d) == 0:
        return 1.0
    observed = abs(d.sum())
    rng = np.random.default_rng(seed)
    hits = 0
    # A relative tolerance so that sums equal to the observed one in exact arithmetic count.
    tol = 1e-9 * max(1.0, observed)
    for start in range(0, n_resamples, batch):
        size = min(batch, n_resamples - start)
        signs = rng.integers(0, 2, size=(size, len(d)), dtype=np.int8) * 2 - 1
        hits += int(np.sum(np.abs(signs @ d) >= observed - tol))
    return (hits + 1) / (n_resamples + 1)


def pooled_permutation_test(pairs: Sequence[tuple[np.ndarray, np.ndarray]],
                            n_resamples: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """``(mean difference a - b, p)``: :func:`paired_permutation_test` on each item's
    difference averaged over the repeats ``pairs`` (one ``(scores_a, scores_b)`` each, same
    items in the same order). The unit is the item: between-repeat variation is not tested."""
    if not pairs:
        raise ValueError("need at least one (scores_a, scores_b) pair")
    a_all, b_all = zip(*(_paired(a, b) for a, b in pairs), strict=True)
    sizes = {len(a) for a in a_all}
    if len(sizes) != 1:
        raise ValueError(f"every repeat must score the same items; got lengths {sorted(sizes)}")
    a_mean, b_mean = np.mean(a_all, axis=0), np.mean(b_all, axis=0)
    return (float(np.mean(a_mean - b_mean)),
            paired_permutation_test(a_mean, b_mean, n_resamples, seed))


def cohens_d_paired(scores_a: np.ndarray, scores_b: np.ndarray) -> float:
    """Cohen's d for paired samples (d_z): ``mean(a - b) / std(a - b, ddof=1)``. Zero when
    the differences are all zero; +-inf when they are constant and non-zero."""
    a, b = _paired(scores_a, scores_b)
    if len(a) < 2:
        raise ValueError("Cohen's d needs at least two pairs")
    d = a - b
    sd = d.std(ddof=1)
    if sd == 0:
        return 0.0 if d.mean() == 0 else float(np.sign(d.mean()) * np.inf)
    return float(d.mean() / sd)


def bootstrap_difference_ci(scores_a: np.ndarray, scores_b: np.ndarray,
                            confidence: float = 0.95, n_resamples: int = 10_000,
                            seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap CI of ``mean(a) - mean(b)`` resampling pairs, drawn as multinomial
    counts over the distinct values of ``a - b`` (exact, and fast for any size)."""
    a, b = _paired(scores_a, scores_b)
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    values, counts = np.unique(a - b, return_counts=True)
    rng = np.random.default_rng(seed)
    draws = rng.multinomial(len(a), counts / len(a), size=n_resamples)
    means = draws @ values / len(a)
    alpha = (1 - confidence) / 2
    low, high = np.quantile(means, [alpha, 1 - alpha])
    return float(low), float(high)


def paired_tests(correct_a: np.ndarray, correct_b: np.ndarray, n_resamples: int = 10_000,
                 seed: int = 0) -> dict[str, Any]:
    """Every paired test of two 0/1 correctness vectors, differences in points (a row of
    ``e2mc compare``'s tests)."""
    mc = mcnemar_test(correct_a, correct_b)
    a, b = _binary(correct_a, correct_b)
    low, high = bootstrap_difference_ci(a, b, n_resamples=n_resamples, seed=seed)
    return {"difference": 100 * float(a.mean() - b.mean()), "n10": mc.n10, "n01": mc.n01,
            "mcnemar_stat": mc.statistic, "mcnemar_p": mc.p_value, "mcnemar_method": mc.method,
            "permutation_p": paired_permutation_test(a, b, n_resamples, seed),
            "cohens_d": cohens_d_paired(a, b), "ci95_low": 100 * low, "ci95_high": 100 * high}


def compare_predictions(pred_a: np.ndarray, pred_b: np.ndarray, labels: np.ndarray,
                        n_resamples: int = 10_000, seed: int = 0) -> dict[str, Any]:
    """Both models' top-1 (``acc_a``, ``acc_b``, percent) and :func:`paired_tests` of their
    top-1 predictions."""
    pred_a, pred_b, labels = (np.asarray(x) for x in (pred_a, pred_b, labels))
    if not pred_a.shape == pred_b.shape == labels.shape:
        raise ValueError(f"predictions and labels must have equal shapes, got {pred_a.shape}, "
                         f"{pred_b.shape}, {labels.shape}")
    ca, cb = pred_a == labels, pred_b == labels
    return {"acc_a": 100 * ca.mean(), "acc_b": 100 * cb.mean(),
            **paired_tests(ca, cb, n_resamples, seed)}
