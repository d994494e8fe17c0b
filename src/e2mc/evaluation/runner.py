"""One evaluation run: every requested protocol on one backbone, written to a run directory.

This is what ``e2mc eval`` calls once it has loaded the backbone and the data; scripts can
call :func:`run_evaluation` directly with any ``nn.Module`` and datasets.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset, Subset

from e2mc.data.subsets import label_fraction_indices
from e2mc.evaluation.features import FeatureCache, extract_features
from e2mc.evaluation.finetune import finetune
from e2mc.evaluation.knn import knn_classify
from e2mc.evaluation.linear import ProbeResult, train_augmented_linear_probe
from e2mc.evaluation.presets import finetune_preset, linear_preset
from e2mc.evaluation.results import fraction_label, save_predictions, write_results
from e2mc.evaluation.svm import VOC07_COSTS, svm_transfer
from e2mc.evaluation.sweep import linear_sweep

PROTOCOLS = ("linear", "linear-aug", "knn", "finetune", "svm")


@dataclass
class EvalOptions:
    """Settings of a run. ``linear_overrides`` / ``finetune_overrides`` change fields of the
    method presets (e.g. ``{"epochs": 10}``); ``report`` picks the last- or best-epoch top-1 as
    the number the table shows (last-epoch by default: no selection on the test set)."""

    protocols: tuple[str, ...] = ("linear",)
    fractions: tuple[float, ...] = (0.01, 0.1, 1.0)
    seeds: tuple[int, ...] = (0, 1, 2)
    method: str = "generic"
    linear_overrides: dict[str, Any] = field(default_factory=dict)
    finetune_overrides: dict[str, Any] = field(default_factory=dict)
    knn_k: tuple[int, ...] = (20, 200)
    knn_temperature: float = 0.07
    svm_costs: tuple[float, ...] = VOC07_COSTS
    svm_folds: int = 3
    report: str = "last"
    batch_size: int = 256
    num_workers: int = 0
    device: str = "cpu"
    progress: bool = True

    def __post_init__(self) -> None:
        unknown = [p for p in self.protocols if p not in PROTOCOLS]
        if unknown or not self.protocols:
            raise ValueError(f"unknown protocol(s) {unknown}; choose from {', '.join(PROTOCOLS)}")
        if self.report not in ("last", "best"):
            raise ValueError(f"report must be 'last' or 'best', got {self.report!r}")
        if not self.fractions or not self.seeds:
            raise ValueError("need at least one fraction and one seed")
        for f in self.fractions:
            if not 0 < f <= 1:
                raise ValueError(f"fractions must be in (0, 1], got {f}")


def _probe_entry(run_dir: Path, protocol: str, fraction: float, seed: int,
                 result: ProbeResult, labels: np.ndarray, report: str) -> dict[str, Any]:
    name = f"{protocol}_f{fraction:g}_s{seed}"
    chosen, other = ((result.predictions, result.best_predictions) if report == "last"
                     else (result.best_predictions, result.predictions))
    rel = save_predictions(run_dir, name, chosen, labels, other_epoch_predictions=other,
                           top5=result.top5)
    return {"protocol": protocol, "column": f"{protocol} {fraction_label(fraction)}",
            "fraction": fraction, "seed": seed, "primary": f"top1_{report}",
            "metrics": {**result.metrics(), "history": result.history}, "predictions": rel}


def run_evaluation(
    backbone: nn.Module,
    feature_dim: int,
    train_dataset: Dataset,
    test_dataset: Dataset,
    out_dir: str | os.PathLike[str],
    options: EvalOptions,
    data_id: str = "data",
    checkpoint: str | os.PathLike[str] | None = None,
    cache: FeatureCache | None = None,
    extra_record: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run ``options.protocols`` and write ``results.json`` + ``predictions/`` in ``out_dir``;
    returns the record. Features for frozen protocols come from ``cache`` when given."""
    run_dir = Path(out_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    device = torch.device(options.device)
    kw = {"batch_size": options.batch_size, "device": device,
          "num_workers": options.num_workers, "progress": options.progress}

    def features(ds: Dataset, split: str) -> tuple[np.ndarray, np.ndarray, bool]:
        if cache is None:
            x, y = extract_features(backbone, ds, **kw)
            return x, y, False
        return cache.get_or_extract(backbone, ds, f"{data_id}:{split}", checkpoint, **kw)

    train_x, train_y, hit_train = features(train_dataset, "train")
    test_x, test_y, hit_test = features(test_dataset, "test")
    multilabel = train_y.ndim == 2
    if multilabel and any(p != "svm" for p in options.protocols):
        raise ValueError("multi-label data supports only the 'svm' protocol")
    num_classes = None if multilabel else int(max(train_y.max(), test_y.max())) + 1
    entries: list[dict[str, Any]] = []
    settings: dict[str, Any] = {}

    def linear_config(fraction: float):
        return linear_preset(options.method, fraction, **options.linear_overrides)

    if "linear" in options.protocols:
        settings["linear"] = {fraction_label(f): dataclasses.asdict(linear_config(f))
                              for f in options.fractions}
        sweep = linear_sweep(train_x, train_y, test_x, test_y, options.fractions,
                             options.seeds, config_for=linear_config, device=device)
        for fraction, runs in sweep.items():
            for seed, result in runs:
                entries.append(_probe_entry(run_dir, "linear", fraction, seed, result, test_y,
                                            options.report))
    if "linear-aug" in options.protocols:
        settings["linear-aug"] = {fraction_label(f): dataclasses.asdict(linear_config(f))
                                  for f in options.fractions}
        for fraction in options.fractions:
            for seed in options.seeds:
                idx = label_fraction_indices(train_y, fraction, seed)
                result = train_augmented_linear_probe(
                    backbone, Subset(train_dataset, idx.tolist()), test_x, test_y,
                    num_classes, linear_config(fraction), seed=seed, device=device,
                    num_workers=options.num_workers, progress=options.progress)
                entries.append(_probe_entry(run_dir, "linear-aug", fraction, seed, result,
                                            test_y, options.report))
    if "knn" in options.protocols:
        settings["knn"] = {"k": list(options.knn_k), "temperature": options.knn_temperature,
                           "similarity": "cosine", "weighting": "exp(sim / T)"}
        for res in knn_classify(train_x, train_y, test_x, test_y, options.knn_k,
                                options.knn_temperature, num_classes, device=device):
            rel = save_predictions(run_dir, f"knn_k{res.k}", res.predictions, test_y,
                                   top5=res.top5_predictions)
            entries.append({"protocol": "knn", "column": f"knn k={res.k}", "fraction": 1.0,
                            "seed": 0, "primary": "top1", "metrics": res.metrics(),
                            "predictions": rel})
    if "finetune" in options.protocols:
        settings["finetune"] = {}
        for fraction in options.fractions:
            config = finetune_preset(options.method, fraction, **options.finetune_overrides)
            settings["finetune"][fraction_label(fraction)] = dataclasses.asdict(config)
            for seed in options.seeds:
                idx = label_fraction_indices(train_y, fraction, seed)
                result = finetune(backbone, feature_dim, num_classes,
                                  Subset(train_dataset, idx.tolist()), test_dataset, config,
                                  seed=seed, device=device, num_workers=options.num_workers,
                                  progress=options.progress)
                entries.append(_probe_entry(run_dir, "finetune", fraction, seed, result,
                                            test_y, options.report))
    if "svm" in options.protocols:
        settings["svm"] = {"costs": list(options.svm_costs), "folds": options.svm_folds,
                           "normalize": True}
        res = svm_transfer(train_x, train_y, test_x, test_y, options.svm_costs,
                           options.svm_folds)
        rel = (save_predictions(run_dir, "svm", res.predictions, test_y, scores=res.scores)
               if res.predictions is not None else None)
        entries.append({"protocol": "svm", "column": "svm", "fraction": 1.0, "seed": 0,
                        "primary": "mAP" if multilabel else "accuracy",
                        "metrics": res.metrics(), "predictions": rel})
    record = {
        **(extra_record or {}),
        "data": data_id,
        "protocols": list(options.protocols),
        "fractions": list(options.fractions),
        "seeds": list(options.seeds),
        "method_preset": options.method,
        "reported_epoch": options.report,
        "feature_cache_hit": {"train": hit_train, "test": hit_test},
        "num_train": len(train_x), "num_test": len(test_x), "feature_dim": train_x.shape[1],
        "settings": settings,
        "entries": entries,
    }
    write_results(run_dir, record)
    return record
