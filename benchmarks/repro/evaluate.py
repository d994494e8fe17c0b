"""Frozen-feature evaluation of every checkpoint: linear probes and kNN on Fashion-MNIST,
the linear probe on MNIST (transfer), and the accuracy-vs-epoch curves.

Each evaluation is an ``e2mc eval`` run directory written by
:func:`e2mc.evaluation.runner.run_evaluation` with a :class:`~e2mc.evaluation.FeatureCache`;
it is skipped when its ``results.json`` was made from the same checkpoint file (SHA-256) with
the same options.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from e2mc.artifacts import EvalDir, EvalResults
from repro.settings import ReproSettings


@dataclass
class Split:
    """A train/test pair of eval-transformed datasets and its cache identity."""

    train: Any
    test: Any
    data_id: str


def _limit(dataset: Any, limit: int | None, seed: int | None = None) -> Any:
    """The first ``limit`` items, or ``limit`` items drawn with ``seed`` (fixed in advance)."""
    from torch.utils.data import Subset

    if limit is None or limit >= len(dataset):
        return dataset
    if seed is None:
        return Subset(dataset, range(limit))
    idx = np.sort(np.random.default_rng(seed).permutation(len(dataset))[:limit])
    return Subset(dataset, idx.tolist())


class Evaluator:
    """Datasets, feature cache and probe options shared by every evaluation of a run."""

    def __init__(self, s: ReproSettings) -> None:
        from e2mc.data import build_dataset, eval_transform

        self.s = s
        transform = eval_transform(s.image_size, 1)
        train = build_dataset(s.data, "train", transform)
        test = build_dataset(s.data, "test", transform)
        self.main = Split(_limit(train, s.train_limit), _limit(test, s.test_limit),
                          s.data_id(s.data, s.train_limit, s.test_limit))
        # Fixed seeded subsets for the accuracy-vs-epoch curves (chosen before any result).
        self.curve = Split(_limit(train, s.curve_train, seed=0), _limit(test, s.curve_test,
                                                                        seed=0),
                           s.data_id(s.data, s.curve_train, s.curve_test) + "|seeded-0")
        self.transfer: Split | None = None
        self.transfer_note = ""
        if s.transfer_data is None:
            self.transfer_note = "no --transfer-data given: transfer skipped"
        elif not (Path(s.transfer_data).exists() or s.transfer_data.startswith("builtin")):
            self.transfer_note = f"transfer data {s.transfer_data} not found: transfer skipped"
        else:
            ttrain = build_dataset(s.transfer_data, "train", transform)
            ttest = build_dataset(s.transfer_data, "test", transform)
            self.transfer = Split(_limit(ttrain, s.train_limit), _limit(ttest, s.test_limit),
                                  s.data_id(s.transfer_data, s.train_limit, s.test_limit))
        from e2mc.evaluation import FeatureCache

        self.cache = FeatureCache(s.out / "feature-cache")

    def options(self, method: str, protocols: tuple[str, ...], fractions: tuple[float, ...],
                seeds: tuple[int, ...]) -> Any:
        from e2mc.evaluation.runner import EvalOptions

        preset = method if self.s.probe_preset == "method" else "generic"
        return EvalOptions(protocols=protocols, fractions=fractions, seeds=seeds,
                           method=preset, knn_k=self.s.knn_k,
                           linear_overrides={"epochs": self.s.probe_epochs},
                           device=self.s.device, progress=self.s.progress)

    def evaluate(self, checkpoint: Path, out_dir: Path, method: str, split: Split,
                 protocols: tuple[str, ...], fractions: tuple[float, ...],
                 seeds: tuple[int, ...]) -> EvalResults:
        """``run_evaluation`` of ``checkpoint``'s backbone into ``out_dir`` (or its cached
        record when it exists for the same file and options)."""
        from e2mc.checkpoints import load_backbone
        from e2mc.evaluation.runner import run_evaluation
        from e2mc.files import sha256_file

        options = self.options(method, protocols, fractions, seeds)
        stamp = {"checkpoint_sha256": sha256_file(checkpoint), "data_id": split.data_id,
                 "options": repr(options)}
        eval_dir = EvalDir(out_dir)
        if eval_dir.exists():
            record = eval_dir.load()
            if record.info.get("stamp") == stamp:
                return record
        backbone, feature_dim, _ = load_backbone(checkpoint)
        if self.s.cpu_threads is not None:
            import torch

            torch.set_num_threads(self.s.cpu_threads)
        run_evaluation(backbone, feature_dim, split.train, split.test, out_dir, options,
                       data_id=split.data_id, checkpoint=checkpoint, cache=self.cache,
                       extra_record={"checkpoint": str(checkpoint), "stamp": stamp})
        return eval_dir.load()

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
