"""LARS (VICReg) and LARC (SwAV, SimSiam's probe), as the authors' code has them, and the
learning-rate schedules."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.optim import Optimizer

#: apex LARC's trust coefficient and epsilon as SwAV and SimSiam's linear protocol use them.
LARC_TRUST, LARC_EPS = 0.001, 1e-8


def larc_trust_ratio(param_norm: torch.Tensor, grad_norm: torch.Tensor,
                     weight_decay: float | torch.Tensor, trust: float = LARC_TRUST,
                     eps: float = LARC_EPS) -> torch.Tensor:
    """apex LARC's ``trust ||p|| / (||g|| + wd ||p|| + eps)`` (where both norms are non-zero),
    shared with the batched probe."""
    return trust * param_norm / (grad_norm + param_norm * weight_decay + eps)


def cosine_factor(step: float, total: float, final_fraction: float = 0.0) -> float:
    """Cosine decay from 1 at ``step`` 0 to ``final_fraction`` at ``total`` and after."""
    progress = min(step / max(total, 1), 1.0)
    return final_fraction + (1 - final_fraction) * 0.5 * (1 + math.cos(math.pi * progress))


def lr_factor(step: int, total_steps: int, schedule: str, warmup_steps: int = 0,
              final_fraction: float = 0.0) -> float:
    """Multiplier of the peak learning rate at 0-based ``step``: ``constant`` 1; ``cosine``
    warms up linearly over ``warmup_steps``, then decays to ``final_fraction``."""
    if schedule == "constant":
        return 1.0
    if schedule != "cosine":
        raise ValueError(f"unknown schedule {schedule!r}")
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    return cosine_factor(step - warmup_steps, total_steps - warmup_steps, final_fraction)


def set_scheduled_lr(optimizer: Optimizer, step: int, total_steps: int, schedule: str,
                     warmup_steps: int = 0, final_fraction: float = 0.0) -> float:
    """Set each group's ``lr`` to ``initial_lr`` times :func:`lr_factor` (not ``fix_lr``
    groups); returns the first group's."""
    factor = lr_factor(step, total_steps, schedule, warmup_steps, final_fraction)
    for group in optimizer.param_groups:
        if not group.get("fix_lr", False):
            group["lr"] = group["initial_lr"] * factor
    return float(optimizer.param_groups[0]["lr"])


def set_scheduled_weight_decay(optimizer: Optimizer, step: int, total_steps: int,
                               end: float) -> None:
    """Cosine weight decay from each group's initial value (groups with none stay 0) to ``end``
    at ``total_steps`` (DINO's schedule)."""
    progress = min(max(step / max(total_steps, 1), 0.0), 1.0)
    for group in optimizer.param_groups:
        start = group.setdefault("initial_weight_decay", group.get("weight_decay", 0.0))
        if start > 0:
            group["weight_decay"] = end + (start - end) * (math.cos(math.pi * progress) + 1) / 2


class LARS(Optimizer):
    """LARS as in VICReg's ``main_vicreg.py`` (buffer ``mu``, so official optimizer states load).

    ``d = g + wd * p``; with ``lars_adaptation`` ``d *= eta * ||p|| / ||d||`` (1 when a norm is
    0); ``mu = momentum * mu + d``; ``p -= lr * mu``."""

    momentum_key = "mu"

    def __init__(self, params: Iterable[Any], lr: float, weight_decay: float = 0.0,
                 momentum: float = 0.9, eta: float = 0.001, lars_adaptation: bool = True) -> None:
        if lr < 0 or weight_decay < 0 or not 0 <= momentum < 1 or eta <= 0:
            raise ValueError(f"invalid LARS settings: lr={lr}, weight_decay={weight_decay}, "
                             f"momentum={momentum}, eta={eta}")
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, eta=eta,
                        lars_adaptation=lars_adaptation)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                dp = p.grad
                if group["weight_decay"] != 0:
                    dp = dp.add(p, alpha=group["weight_decay"])
                if group["lars_adaptation"]:
                    param_norm = torch.linalg.vector_norm(p)
                    update_norm = torch.linalg.vector_norm(dp)
                    q = torch.where((param_norm > 0) & (update_norm > 0),
                                    group["eta"] * param_norm / update_norm, 1.0)
                    dp = dp.mul(q)
                state = self.state[p]
                if "mu" not in state:
                    state["mu"] = torch.zeros_like(p)
                mu = state["mu"]
                mu.mul_(group["momentum"]).add_(dp)
                p.add_(mu, alpha=-group["lr"])
        return loss


class LARC(torch.optim.SGD):
    """SGD with apex's LARC trust-ratio rescaling, as SwAV uses it.

    For non-zero ``||p||`` and ``||g||``: ``a = trust * ||p|| / (||g|| + wd * ||p|| + eps)``
    (``clip``: ``min(a / lr, 1)``); ``g = (g + wd * p) * a``; the SGD step runs without weight
    decay, so a zero-norm parameter gets none, exactly as in apex."""

    momentum_key = "momentum_buffer"

    def __init__(self, params: Iterable[Any], lr: float, momentum: float = 0.9,
                 weight_decay: float = 0.0, trust_coefficient: float = LARC_TRUST,
                 clip: bool = False, eps: float = LARC_EPS) -> None:
        if trust_coefficient <= 0:
            raise ValueError(f"trust_coefficient must be > 0, got {trust_coefficient}")
        super().__init__(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
        self.trust_coefficient, self.clip, self.eps = trust_coefficient, clip, eps

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        weight_decays = []
        for group in self.param_groups:
            weight_decay = group["weight_decay"]
            weight_decays.append(weight_decay)
            group["weight_decay"] = 0
            for p in group["params"]:
                if p.grad is None:
                    continue
                param_norm = torch.linalg.vector_norm(p)
                grad_norm = torch.linalg.vector_norm(p.grad)
                if param_norm != 0 and grad_norm != 0:
                    adaptive_lr = larc_trust_ratio(param_norm, grad_norm, weight_decay,
                                                   self.trust_coefficient, self.eps)
                    if self.clip:
                        adaptive_lr = torch.clamp(adaptive_lr / group["lr"], max=1.0)
                    p.grad.add_(p, alpha=weight_decay)
                    p.grad.mul_(adaptive_lr)
        try:
            loss = super().step(closure)
        finally:
            for group, weight_decay in zip(self.param_groups, weight_decays, strict=True):
                group["weight_decay"] = weight_decay
        return loss
