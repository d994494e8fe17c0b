"""SimSiam (Chen & He, 2021) as in the official ``simsiam/builder.py`` and ``main_simsiam.py``."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from e2mc.methods.base import CollapseValue, MethodOutput, SSLMethod
from e2mc.methods.common import check_views, resolve_backbone
from e2mc.methods.heads import mlp, simsiam_predictor
from e2mc.ranges import above, at_least, between


def simsiam_loss(p1: torch.Tensor, p2: torch.Tensor, z1: torch.Tensor, z2: torch.Tensor
                 ) -> torch.Tensor:
    """Symmetric negative cosine with stop-gradient on the targets:
    ``-(cos(p1, sg(z2)).mean() + cos(p2, sg(z1)).mean()) / 2``."""
    return -(F.cosine_similarity(p1.float(), z2.detach().float(), dim=1).mean()
             + F.cosine_similarity(p2.float(), z1.detach().float(), dim=1).mean()) * 0.5


def sgd_with_predictor_group(method: nn.Module, lr: float, weight_decay: float,
                             predictor_lr: float, momentum: float) -> torch.optim.SGD:
    """SimSiam's SGD: groups ``[backbone + projector (fix_lr False), predictor (fix_lr True)]``;
    a scheduler must leave groups with ``fix_lr=True`` at their own learning rate."""
    encoder = [*method.backbone.parameters(), *method.projector.parameters()]
    return torch.optim.SGD(
        [{"params": encoder, "fix_lr": False, "lr": lr},
         {"params": list(method.predictor.parameters()), "fix_lr": True, "lr": predictor_lr}],
        lr=lr, momentum=momentum, weight_decay=weight_decay)


class SimSiam(SSLMethod):
    """SimSiam: backbone + projector (official ``encoder.fc`` layout: two hidden layers of the
    backbone's width without bias, a Linear whose bias is frozen, ``BatchNorm1d(dim,
    affine=False)``; indices 0,1,3,4,6,7) + predictor.

    The add-on gets the projector outputs ``z1, z2`` (before the predictor, not detached).
    """

    name = "simsiam"
    view_recipe = "simsiam"
    compact_space = "hypersphere"
    collapse = CollapseValue("base/negative_cosine", -1.0, 0.01,
                             "-1, the negative cosine of identical outputs")
    param_ranges = {"dim": at_least(1), "pred_dim": at_least(1), "predictor_lr": above(0),
                    "feature_dim": at_least(1)}
    optimizer_ranges = {"predictor_lr": above(0), "momentum": between(0, 1, high_open=True)}

    def __init__(self, backbone: str | nn.Module = "resnet50", small_images: bool = False,
                 in_channels: int = 3, dim: int = 2048, pred_dim: int = 512,
                 predictor_lr: float | None = None, feature_dim: int | None = None) -> None:
        super().__init__()
        self.backbone, self.feature_dim, bb_hparams = resolve_backbone(
            backbone, small_images, in_channels, feature_dim)
        d = self.feature_dim
        self.projector = mlp([d, d, d, dim], hidden_bias=False, last_bias=True, last_bn=True)
        self.projector[6].bias.requires_grad_(False)  # the official "hack": BN follows it
        self.predictor = simsiam_predictor(dim, pred_dim)
        self.predictor_lr = predictor_lr
        self.record_hparams(bb_hparams)

    def forward(self, views: Sequence[torch.Tensor]) -> MethodOutput:
        check_views(views, 2, "SimSiam")
        z1, z2 = (self.projector(self.backbone(v)) for v in views[:2])
        p1, p2 = self.predictor(z1), self.predictor(z2)
        loss = simsiam_loss(p1, p2, z1, z2)
        return MethodOutput(loss=loss, terms={"negative_cosine": loss.detach()},
                            embeddings=[z1, z2])

    def build_optimizer(self, lr: float, weight_decay: float, predictor_lr: float | None = None,
                        momentum: float = 0.9) -> torch.optim.Optimizer:
        """SGD (momentum 0.9); the predictor group has the fixed ``predictor_lr`` (argument,
        else the constructor's, else ``lr``) and ``fix_lr=True``."""
        if predictor_lr is None:
            predictor_lr = self.predictor_lr if self.predictor_lr is not None else lr
        return sgd_with_predictor_group(self, lr, weight_decay, predictor_lr, momentum)
