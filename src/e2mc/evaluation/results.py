"""Evaluation directories of ``e2mc eval`` (read by :class:`e2mc.artifacts.EvalDir`) and the
comparison of ``e2mc compare``."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from e2mc.artifacts import EvalDir, EvalResults, mean_se, summarize
from e2mc.evaluation.compare import Comparison, compare_evaluations
from e2mc.evaluation.compare_chart import plot_comparison
from e2mc.evaluation.compare_report import (
    COMPARISON_STEM,
    comparison_markdown,
    comparison_paths,
    verdict_sentences,
    write_comparison,
)
from e2mc.evaluation.pairing import matched_correctness

#: What the comparison's modules define is re-exported: ``e2mc.evaluation.results`` stays the
#: one import of evaluation results for users' code.
__all__ = ["Comparison", "compare_evaluations", "comparison_markdown",
           "verdict_sentences", "matched_correctness", "mean_se", "plot_comparison",
           "save_predictions", "summarize", "write_comparison",
           "COMPARISON_STEM", "comparison_paths"]


def save_predictions(eval_dir: str | os.PathLike[str], name: str, predictions: np.ndarray,
                     labels: np.ndarray, generation: str | None = None,
                     **extra: np.ndarray) -> str:
    """Write ``predictions/<name>.<generation>.npz`` atomically; returns its path relative to
    ``eval_dir``. ``generation`` None: a fresh one, so that a file a complete evaluation
    references is never overwritten."""
    from e2mc.files import atomic_write

    rel = EvalDir(eval_dir).prediction_file(name, generation or EvalDir.new_generation())
    arrays = {"predictions": np.asarray(predictions), "labels": np.asarray(labels), **extra}
    atomic_write(Path(eval_dir) / rel, lambda f: np.savez_compressed(f, **arrays), "wb")
    return rel


def result_lines(results: EvalResults) -> list[str]:
    """What ``e2mc eval`` prints of an evaluation: per column its primary metric's mean ± SE
    over the label seeds, and the settings chosen on validation where a grid chose them."""
    lines = []
    for column in results.columns():
        entries = results.column(column)
        mean, se = mean_se(results.values(column))
        spread = f" ± {se:.2f}" if se is not None else ""
        lines.append(f"{column:>20}: {entries[0].primary} {mean:.2f}{spread} "
                     f"(n={len(entries)})")
        if any("selection" in e.extra for e in entries):
            chosen = ", ".join(f"seed {e.seed}: lr {e.extra['config']['lr']:g} wd "
                               f"{e.extra['config']['weight_decay']:g}" for e in entries)
            lines.append(f"{column:>20}: chosen on validation: {chosen}")
    return lines
