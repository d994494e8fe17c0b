"""Barlow Twins (Zbontar et al., 2021) as in the official ``main.py`` of the
facebookresearch/barlowtwins repository."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from e2mc.distributed import gather_with_grad
from e2mc.methods.base import MethodOutput
from e2mc.methods.common import check_views, resolve_backbone
from e2mc.methods.heads import mlp, parse_mlp_spec
from e2mc.methods.vicreg import LARSPreset
from e2mc.ranges import Widths, at_least


def off_diagonal(c: torch.Tensor) -> torch.Tensor:
    """The off-diagonal entries of a square matrix, flattened."""
    n = c.shape[0]
    return c.flatten()[:-1].view(n - 1, n + 1)[:, 1:].flatten()


def barlowtwins_loss(z1: torch.Tensor, z2: torch.Tensor, bn: nn.Module, lambd: float = 0.0051
                     ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Barlow Twins' loss on this process's projector outputs ``z1, z2`` (``[n, d]``): both are
    gathered over processes with gradients, standardised per dimension over the global batch by
    ``bn`` (``BatchNorm1d(d, affine=False)`` in training mode: the batch mean and biased variance,
    eps 1e-5), ``c = bn(z1)^T bn(z2) / N``, loss ``sum_i (1 - c_ii)^2 + lambd sum_{i!=j} c_ij^2``.
    In float32. The official code all-reduces ``c`` without gradient; here every process
    computes the loss of the global batch and the gradient is that of the global batch."""
    z1, z2 = gather_with_grad(z1.float()), gather_with_grad(z2.float())
    if z1.shape[0] < 2:
        raise ValueError("Barlow Twins' batch normalisation needs a batch of at least 2")
    with torch.autocast(z1.device.type, enabled=False):
        c = bn(z1).T @ bn(z2) / z1.shape[0]
    on_diag = torch.diagonal(c).add(-1).pow(2).sum()
    off_diag = off_diagonal(c).pow(2).sum()
    loss = on_diag + lambd * off_diag
    return loss, {"on_diagonal": on_diag.detach(), "off_diagonal": off_diag.detach()}


class BarlowTwins(LARSPreset):
    """Barlow Twins: backbone, ``projector`` (official layout ``projector.{0,1,3,4,6}`` for
    ``"8192-8192-8192"``, Linear layers without bias) and ``bn`` (``BatchNorm1d`` without affine
    parameters). The add-on gets the raw projector outputs of both views (unnormalised:
    hypercube)."""

    name = "barlowtwins"
    view_recipe = "vicreg"  # BYOL's asymmetric augmentations, which VICReg took from Barlow Twins
    compact_space = "hypercube"
    param_ranges = {"projector": Widths(), "lambd": at_least(0), "feature_dim": at_least(1)}

    def __init__(self, backbone: str | nn.Module = "resnet50", small_images: bool = False,
                 in_channels: int = 3, projector: str = "8192-8192-8192", lambd: float = 0.0051,
                 feature_dim: int | None = None) -> None:
        super().__init__()
        self.backbone, self.feature_dim, bb_hparams = resolve_backbone(
            backbone, small_images, in_channels, feature_dim)
        widths = parse_mlp_spec(projector)
        self.projector = mlp([self.feature_dim, *widths], hidden_bias=False)
        self.bn = nn.BatchNorm1d(widths[-1], affine=False)
        self.lambd = float(lambd)
        self.record_hparams(bb_hparams)

    def forward(self, views: Sequence[torch.Tensor]) -> MethodOutput:
        check_views(views, 2, "Barlow Twins")
        z1, z2 = (self.projector(self.backbone(v)) for v in views[:2])
        loss, terms = barlowtwins_loss(z1, z2, self.bn, self.lambd)
        return MethodOutput(loss=loss, terms=terms, embeddings=[z1, z2])
