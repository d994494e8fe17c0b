"""Run directories of ``e2mc eval`` and the comparison table of ``e2mc compare``.

A run directory holds ``results.json`` and ``predictions/*.npz``. ``results.json``::

    {"checkpoint": ..., "command": [...], "data": ..., "protocols": [...], "seeds": [...],
     "fractions": [...], "settings": {...},
     "entries": [{"protocol", "column", "fraction", "seed", "primary", "metrics",
                  "predictions"}, ...],
     "summary": {column: {metric: {"mean", "se", "n"}}}}

Each ``predictions/*.npz`` has ``predictions`` (top-1 label per test image) and ``labels``.
"""

from __future__ import annotations

import csv
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from e2mc.checkpoints.io import atomic_write
from e2mc.evaluation.statistics import (
    bootstrap_difference_ci,
    cohens_d_paired,
    mcnemar_test,
    paired_permutation_test,
    pooled_permutation_test,
)


def mean_se(values: list[float]) -> tuple[float, float | None]:
    """Mean and standard error ``std(ddof=1) / sqrt(n)``; SE is None for a single value."""
    if not values:
        raise ValueError("mean_se of an empty list")
    arr = np.asarray(values, dtype=np.float64)
    se = float(arr.std(ddof=1) / math.sqrt(len(arr))) if len(arr) > 1 else None
    return float(arr.mean()), se


def fraction_label(fraction: float) -> str:
    """``0.01 -> '1%'``, ``0.125 -> '12.5%'``."""
    return f"{100 * fraction:g}%"


def save_predictions(run_dir: str | os.PathLike[str], name: str, predictions: np.ndarray,
                     labels: np.ndarray, **extra: np.ndarray) -> str:
    """Write ``predictions/<name>.npz`` and return its path relative to ``run_dir``."""
    rel = Path("predictions") / f"{name}.npz"
    path = Path(run_dir) / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, predictions=np.asarray(predictions), labels=np.asarray(labels),
                        **extra)
    return rel.as_posix()


def summarize(entries: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Mean and SE over seeds of every numeric metric, per column."""
    grouped: dict[str, dict[str, list[float]]] = {}
    for e in entries:
        col = grouped.setdefault(e["column"], {})
        for key, value in e["metrics"].items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                col.setdefault(key, []).append(float(value))
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for column, metrics in grouped.items():
        out[column] = {}
        for key, values in metrics.items():
            mean, se = mean_se(values)
            out[column][key] = {"mean": mean, "se": se, "n": len(values)}
    return out


def write_results(run_dir: str | os.PathLike[str], record: dict[str, Any]) -> Path:
    """Add the summary to ``record`` and write ``results.json`` atomically."""
    record = dict(record)
    record["summary"] = summarize(record["entries"])
    path = Path(run_dir) / "results.json"
    text = json.dumps(record, indent=2, default=_jsonable)
    atomic_write(path, lambda f: f.write(text), "w")
    return path


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, (np.integer, np.floating)):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def load_run(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    path = Path(run_dir) / "results.json"
    if not path.is_file():
        raise ValueError(f"{run_dir} is not an evaluation run directory (no results.json)")
    record = json.loads(path.read_text())
    record["_dir"] = str(run_dir)
    return record


@dataclass
class Comparison:
    """``cells[run][column] = (mean, se, marker)``; ``tests`` one row per (run, column, seed)
    paired test against the first run."""

    runs: list[str]
    columns: list[str]
    cells: dict[str, dict[str, tuple[float, float | None, str]]]
    tests: list[dict[str, Any]] = field(default_factory=list)
    metric_note: str = ""
    pooled: list[dict[str, Any]] = field(default_factory=list)


def _marker(p: float) -> str:
    return "**" if p < 0.01 else "*" if p < 0.05 else ""


def _load_predictions(run: dict[str, Any], entry: dict[str, Any]) -> tuple[np.ndarray,
                                                                             np.ndarray]:
    with np.load(Path(run["_dir"]) / entry["predictions"]) as f:
        return f["predictions"], f["labels"]


def compare_runs(run_dirs: list[str], names: list[str] | None = None,
                 n_resamples: int = 10_000, seed: int = 0) -> Comparison:
    """Table of mean ± SE (each column's primary metric) and paired tests of every run
    against the first on the same (column, seed) test predictions.

    A cell is marked ``*`` (``**``) when the largest p-value over its matched seeds, taking
    the larger of McNemar's and the permutation test's, is below 0.05 (0.01): i.e. the
    difference is significant at every seed under both tests. With two or more matched
    seeds, :func:`~e2mc.evaluation.statistics.pooled_permutation_test` also gives one p-value
    over all of them (``Comparison.pooled``).
    """
    if len(run_dirs) < 1:
        raise ValueError("compare needs at least one run directory")
    runs = [load_run(d) for d in run_dirs]
    names = names or [Path(d).name or str(d) for d in run_dirs]
    if len(names) != len(runs):
        raise ValueError(f"{len(names)} names for {len(runs)} runs")
    columns: list[str] = []
    for run in runs:
        for e in run["entries"]:
            if e["column"] not in columns:
                columns.append(e["column"])
    primaries = {e["column"]: e["primary"] for run in runs for e in run["entries"]}
    cells: dict[str, dict[str, tuple[float, float | None, str]]] = {}
    tests: list[dict[str, Any]] = []
    pooled: list[dict[str, Any]] = []
    base = runs[0]
    for name, run in zip(names, runs, strict=True):
        cells[name] = {}
        for column in columns:
            entries = [e for e in run["entries"] if e["column"] == column]
            if not entries:
                continue
            mean, se = mean_se([e["metrics"][primaries[column]] for e in entries])
            worst_p: float | None = None
            matched: list[tuple[np.ndarray, np.ndarray]] = []
            if run is not base:
                for ref, e in _matched_entries(base, run, column):
                    matched.append(_correctness(base, ref, run, e))
                    row = _paired_test(*matched[-1], n_resamples, seed)
                    row.update(run=name, reference=names[0], column=column, seed=e["seed"])
                    tests.append(row)
                    p = max(row["mcnemar_p"], row["permutation_p"])
                    worst_p = p if worst_p is None else max(worst_p, p)
            if len(matched) >= 2:
                diff, p = pooled_permutation_test(matched, n_resamples, seed)
                pooled.append({"run": name, "reference": names[0], "column": column,
                               "seeds": len(matched), "difference": 100 * diff,
                               "permutation_p": p})
            cells[name][column] = (mean, se, _marker(worst_p) if worst_p is not None else "")
    note = "; ".join(f"{c}: {primaries[c]}" for c in columns)
    return Comparison(runs=names, columns=columns, cells=cells, tests=tests, metric_note=note,
                      pooled=pooled)


def matched_correctness(reference_dir: str | os.PathLike[str], run_dir: str | os.PathLike[str],
                        column: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(run, reference)`` per-image 0/1 correctness for every seed of ``column`` that both
    evaluation runs have (the input of :func:`pooled_permutation_test`)."""
    ref_run, run = load_run(reference_dir), load_run(run_dir)
    return [_correctness(ref_run, ref, run, e) for ref, e in _matched_entries(ref_run, run, column)]


def _matched_entries(reference: dict[str, Any], run: dict[str, Any], column: str
                     ) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """``(reference entry, run entry)`` of ``column`` with the same seed, both with saved
    predictions, in the run's order."""
    out = []
    for e in run["entries"]:
        if e["column"] != column or not e.get("predictions"):
            continue
        ref = next((b for b in reference["entries"] if b["column"] == column
                    and b["seed"] == e["seed"]), None)
        if ref is not None and ref.get("predictions"):
            out.append((ref, e))
    return out


def _correctness(base: dict[str, Any], ref: dict[str, Any], run: dict[str, Any],
                 entry: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Per-image 0/1 correctness of ``run``'s ``entry`` and of the reference's ``ref``."""
    pred_a, labels_a = _load_predictions(base, ref)
    pred_b, labels_b = _load_predictions(run, entry)
    if labels_a.shape != labels_b.shape or not np.array_equal(labels_a, labels_b):
        raise ValueError(f"column {entry['column']!r}, seed {entry['seed']}: the two runs were "
                         "evaluated on different test sets (labels differ); paired tests "
                         "need the same images in the same order")
    # Positive difference = this run better than the reference (the first run).
    return (pred_b == labels_b).astype(np.float64), (pred_a == labels_a).astype(np.float64)


def _paired_test(ca: np.ndarray, cb: np.ndarray, n_resamples: int, seed: int
                 ) -> dict[str, Any]:
    mc = mcnemar_test(ca, cb)
    low, high = bootstrap_difference_ci(ca, cb, n_resamples=n_resamples, seed=seed)
    return {"difference": 100 * (ca.mean() - cb.mean()), "n10": mc.n10, "n01": mc.n01,
            "mcnemar_stat": mc.statistic, "mcnemar_p": mc.p_value, "mcnemar_method": mc.method,
            "permutation_p": paired_permutation_test(ca, cb, n_resamples, seed),
            "cohens_d": cohens_d_paired(ca, cb), "ci95_low": 100 * low, "ci95_high": 100 * high}


def _cell_text(cell: tuple[float, float | None, str] | None) -> str:
    if cell is None:
        return "-"
    mean, se, mark = cell
    return (f"{mean:.2f} ± {se:.2f}" if se is not None else f"{mean:.2f}") + mark


def comparison_markdown(comp: Comparison) -> str:
    """The Table-1-style markdown table, a legend and the per-seed tests."""
    lines = ["| run | " + " | ".join(comp.columns) + " |",
             "|---|" + "---|" * len(comp.columns)]
    for run in comp.runs:
        lines.append(f"| {run} | " + " | ".join(_cell_text(comp.cells[run].get(c))
                                                for c in comp.columns) + " |")
    lines += ["", f"Mean ± standard error over seeds (percent). Metrics: {comp.metric_note}.",
              f"* p < 0.05, ** p < 0.01 against {comp.runs[0]} at every seed under both "
              "McNemar and the paired permutation test."]
    if comp.pooled:
        lines += ["", "Pooled over seeds (each image's difference averaged over the matched "
                  "seeds, then the paired permutation test on the images):", "",
                  "| run | column | seeds | diff | permutation p |", "|---|---|---|---|---|"]
        lines += [f"| {t['run']} | {t['column']} | {t['seeds']} | {t['difference']:+.2f} | "
                  f"{t['permutation_p']:.3g} |" for t in comp.pooled]
    if comp.tests:
        lines += ["", "| run | column | seed | diff | n10 | n01 | McNemar p | permutation p | "
                  "Cohen's d | 95% CI |", "|---|---|---|---|---|---|---|---|---|---|"]
        for t in comp.tests:
            lines.append(
                f"| {t['run']} | {t['column']} | {t['seed']} | {t['difference']:+.2f} | "
                f"{t['n10']} | {t['n01']} | {t['mcnemar_p']:.3g} ({t['mcnemar_method']}) | "
                f"{t['permutation_p']:.3g} | {t['cohens_d']:.3f} | "
                f"[{t['ci95_low']:+.2f}, {t['ci95_high']:+.2f}] |")
    return "\n".join(lines) + "\n"


def write_comparison(comp: Comparison, out_prefix: str | os.PathLike[str]) -> list[Path]:
    """Write ``<prefix>.md``, ``<prefix>.csv`` (one row per run and column) and
    ``<prefix>_tests.csv`` (one row per paired test)."""
    prefix = Path(out_prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    md = prefix.with_name(prefix.name + ".md")
    md.write_text(comparison_markdown(comp))
    table = prefix.with_name(prefix.name + ".csv")
    with table.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["run", "column", "mean", "se", "marker"])
        for run in comp.runs:
            for c in comp.columns:
                if c in comp.cells[run]:
                    mean, se, mark = comp.cells[run][c]
                    w.writerow([run, c, f"{mean:.4f}", "" if se is None else f"{se:.4f}", mark])
    tests = prefix.with_name(prefix.name + "_tests.csv")
    keys = ["run", "reference", "column", "seed", "difference", "n10", "n01", "mcnemar_stat",
            "mcnemar_p", "mcnemar_method", "permutation_p", "cohens_d", "ci95_low", "ci95_high"]
    with tests.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for t in comp.tests:
            w.writerow({k: t[k] for k in keys})
    return [md, table, tests]
