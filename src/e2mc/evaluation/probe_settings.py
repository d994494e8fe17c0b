"""The paper's evaluation hyper-parameters per method (docs/method.md), as dataclasses. A
fraction the paper does not list uses the preset of the nearest listed one at or below it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal


@dataclass(frozen=True)
class LinearProbeConfig:
    """Linear probe on frozen features. ``optimizer="lars"`` is SimSiam's protocol: apex's
    LARC around SGD (trust coefficient 0.001, no clipping), :class:`e2mc.optim.LARC`."""

    epochs: int = 100
    batch_size: int = 256
    lr: float = 0.1
    weight_decay: float = 0.0
    momentum: float = 0.9
    optimizer: Literal["sgd", "lars"] = "sgd"
    #: Standardize features with the training split's mean and std before the linear layer
    #: (not in the paper's protocols; useful for random or non-ResNet backbones).
    standardize: bool = False

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batch_size < 1:
            raise ValueError(f"epochs and batch_size must be >= 1, got {self.epochs}, "
                             f"{self.batch_size}")
        if self.lr <= 0 or self.weight_decay < 0 or not 0 <= self.momentum < 1:
            raise ValueError(f"need lr > 0, weight_decay >= 0, 0 <= momentum < 1; got "
                             f"{self.lr}, {self.weight_decay}, {self.momentum}")
        if self.optimizer not in ("sgd", "lars"):
            raise ValueError(f"optimizer must be 'sgd' or 'lars', got {self.optimizer!r}")


@dataclass(frozen=True)
class FinetuneConfig:
    """Backbone + linear head trained together (semi-supervised protocol)."""

    epochs: int = 20
    batch_size: int = 256
    backbone_lr: float = 0.01
    head_lr: float = 0.1
    weight_decay: float = 0.0
    momentum: float = 0.9
    schedule: Literal["cosine", "steps"] = "cosine"
    milestones: tuple[int, ...] = (12, 16)
    gamma: float = 0.2
    #: Random resized crop + horizontal flip of the training images each step.
    augment: bool = True
    crop_scale: tuple[float, float] = (0.08, 1.0)

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batch_size < 1:
            raise ValueError("epochs and batch_size must be >= 1")
        if self.backbone_lr < 0 or self.head_lr <= 0 or self.weight_decay < 0:
            raise ValueError("need backbone_lr >= 0, head_lr > 0, weight_decay >= 0")
        if self.schedule not in ("cosine", "steps"):
            raise ValueError(f"schedule must be 'cosine' or 'steps', got {self.schedule!r}")


METHODS = ("vicreg", "swav", "simsiam", "generic")

_LINEAR: dict[str, dict[float, LinearProbeConfig]] = {
    "vicreg": {0.01: LinearProbeConfig(lr=0.02, weight_decay=1e-4),
               0.1: LinearProbeConfig(lr=0.02, weight_decay=1e-4),
               1.0: LinearProbeConfig(lr=0.02, weight_decay=1e-6)},
    "swav": {0.01: LinearProbeConfig(lr=0.3, weight_decay=1e-6)},
    "simsiam": {0.01: LinearProbeConfig(lr=2.0, weight_decay=0.0, optimizer="lars"),
                0.1: LinearProbeConfig(lr=0.2, batch_size=2048, weight_decay=0.0,
                                       optimizer="lars"),
                1.0: LinearProbeConfig(lr=0.1, batch_size=2048, weight_decay=0.0,
                                       optimizer="lars")},
    # Not from the paper: a robust default for other encoders (standardized features).
    "generic": {0.01: LinearProbeConfig(lr=0.1, weight_decay=1e-6, standardize=True)},
}

_FINETUNE: dict[str, dict[float, FinetuneConfig]] = {
    "vicreg": {0.01: FinetuneConfig(backbone_lr=0.03, head_lr=0.08, schedule="cosine"),
               0.1: FinetuneConfig(backbone_lr=0.01, head_lr=0.1, schedule="cosine")},
    "swav": {0.01: FinetuneConfig(backbone_lr=0.02, head_lr=5.0, schedule="steps"),
             0.1: FinetuneConfig(backbone_lr=0.01, head_lr=0.2, schedule="steps")},
    "generic": {0.01: FinetuneConfig(backbone_lr=0.01, head_lr=0.1, schedule="cosine")},
}


def _pick(table: dict[str, dict[float, object]], method: str, fraction: float, what: str):
    if method not in table:
        raise ValueError(f"no {what} preset for method {method!r}; known: {', '.join(table)}")
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    listed = sorted(table[method])
    below = [f for f in listed if f <= fraction + 1e-12]
    return table[method][below[-1] if below else listed[0]]


def linear_settings(method: str, fraction: float, **overrides: object) -> LinearProbeConfig:
    """The paper's linear-probe settings for ``method`` at ``fraction``, with overrides."""
    return replace(_pick(_LINEAR, method, fraction, "linear-probe"), **overrides)  # type: ignore[arg-type]


def finetune_settings(method: str, fraction: float, **overrides: object) -> FinetuneConfig:
    """The paper's semi-supervised fine-tuning settings for ``method`` at ``fraction``."""
    return replace(_pick(_FINETUNE, method, fraction, "fine-tuning"), **overrides)  # type: ignore[arg-type]


def relative_grid(specs: list[tuple[float | None, tuple[tuple[bool, float], ...]]],
                  field: str, method: str, fractions: tuple[float, ...],
                  **overrides: object) -> dict[float, tuple[float, ...]]:
    """A linear-probe grid per fraction from ``--lr-grid`` / ``--wd-grid`` specs: each spec is
    ``(fraction or None for all, ((relative, value), ...))``; a relative value is a multiple of
    the fraction's preset ``field`` (``lr`` or ``weight_decay``, with ``overrides``)."""
    out: dict[float, tuple[float, ...]] = {}
    for fraction, values in specs:
        if fraction is not None and fraction not in fractions:
            flag = "--lr-grid" if field == "lr" else "--wd-grid"
            raise ValueError(f"{flag} names fraction {fraction:g}, which is not in --fractions")
        for f in ([fraction] if fraction is not None else fractions):
            preset = getattr(linear_settings(method, f, **overrides), field)
            out[f] = tuple(v * preset if rel else v for rel, v in values)
    return out
