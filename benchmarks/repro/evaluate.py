"""Frozen-feature evaluation of every checkpoint: linear probes and kNN on Fashion-MNIST,
the linear probe on MNIST (transfer), and the accuracy-vs-epoch curves.

Each evaluation is an ``e2mc eval`` directory written by
:func:`e2mc.evaluation.workflow.evaluate_checkpoint` with a :class:`~e2mc.evaluation.FeatureCache`;
it is read back when its ``results.json`` was made from the same checkpoint file (SHA-256), data
and options.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from e2mc.artifacts import EvalResults
from repro.settings import ReproSettings


class Evaluator:
    """The data, feature cache and probe options shared by every evaluation of a run; each
    evaluation is :func:`e2mc.evaluation.workflow.evaluate_checkpoint` with ``reuse``."""

    def __init__(self, s: ReproSettings) -> None:
        from e2mc.evaluation import FeatureCache
        from e2mc.evaluation.workflow import EvalData

        self.s = s
        self.main = EvalData(s.data, train_limit=s.train_limit, test_limit=s.test_limit)
        # Fixed seeded subsets for the accuracy-vs-epoch curves (chosen before any result).
        self.curve = EvalData(s.data, train_limit=s.curve_train, test_limit=s.curve_test,
                              limit_seed=0)
        self.transfer: EvalData | None = None
        self.transfer_note = ""
        if s.transfer_data is None:
            self.transfer_note = "no --transfer-data given: transfer skipped"
        elif not (Path(s.transfer_data).exists() or s.transfer_data.startswith("builtin")):
            self.transfer_note = f"transfer data {s.transfer_data} not found: transfer skipped"
        else:
            self.transfer = EvalData(s.transfer_data, train_limit=s.train_limit,
                                     test_limit=s.test_limit)
        self.cache = FeatureCache(s.out / "feature-cache")

    def options(self, method: str, protocols: tuple[str, ...], fractions: tuple[float, ...],
                seeds: tuple[int, ...]) -> Any:
        from e2mc.evaluation.probe_settings import METHODS as PAPER_PROBES
        from e2mc.evaluation.runner import EvalOptions

        # the paper gives probe settings for its three methods only; the others get generic's
        paper = self.s.probe_preset == "method" and method in PAPER_PROBES
        preset = method if paper else "generic"
        return EvalOptions(protocols=protocols, fractions=fractions, seeds=seeds,
                           method=preset, knn_k=self.s.knn_k,
                           linear_overrides={"epochs": self.s.probe_epochs},
                           device=self.s.device, progress=self.s.progress)

    def evaluate(self, checkpoint: Path, out_dir: Path, method: str, data: Any,
                 protocols: tuple[str, ...], fractions: tuple[float, ...],
                 seeds: tuple[int, ...]) -> EvalResults:
        """``checkpoint``'s backbone evaluated into ``out_dir`` (or its record read back when
        it was made from the same file, data and options)."""
        from e2mc.evaluation.workflow import evaluate_checkpoint

        if self.s.cpu_threads is not None:
            import torch

            torch.set_num_threads(self.s.cpu_threads)
        return evaluate_checkpoint(checkpoint, out_dir, data,
                                   self.options(method, protocols, fractions, seeds),
                                   image_size=self.s.image_size, cache=self.cache, reuse=True,
                                   log=lambda _: None)

    # ------------------------------------------------------------------ the three kinds
    def main_eval(self, checkpoint: Path, out_dir: Path, method: str) -> EvalResults:
        """Linear probes at every fraction x label-subset seed, and kNN."""
        return self.evaluate(checkpoint, out_dir, method, self.main, ("linear", "knn"),
                             self.s.fractions, self.s.label_seeds)

    def ablation_eval(self, checkpoint: Path, out_dir: Path, method: str) -> EvalResults:
        return self.evaluate(checkpoint, out_dir, method, self.main, ("linear",),
                             self.s.ablation_fractions, self.s.label_seeds)

    def transfer_eval(self, checkpoint: Path, out_dir: Path, method: str
                      ) -> EvalResults | None:
        """Linear probe on all transfer training labels (first label seed)."""
        if self.transfer is None:
            return None
        return self.evaluate(checkpoint, out_dir, method, self.transfer, ("linear",), (1.0,),
                             self.s.label_seeds[:1])

    def curve_point(self, checkpoint: Path, out_dir: Path, method: str,
                    with_linear: bool) -> dict[str, float]:
        """kNN top-1 (smallest k) on the fixed curve subsets, and optionally the 1% linear
        probe (mean over label-subset seeds) on the main split."""
        from e2mc.evaluation.runner import column_name

        k = min(self.s.knn_k)
        rec = self.evaluate(checkpoint, Path(out_dir) / "knn", method, self.curve, ("knn",),
                            (1.0,), (0,))
        point = {"knn": _mean(rec, column_name("knn", k=k))}
        if with_linear:
            fraction = min(self.s.fractions)
            rec = self.evaluate(checkpoint, Path(out_dir) / "linear", method, self.main,
                                ("linear",), (fraction,), self.s.label_seeds)
            point["linear"] = _mean(rec, column_name("linear", fraction))
        return point


def _mean(record: EvalResults, column: str) -> float:
    values = record.values(column)
    if not values:
        raise ValueError(f"{column!r} missing from {record.checkpoint}")
    return float(np.mean(values))
