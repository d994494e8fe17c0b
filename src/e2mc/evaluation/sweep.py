"""Label-fraction x seed sweeps of the linear probe on fixed features."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from e2mc.data.subsets import label_fraction_indices
from e2mc.evaluation.linear import ProbeResult, train_linear_probe
from e2mc.evaluation.presets import LinearProbeConfig, linear_preset


def linear_sweep(
    train_x: np.ndarray,
    train_y: np.ndarray,
    test_x: np.ndarray,
    test_y: np.ndarray,
    fractions: Sequence[float] = (0.01, 0.1, 1.0),
    seeds: Sequence[int] = (0, 1, 2),
    method: str = "generic",
    config_for: Callable[[float], LinearProbeConfig] | None = None,
    device: str | torch.device = "cpu",
) -> dict[float, list[tuple[int, ProbeResult]]]:
    """Train one probe per (fraction, seed). The seed picks the stratified label subset
    (:func:`label_fraction_indices`) and the probe's initialization and batch order; the config
    comes from ``config_for(fraction)`` or the method's preset (:func:`linear_preset`)."""
    if not fractions or not seeds:
        raise ValueError("need at least one fraction and one seed")
    num_classes = int(max(np.max(train_y), np.max(test_y))) + 1
    out: dict[float, list[tuple[int, ProbeResult]]] = {}
    for fraction in fractions:
        config = config_for(fraction) if config_for else linear_preset(method, fraction)
        out[fraction] = []
        for seed in seeds:
            idx = label_fraction_indices(train_y, fraction, seed)
            result = train_linear_probe(train_x[idx], train_y[idx], test_x, test_y, config,
                                        seed=seed, num_classes=num_classes, device=device)
            out[fraction].append((seed, result))
    return out
