"""From evaluation run directories to the numbers of ``results.md``: Table-1 cells (mean ± SE)
and paired tests (McNemar and the paired permutation test, via
:func:`e2mc.evaluation.compare_runs`) of each add-on against "continued" at matched seeds.

Conventions. A continued run's value in a column is the mean over the label-subset seeds of its
probes; the table shows mean ± SE of that over the training seeds. The base model is one run, so
its ± is the SE over label-subset seeds. A paired test compares two runs of the same training
seed, probed with the same label-subset seed, on the same test images.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import numpy as np

from e2mc import artifacts
from e2mc.artifacts import EvalDir, EvalResults


def load(run_dir: Path) -> EvalResults | None:
    """The evaluation of ``run_dir``, or None when it has not been run."""
    eval_dir = EvalDir(run_dir)
    return eval_dir.load() if eval_dir.exists() else None


def mean_se(values: list[float]) -> dict[str, Any]:
    """:func:`e2mc.artifacts.mean_se` as the dict the report stores (with the values)."""
    mean, se = artifacts.mean_se(values)
    return {"mean": mean, "se": se, "n": len(values), "values": [float(v) for v in values]}


def cell(records: list[EvalResults], column: str) -> dict[str, Any] | None:
    """Mean ± SE over runs (training seeds) of each run's mean over label-subset seeds; with a
    single run, over its label-subset seeds."""
    per_run = [r.values(column) for r in records]
    per_run = [v for v in per_run if v]
    if not per_run:
        return None
    if len(per_run) == 1:
        out = mean_se(per_run[0])
        out["over"] = "label-subset seeds"
        return out
    out = mean_se([float(np.mean(v)) for v in per_run])
    out["over"] = "training seeds"
    return out


def paired_tests(reference: Path, other: Path) -> list[dict[str, Any]]:
    """Per-(column, label seed) paired tests of ``other`` against ``reference``."""
    from e2mc.evaluation.results import compare_runs

    if load(reference) is None or load(other) is None:
        return []
    return compare_runs([str(reference), str(other)], names=["reference", "other"]).tests


def pooled_test(dir_pairs: list[tuple[Path, Path]], column: str) -> float | None:
    """p of :func:`e2mc.evaluation.pooled_permutation_test` over every (training seed, label
    seed) pair of ``column``: ``dir_pairs`` holds (reference, other) evaluation directories."""
    from e2mc.evaluation import pooled_permutation_test
    from e2mc.evaluation.results import matched_correctness

    matched = [m for ref, other in dir_pairs
               if all(EvalDir(d).exists() for d in (ref, other))
               for m in matched_correctness(ref, other, column)]
    return pooled_permutation_test(matched)[1] if len(matched) >= 2 else None


def summarize_tests(rows_by_seed: dict[int, list[dict[str, Any]]], column: str,
                    alpha: float = 0.05) -> dict[str, Any] | None:
    """One line per column: the difference (percentage points, other - reference) as mean ± SE
    over training seeds, and how many (training seed, label seed) pairs are significantly better
    / worse under both McNemar and the permutation test."""
    diffs, better, worse, total, mcnemar_ps = [], 0, 0, 0, []
    for rows in rows_by_seed.values():
        mine = [r for r in rows if r["column"] == column]
        if not mine:
            continue
        diffs.append(float(np.mean([r["difference"] for r in mine])))
        for r in mine:
            total += 1
            p = max(r["mcnemar_p"], r["permutation_p"])
            mcnemar_ps.append(r["mcnemar_p"])
            if p < alpha:
                better += r["difference"] > 0
                worse += r["difference"] < 0
    if not diffs:
        return None
    return {"column": column, "difference": mean_se(diffs), "pairs": total,
            "significant_better": int(better), "significant_worse": int(worse),
            "median_mcnemar_p": float(statistics.median(mcnemar_ps)),
            "max_mcnemar_p": float(max(mcnemar_ps)), "min_mcnemar_p": float(min(mcnemar_ps))}


def fmt(c: dict[str, Any] | None) -> str:
    if c is None:
        return "–"
    return f"{c['mean']:.2f} ± {c['se']:.2f}" if c["se"] is not None else f"{c['mean']:.2f}"


def fmt_diff(t: dict[str, Any] | None) -> str:
    if t is None:
        return "–"
    d = t["difference"]
    text = f"{d['mean']:+.2f}" + (f" ± {d['se']:.2f}" if d["se"] is not None else "")
    pooled = f"; pooled p {t['pooled_p']:.2g}" if t.get("pooled_p") is not None else ""
    return (f"{text} (better {t['significant_better']}/{t['pairs']}, worse "
            f"{t['significant_worse']}/{t['pairs']}; McNemar p {t['min_mcnemar_p']:.2g}–"
            f"{t['max_mcnemar_p']:.2g}{pooled})")
