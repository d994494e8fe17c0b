"""Label-fraction x seed sweeps of the linear probe on fixed features (:func:`linear_protocol`):
with a grid, each (fraction, seed) chooses its point on a stratified validation part of its
labelled subset, then trains it on the whole subset; the test labels play no part."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from e2mc.data.subsets import label_fraction_indices, stratified_indices
from e2mc.evaluation.batched import BEST_HEAD_RULE, HeadSpec, best_head, train_linear_heads
from e2mc.evaluation.linear import ProbeResult
from e2mc.evaluation.probe_settings import LinearProbeConfig


@dataclass
class SweepEntry:
    """One (fraction, seed) probe: test result, configuration, training rows, selection."""

    fraction: float
    seed: int
    result: ProbeResult
    config: LinearProbeConfig
    rows: np.ndarray
    selection: dict[str, Any] | None = None


def validation_split(labels: np.ndarray, val_fraction: float, seed: int
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Positions ``(train, val)`` of a stratified split of ``labels``: each class with
    ``n_c >= 2`` images gives ``min(n_c - 1, max(1, round(val_fraction * n_c)))`` (half up) to
    the validation part (:func:`~e2mc.data.subsets.stratified_indices` with ``keep=1``)."""
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    val = stratified_indices(labels, val_fraction, seed, keep=1)
    if val.size == 0:
        raise ValueError("no class has two labelled images: nothing to validate on")
    train = np.setdiff1d(np.arange(len(labels)), val)
    return train, val


def linear_protocol(
    train_x: np.ndarray,
    train_y: np.ndarray,
    test_x: np.ndarray,
    test_y: np.ndarray,
    fractions: Sequence[float],
    seeds: Sequence[int],
    config_for: Callable[[float], LinearProbeConfig],
    lr_grid: Mapping[float, Sequence[float]] | None = None,
    wd_grid: Mapping[float, Sequence[float]] | None = None,
    val_fraction: float = 0.2,
    subsets: Mapping[float, np.ndarray] | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> list[SweepEntry]:
    """All linear probes of an evaluation, batched; one :class:`SweepEntry` per (fraction,
    seed). ``subsets[fraction]``: training rows replacing the stratified random subset for
    every seed. ``lr_grid`` / ``wd_grid``: a fraction's grid (missing: the preset's value)."""
    if not fractions or not seeds:
        raise ValueError("need at least one fraction and one seed")
    train_y = np.asarray(train_y)
    num_classes = int(max(np.max(train_y), np.max(test_y))) + 1
    lr_grid, wd_grid, subsets = lr_grid or {}, wd_grid or {}, subsets or {}
    plan = []  # (fraction, seed, subset, grid points)
    for fraction in fractions:
        config = config_for(fraction)
        # the grid's points (a bad value: LinearProbeConfig's error); one point: used as is
        points = [replace(config, lr=lr, weight_decay=wd) for lr, wd in itertools.product(
            lr_grid.get(fraction) or [config.lr], wd_grid.get(fraction) or [config.weight_decay])]
        for seed in seeds:
            idx = (np.asarray(subsets[fraction], dtype=np.int64) if fraction in subsets
                   else label_fraction_indices(train_y, fraction, seed))
            plan.append((fraction, seed, idx, points))

    # Stage 1: every grid point on the training part, scored on the validation part.
    select_heads: list[HeadSpec] = []
    select_where: list[tuple[int, np.ndarray, np.ndarray]] = []
    for k, (_, seed, idx, points) in enumerate(plan):
        if len(points) == 1:
            continue
        tr, val = validation_split(train_y[idx], val_fraction, seed)
        select_where.append((k, idx[tr], idx[val]))
        select_heads += [HeadSpec(idx[tr], point, seed, eval_rows=idx[val], history=False)
                         for point in points]
    chosen: dict[int, tuple[LinearProbeConfig, dict[str, Any]]] = {}
    if select_heads:
        scored = train_linear_heads(train_x, train_y, train_x, train_y, select_heads,
                                    num_classes=num_classes, device=device, dtype=dtype)
        pos = 0
        for k, tr_rows, val_rows in select_where:
            points = plan[k][3]
            results = scored[pos:pos + len(points)]
            pos += len(points)
            grid = [{"lr": p.lr, "weight_decay": p.weight_decay, "val_top1": r.top1_last,
                     "val_loss": r.loss_last} for p, r in zip(points, results, strict=True)]
            best = points[best_head(results)]
            chosen[k] = (best, {
                "rule": BEST_HEAD_RULE,
                "train_size": int(len(tr_rows)), "validation_size": int(len(val_rows)),
                "grid": grid, "chosen": {"lr": best.lr, "weight_decay": best.weight_decay}})

    # Stage 2: the chosen (or only) configuration on the whole subset, evaluated on test.
    final_heads = [HeadSpec(idx, chosen[k][0] if k in chosen else points[0], seed)
                   for k, (_, seed, idx, points) in enumerate(plan)]
    finals = train_linear_heads(train_x, train_y, test_x, test_y, final_heads,
                                num_classes=num_classes, device=device, dtype=dtype)
    return [SweepEntry(fraction=fraction, seed=seed, result=result,
                       config=final_heads[k].config, rows=idx,
                       selection=chosen[k][1] if k in chosen else None)
            for k, ((fraction, seed, idx, _), result) in enumerate(zip(plan, finals,
                                                                       strict=True))]

