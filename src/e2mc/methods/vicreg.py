"""VICReg (Bardes et al., 2022) as in the official ``main_vicreg.py``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from e2mc.criterion import covariance_penalty, vicreg_variance
from e2mc.distributed import gather_with_grad
from e2mc.methods.base import CollapseValue, MethodOutput, SSLMethod
from e2mc.methods.common import check_views, resolve_backbone
from e2mc.methods.heads import vicreg_projector
from e2mc.optim import LARS
from e2mc.ranges import Widths, above, at_least, between

#: VICReg's ``std = sqrt(var + 1e-4)``: the variance hinge of a constant dimension.
VICREG_VARIANCE_FLOOR = 1.0 - math.sqrt(1e-4)


def vicreg_loss(x: torch.Tensor, y: torch.Tensor, sim_coeff: float = 25.0,
                std_coeff: float = 25.0, cov_coeff: float = 1.0
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """VICReg's loss on this process's projections ``x, y`` (``[n, d]``).

    Invariance: ``mse(x, y)`` on the local batch. Variance and covariance on the batch gathered
    over processes (with gradients): centre, ``std = sqrt(var + 1e-4)``, variance
    ``mean(relu(1 - std_x))/2 + mean(relu(1 - std_y))/2``, covariance
    ``sum_offdiag(C_x^2)/d + sum_offdiag(C_y^2)/d`` with ``C = x^T x / (n - 1)``. Statistics are
    computed in float32. Returns the weighted loss and the unweighted terms (detached).
    """
    x, y = x.float(), y.float()
    repr_loss = F.mse_loss(x, y)
    x = gather_with_grad(x)
    y = gather_with_grad(y)
    n, d = x.shape
    if n < 2:
        raise ValueError("VICReg's variance and covariance need a batch of at least 2")
    x = x - x.mean(dim=0)
    y = y - y.mean(dim=0)
    std_loss = vicreg_variance(x) / 2 + vicreg_variance(y) / 2
    cov_loss = covariance_penalty(x) + covariance_penalty(y)  # Gram path when n < d
    loss = sim_coeff * repr_loss + std_coeff * std_loss + cov_coeff * cov_loss
    terms = {"invariance": repr_loss.detach(), "variance": std_loss.detach(),
             "covariance": cov_loss.detach()}
    return loss, terms


def lars_param_groups(module: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """VICReg's ``exclude_bias_and_norm``: 1-D parameters get no weight decay and no adaptation."""
    params = [p for p in module.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.ndim != 1], "weight_decay": weight_decay,
         "lars_adaptation": True},
        {"params": [p for p in params if p.ndim == 1], "weight_decay": 0.0,
         "lars_adaptation": False},
    ]


class LARSPreset(SSLMethod):
    """A method whose optimizer preset is LARS (momentum 0.9, eta 0.001) with the 1-D parameters
    (biases, norms) excluded from weight decay and adaptation: VICReg's, and the recipe of Barlow
    Twins (whose official biases take 0.024 / 0.2 of the weights' learning rate; here they share
    it), BYOL and SimCLR."""

    optimizer_ranges = {"eta": above(0), "momentum": between(0, 1, high_open=True)}

    def build_optimizer(self, lr: float, weight_decay: float, eta: float = 0.001,
                        momentum: float = 0.9) -> torch.optim.Optimizer:
        return LARS(lars_param_groups(self, weight_decay), lr=lr, weight_decay=weight_decay,
                    momentum=momentum, eta=eta)  # an EMA teacher's parameters need no gradient


class VICReg(LARSPreset):
    """VICReg: backbone + projector (official layout ``projector.{0,1,3,4,6}`` for
    ``"8192-8192-8192"``); the add-on gets the raw projector outputs of both views."""

    name = "vicreg"
    view_recipe = "vicreg"
    compact_space = "hypercube"
    collapse = CollapseValue("base/variance", VICREG_VARIANCE_FLOOR, 0.05,  # a learning run: ~0
                             f"the variance floor {VICREG_VARIANCE_FLOOR:.2f} (every dimension "
                             "constant over the batch)")
    param_ranges = {"projector": Widths(), "sim_coeff": at_least(0), "std_coeff": at_least(0),
                    "cov_coeff": at_least(0), "feature_dim": at_least(1)}

    def __init__(self, backbone: str | nn.Module = "resnet50", small_images: bool = False,
                 in_channels: int = 3, projector: str = "8192-8192-8192",
                 sim_coeff: float = 25.0, std_coeff: float = 25.0, cov_coeff: float = 1.0,
                 feature_dim: int | None = None) -> None:
        super().__init__()
        self.backbone, self.feature_dim, bb_hparams = resolve_backbone(
            backbone, small_images, in_channels, feature_dim)
        self.projector = vicreg_projector(self.feature_dim, projector)
        self.sim_coeff, self.std_coeff, self.cov_coeff = sim_coeff, std_coeff, cov_coeff
        self.record_hparams(bb_hparams)

    def forward(self, views: Sequence[torch.Tensor]) -> MethodOutput:
        check_views(views, 2, "VICReg")
        x, y = (self.projector(self.backbone(v)) for v in views[:2])
        loss, terms = vicreg_loss(x, y, self.sim_coeff, self.std_coeff, self.cov_coeff)
        return MethodOutput(loss=loss, terms=terms, embeddings=[x, y])
