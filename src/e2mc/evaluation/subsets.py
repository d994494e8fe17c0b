"""Label-fraction subsets: stratified, seeded, nested-free index selections (METHOD.md §4)."""

from __future__ import annotations

import numpy as np


def stratified_subset(labels: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """Indices of a class-stratified random subset holding ``fraction`` of ``labels``.

    Every class keeps ``max(1, round(fraction * n_class))`` examples (at least one, so that a 1%
    subset of a small data set still sees every class), drawn without replacement with
    ``numpy.random.default_rng(seed)``. ``fraction == 1`` returns all indices. The result is
    sorted, so the same ``(labels, fraction, seed)`` always gives the same array.
    """
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be 1-D class indices, got shape {labels.shape}")
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    if fraction == 1.0:
        return np.arange(len(labels))
    rng = np.random.default_rng(seed)
    chosen = []
    for cls in np.unique(labels):
        members = np.flatnonzero(labels == cls)
        count = max(1, int(round(fraction * len(members))))
        chosen.append(rng.choice(members, size=count, replace=False))
    return np.sort(np.concatenate(chosen))
