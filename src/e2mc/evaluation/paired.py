"""Paired comparisons over several training seeds (``e2mc search --confirm``): a summary per
column of the per-pair tests, and one permutation test pooled over the pairs."""

from __future__ import annotations

import os
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from e2mc.artifacts import EvalDir, mean_se

PathLike = str | os.PathLike[str]


def summarize_paired_tests(rows_by_seed: Mapping[int, list[dict[str, Any]]], column: str,
                           alpha: float = 0.05) -> dict[str, Any] | None:
    """The difference in ``column`` (points, other minus reference) as mean ± SE over training
    seeds of ``compare_evaluations(...).tests`` rows, and how many pairs are significantly
    better / worse (p < ``alpha`` under both McNemar's and the permutation test)."""
    diffs, better, worse, total, mcnemar_ps = [], 0, 0, 0, []
    for rows in rows_by_seed.values():
        mine = [r for r in rows if r["column"] == column]
        if not mine:
            continue
        diffs.append(float(np.mean([r["difference"] for r in mine])))
        for r in mine:
            total += 1
            mcnemar_ps.append(r["mcnemar_p"])
            if max(r["mcnemar_p"], r["permutation_p"]) < alpha:
                better += r["difference"] > 0
                worse += r["difference"] < 0
    if not diffs:
        return None
    mean, se = mean_se(diffs)
    return {"column": column,
            "difference": {"mean": mean, "se": se, "n": len(diffs), "values": diffs},
            "pairs": total, "significant_better": int(better), "significant_worse": int(worse),
            "median_mcnemar_p": float(statistics.median(mcnemar_ps)),
            "max_mcnemar_p": float(max(mcnemar_ps)), "min_mcnemar_p": float(min(mcnemar_ps))}


def pooled_p(dir_pairs: Sequence[tuple[PathLike, PathLike]], column: str) -> float | None:
    """p of the pooled permutation test over every pair of ``column`` of the evaluated
    (reference, other) ``dir_pairs``; None with fewer than two pairs."""
    from e2mc.evaluation.pairing import matched_correctness
    from e2mc.evaluation.significance import pooled_permutation_test

    matched = [m for ref, other in dir_pairs
               if EvalDir(ref).exists() and EvalDir(other).exists()
               for m in matched_correctness(ref, other, column)]
    return pooled_permutation_test(matched)[1] if len(matched) >= 2 else None
