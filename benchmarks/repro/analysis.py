"""From evaluation run directories to the numbers of ``results.md``: Table-1 cells (mean ± SE)
and paired tests (McNemar and the paired permutation test, via
:func:`e2mc.evaluation.compare_evaluations`) of each add-on against "continued" at matched seeds.

Conventions. A continued run's value in a column is the mean over the label-subset seeds of its
probes; the table shows mean ± SE of that over the training seeds. The base model is one run, so
its ± is the SE over label-subset seeds. A paired test compares two runs of the same training
seed, probed with the same label-subset seed, on the same test images.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from e2mc import artifacts
from e2mc.artifacts import EvalDir, EvalResults
from e2mc.evaluation.paired import pooled_p, summarize_paired_tests


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
    from e2mc.evaluation.results import compare_evaluations

    if load(reference) is None or load(other) is None:
        return []
    return compare_evaluations([str(reference), str(other)], names=["reference", "other"]).tests


# The paired summary and the pooled test live in the library (``e2mc search --confirm`` uses
# them too); the study keeps its names for them.
pooled_test = pooled_p
summarize_tests = summarize_paired_tests


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
