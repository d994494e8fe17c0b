"""One evaluation: every requested protocol on one backbone, written to an evaluation
directory (:func:`run_evaluation`, for any ``nn.Module`` and data sets)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from e2mc.artifacts import EvalDir, writer_lock
from e2mc.data.subsets import (
    LabeledSubset,
    fraction_label,
    label_fraction_indices,
    read_file_list,
    subset_from_file_list,
)
from e2mc.evaluation.features import FeatureCache, extract_features, state_dict_digest
from e2mc.evaluation.finetune import finetune
from e2mc.evaluation.knn import knn_classify
from e2mc.evaluation.linear import ProbeResult, train_augmented_linear_probe
from e2mc.evaluation.probe_settings import finetune_settings, linear_settings
from e2mc.evaluation.results import save_predictions
from e2mc.evaluation.svm import VOC07_COSTS, svm_transfer
from e2mc.evaluation.sweep import linear_protocol
from e2mc.progress import heartbeat

PROTOCOLS = ("linear", "linear-aug", "knn", "finetune", "svm")


def column_name(protocol: str, fraction: float | None = None, k: int | None = None,
                weighting: str = "weighted") -> str:
    """An entry's column: ``linear 1%``, ``knn k=20`` (``knn k=20 uniform``), ``svm``."""
    if protocol == "knn":
        return f"knn k={k}" + ("" if weighting == "weighted" else f" {weighting}")
    return protocol if fraction is None else f"{protocol} {fraction_label(fraction)}"


@dataclass
class EvalOptions:
    """Settings of an evaluation. ``report``: the last- (default: no selection on the test set)
    or best-epoch top-1. ``lr_grid`` / ``wd_grid``: a fraction's grid, chosen on ``val_fraction``
    of its subset. ``subset_files``: a fraction's image list replacing its random subset."""

    protocols: tuple[str, ...] = ("linear",)
    fractions: tuple[float, ...] = (0.01, 0.1, 1.0)
    seeds: tuple[int, ...] = (0, 1, 2)
    method: str = "generic"
    linear_overrides: dict[str, Any] = field(default_factory=dict)
    finetune_overrides: dict[str, Any] = field(default_factory=dict)
    knn_k: tuple[int, ...] = (20, 200)
    knn_temperature: float = 0.07
    knn_weightings: tuple[str, ...] = ("weighted", "uniform")
    lr_grid: dict[float, tuple[float, ...]] = field(default_factory=dict)
    wd_grid: dict[float, tuple[float, ...]] = field(default_factory=dict)
    val_fraction: float = 0.2
    subset_files: dict[float, str] = field(default_factory=dict)
    autocast: bool | None = None
    svm_costs: tuple[float, ...] = VOC07_COSTS
    svm_folds: int = 3
    report: str = "last"
    batch_size: int = 256
    num_workers: int | None = None
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
        if not all(0 < f <= 1 for f in self.fractions):
            raise ValueError(f"fractions must be in (0, 1], got {list(self.fractions)}")
        for name, table in (("lr_grid", self.lr_grid), ("wd_grid", self.wd_grid),
                            ("subset_files", self.subset_files)):
            extra = [f for f in table if f not in self.fractions]
            if extra:
                raise ValueError(f"{name} names fraction(s) {extra} that are not evaluated "
                                 f"(fractions: {list(self.fractions)})")
        if not 0 < self.val_fraction < 1:
            raise ValueError(f"val_fraction must be in (0, 1), got {self.val_fraction}")
        for f, values in self.lr_grid.items():
            if not values or any(not v > 0 for v in values):
                raise ValueError(f"learning rates of the grid must be > 0, got {values} at {f}")
        for f, values in self.wd_grid.items():
            if not values or any(not v >= 0 for v in values):
                raise ValueError(f"weight decays of the grid must be >= 0, got {values} at {f}")


def _file_subsets(train_dataset: Dataset, files: dict[float, str]
                  ) -> tuple[dict[float, np.ndarray], dict[str, Any]]:
    """Training indices of each fraction's image list, and their ``results.json`` record."""
    subsets: dict[float, np.ndarray] = {}
    info: dict[str, Any] = {}
    for fraction, path in files.items():
        names = read_file_list(path)
        subsets[fraction] = subset_from_file_list(train_dataset, names).indices
        info[fraction_label(fraction)] = {
            "file": str(path), "size": int(len(subsets[fraction])),
            "sha256": hashlib.sha256("\n".join(names).encode()).hexdigest()}
    return subsets, info


def _subset(kind: str, indices: np.ndarray) -> dict[str, Any]:
    """An entry's ``subset``: how its training rows were chosen, how many, their SHA-256."""
    from e2mc.data.identity import update_array

    h = hashlib.sha256()
    update_array(h, np.asarray(indices, dtype=np.int64))
    return {"kind": kind, "size": len(indices), "sha256": h.hexdigest()}


def _probe_entry(eval_dir: Path, protocol: str, fraction: float, seed: int,
                 result: ProbeResult, labels: np.ndarray, report: str,
                 generation: str) -> dict[str, Any]:
    name = f"{protocol}_f{fraction:g}_s{seed}"
    chosen, other = ((result.predictions, result.best_predictions) if report == "last"
                     else (result.best_predictions, result.predictions))
    rel = save_predictions(eval_dir, name, chosen, labels, generation,
                           other_epoch_predictions=other, top5=result.top5)
    return {"protocol": protocol, "column": column_name(protocol, fraction),
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
    lock: bool = True,
) -> dict[str, Any]:
    """Run ``options.protocols`` into ``out_dir`` as one unit (:class:`e2mc.artifacts.EvalDir`:
    interrupted anywhere, it keeps the previous complete result); returns the record. ``lock``
    False: the caller holds :func:`e2mc.artifacts.writer_lock` on ``out_dir``."""
    from e2mc.data.identity import data_identity
    from e2mc.distributed import is_main_process

    eval_dir = Path(out_dir)
    with writer_lock(out_dir) if lock and is_main_process() else nullcontext():
        device = torch.device(options.device)
        kw = {"batch_size": options.batch_size, "device": device,
              "num_workers": options.num_workers, "progress": options.progress,
              "autocast": options.autocast}
        timings: dict[str, float] = {}
        subsets, subset_info = ({}, {}) if "linear" not in options.protocols else \
            _file_subsets(train_dataset, options.subset_files)  # before the slow extraction
        extra_record = dict(extra_record or {})
        # the weights by value: e2mc compare flags two evaluations of the same weights
        with _beat(options, "hashing the weights and the data"):
            extra_record.setdefault("backbone_sha256", state_dict_digest(backbone))
            for split, ds in (("train", train_dataset), ("test", test_dataset)):
                if f"{split}_data" not in extra_record:  # what compare pairs by (evaluate_
                    extra_record[f"{split}_data"] = data_identity(ds)  # checkpoint has it)
        start = time.perf_counter()

        def features(ds: Dataset, split: str) -> tuple[np.ndarray, np.ndarray, bool]:
            if cache is None:
                return (*extract_features(backbone, ds, **kw), False)
            return cache.get_or_extract(backbone, ds, f"{data_id}:{split}", checkpoint, content=(
                extra_record[f"{split}_data"]["content"]), **kw)  # hashed once, for both uses

        train_x, train_y, hit_train = features(train_dataset, "train")
        test_x, test_y, hit_test = features(test_dataset, "test")
        timings["features"] = time.perf_counter() - start
        if not is_main_process():  # under torchrun: the ranks shared the extraction; rank 0 goes on
            return {}
        eval_dir.mkdir(parents=True, exist_ok=True)
        generation = EvalDir(eval_dir).begin()  # removes what an interrupted evaluation left
        multilabel = train_y.ndim == 2
        if multilabel and any(p != "svm" for p in options.protocols):
            raise ValueError("multi-label data supports only the 'svm' protocol")
        num_classes = None if multilabel else int(max(train_y.max(), test_y.max())) + 1
        entries: list[dict[str, Any]] = []
        settings: dict[str, Any] = {}

        def linear_config(fraction: float):
            return linear_settings(options.method, fraction, **options.linear_overrides)

        if "linear" in options.protocols:
            s = time.perf_counter()
            settings["linear"] = {fraction_label(f): {
                **dataclasses.asdict(linear_config(f)), "lr_grid": list(options.lr_grid.get(f, ())),
                "wd_grid": list(options.wd_grid.get(f, ())), "val_fraction": options.val_fraction,
                "subset": subset_info.get(fraction_label(f), "stratified random (label seed)")}
                for f in options.fractions}
            with _beat(options, f"linear probes ({len(options.fractions)} fraction(s) x "
                                f"{len(options.seeds)} seed(s), trained together)"):
                sweep = linear_protocol(train_x, train_y, test_x, test_y, options.fractions,
                                        options.seeds, config_for=linear_config,
                                        lr_grid=options.lr_grid, wd_grid=options.wd_grid,
                                        val_fraction=options.val_fraction, subsets=subsets,
                                        device=device)
            for entry in sweep:
                entries.append({
                    **_probe_entry(eval_dir, "linear", entry.fraction, entry.seed, entry.result,
                                   test_y, options.report, generation),
                    "subset": _subset("file" if entry.fraction in subsets else "stratified",
                                      entry.rows),
                    "config": {"lr": entry.config.lr, "weight_decay": entry.config.weight_decay},
                    **({"selection": entry.selection} if entry.selection is not None else {})})
            timings["linear"] = time.perf_counter() - s
        def per_seed(protocol: str, config_of: Any, train: Any) -> None:
            """A probe per (fraction, seed) that reads the images of its stratified subset."""
            settings[protocol] = {}
            for fraction in options.fractions:
                config = config_of(fraction)
                settings[protocol][fraction_label(fraction)] = dataclasses.asdict(config)
                for seed in options.seeds:
                    idx = label_fraction_indices(train_y, fraction, seed)
                    result = train(LabeledSubset(train_dataset, idx), config, seed)
                    entries.append({**_probe_entry(eval_dir, protocol, fraction, seed, result,
                                                   test_y, options.report, generation),
                                    "subset": _subset("stratified", idx)})

        run_kw = {"device": device, "num_workers": options.num_workers or 0,
                  "progress": options.progress}
        if "linear-aug" in options.protocols:
            per_seed("linear-aug", linear_config, lambda data, config, seed: (
                train_augmented_linear_probe(backbone, data, test_x, test_y, num_classes, config,
                                             seed=seed, **run_kw)))
        if "knn" in options.protocols:
            s = time.perf_counter()
            settings["knn"] = {"k": list(options.knn_k), "temperature": options.knn_temperature,
                               "similarity": "cosine", "weighting": "exp(sim / T)",
                               "weightings": list(options.knn_weightings)}
            for res in knn_classify(train_x, train_y, test_x, test_y, options.knn_k,
                                    options.knn_temperature, num_classes, device=device,
                                    weightings=options.knn_weightings):
                suffix = "" if res.weighting == "weighted" else f"_{res.weighting}"
                rel = save_predictions(eval_dir, f"knn_k{res.k}{suffix}", res.predictions,
                                       test_y, generation, top5=res.top5_predictions)
                entries.append({"protocol": "knn", "column": column_name("knn", k=res.k,
                                                                         weighting=res.weighting),
                                "fraction": 1.0, "seed": 0, "primary": "top1",
                                "metrics": res.metrics(), "predictions": rel})
            timings["knn"] = time.perf_counter() - s
        if "finetune" in options.protocols:
            per_seed("finetune", lambda f: finetune_settings(options.method, f,
                                                             **options.finetune_overrides),
                     lambda data, config, seed: finetune(backbone, feature_dim, num_classes, data,
                                                         test_dataset, config, seed=seed, **run_kw))
        if "svm" in options.protocols:
            settings["svm"] = {"costs": list(options.svm_costs), "folds": options.svm_folds,
                               "normalize": True}
            res = svm_transfer(train_x, train_y, test_x, test_y, options.svm_costs,
                               options.svm_folds)
            rel = (save_predictions(eval_dir, "svm", res.predictions, test_y, generation,
                                    scores=res.scores)
                   if res.predictions is not None else None)
            entries.append({"protocol": "svm", "column": "svm", "fraction": 1.0, "seed": 0,
                            "primary": "mAP" if multilabel else "accuracy",
                            "metrics": res.metrics(), "predictions": rel})
        record = {
            **extra_record,
            "data": data_id,
            "protocols": list(options.protocols),
            "fractions": list(options.fractions),
            "seeds": list(options.seeds),
            "method_preset": options.method,
            "reported_epoch": options.report,
            "feature_cache_hit": {"train": hit_train, "test": hit_test},
            "feature_cache_rebuilt": list(cache.rebuilt) if cache is not None else [],
            "timings_s": timings,
            "num_train": len(train_x), "num_test": len(test_x), "feature_dim": train_x.shape[1],
            "settings": settings,
            "entries": entries,
        }
        EvalDir(eval_dir).write(record)  # last: the directory now describes this evaluation
        return record


def _beat(options: EvalOptions, what: str) -> Any:
    """A line every 10 s while a phase with nothing to count runs (with progress on)."""
    return heartbeat(what) if options.progress else nullcontext()
