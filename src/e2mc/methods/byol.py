"""BYOL (Grill et al., 2020): online network with a predictor, EMA target network."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from e2mc.methods.base import MethodOutput
from e2mc.methods.common import check_views, resolve_backbone
from e2mc.methods.ema import MOMENTUM_SCHEDULES, EMAMethod
from e2mc.methods.heads import mlp
from e2mc.methods.vicreg import LARSPreset
from e2mc.ranges import OneOf, at_least, between


def byol_loss(p1: torch.Tensor, p2: torch.Tensor, t1: torch.Tensor, t2: torch.Tensor
              ) -> torch.Tensor:
    """BYOL's symmetrised loss: ``mean(2 - 2 cos(p1, sg(t2))) + mean(2 - 2 cos(p2, sg(t1)))``
    (the squared distance of the L2-normalised prediction and target, paper Eq. 2). In float32."""
    def one(p: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return (2 - 2 * F.cosine_similarity(p.float(), t.detach().float(), dim=1)).mean()
    return one(p1, t2) + one(p2, t1)


class BYOL(EMAMethod, LARSPreset):
    """BYOL: online ``backbone``, ``projector`` and ``predictor`` (Linear, BN, ReLU, Linear;
    ``hidden_bias=False``: the first Linear without bias, lightly's; ``pred_hidden_dim``: the
    predictor's hidden width when it differs, as in some of solo-learn's runs), target
    ``teacher.backbone`` and ``teacher.projector``. The add-on gets the online projector outputs
    (before the predictor; the loss normalises them: hypersphere)."""

    name = "byol"
    view_recipe = "vicreg"  # BYOL's own asymmetric augmentations
    compact_space = "hypersphere"
    student_parts = ("backbone", "projector")
    param_ranges = {"hidden_dim": at_least(1), "dim": at_least(1),
                    "momentum": between(0, 1),  # 1: a frozen target
                    "momentum_schedule": OneOf(MOMENTUM_SCHEDULES),
                    "feature_dim": at_least(1),
                    "pred_hidden_dim": at_least(1)}  # None: hidden_dim

    def __init__(self, backbone: str | nn.Module = "resnet50", small_images: bool = False,
                 in_channels: int = 3, hidden_dim: int = 4096, dim: int = 256,
                 momentum: float = 0.996, feature_dim: int | None = None,
                 pred_hidden_dim: int | None = None, hidden_bias: bool = True,
                 momentum_schedule: str = "constant") -> None:
        super().__init__()
        self.backbone, self.feature_dim, bb_hparams = resolve_backbone(
            backbone, small_images, in_channels, feature_dim)
        pred_hidden = hidden_dim if pred_hidden_dim is None else pred_hidden_dim
        self.projector = mlp([self.feature_dim, hidden_dim, dim], hidden_bias, last_bias=True)
        self.predictor = mlp([dim, pred_hidden, dim], hidden_bias, last_bias=True)
        self.init_teacher(momentum, momentum_schedule)
        self.record_hparams(bb_hparams, pred_hidden_dim=pred_hidden)

    def forward(self, views: Sequence[torch.Tensor]) -> MethodOutput:
        check_views(views, 2, "BYOL")
        (z1, z2), (p1, p2), (t1, t2) = self.online_and_target(views)
        loss = byol_loss(p1, p2, t1, t2)
        return MethodOutput(loss=loss, terms={"byol": loss.detach()}, embeddings=[z1, z2])
