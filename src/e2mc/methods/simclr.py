"""SimCLR (Chen et al., 2020): NT-Xent over the global batch."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from e2mc.distributed import gather_with_grad, rank
from e2mc.methods.base import MethodOutput
from e2mc.methods.common import check_views, resolve_backbone
from e2mc.methods.heads import moco_mlp
from e2mc.methods.vicreg import LARSPreset
from e2mc.ranges import above, at_least


def nt_xent_loss(z1: torch.Tensor, z2: torch.Tensor, temperature: float = 0.1) -> torch.Tensor:
    """NT-Xent on this process's projections ``z1, z2`` (``[n, d]``, normalised here), with the
    other processes' as negatives: both views are gathered with gradients (``N`` rows each); the
    anchor ``z1_i`` is scored against every ``z2`` (its positive is its own row) and every other
    ``z1``, and symmetrically for ``z2_i``; the loss is the mean cross-entropy over the ``2n``
    local anchors (``2N - 2`` negatives each). Under DDP the averaged gradient is the global
    batch's. In float32."""
    z1 = F.normalize(z1.float(), dim=1)
    z2 = F.normalize(z2.float(), dim=1)
    n = z1.shape[0]
    g1, g2 = gather_with_grad(z1), gather_with_grad(z2)
    if g1.shape[0] < 2:
        raise ValueError("NT-Xent needs a global batch of at least 2 (one negative)")
    labels = torch.arange(n, device=z1.device) + rank() * n
    self_mask = F.one_hot(labels, g1.shape[0]).bool()
    losses = []
    with torch.autocast(z1.device.type, enabled=False):  # float32 logits under AMP
        for a, same, other in ((z1, g1, g2), (z2, g2, g1)):
            logits_other = a @ other.T / temperature
            logits_same = (a @ same.T / temperature).masked_fill(self_mask, float("-inf"))
            logits = torch.cat([logits_other, logits_same], dim=1)
            losses.append(F.cross_entropy(logits, labels))
    return (losses[0] + losses[1]) / 2


class SimCLR(LARSPreset):
    """SimCLR: backbone and ``projector`` (Linear without bias, BN, ReLU, Linear without bias,
    ``BatchNorm1d`` without affine: the 2-layer head with BN of SimCLR v2's code, as MoCo v3
    builds it). The add-on gets the projector outputs before the loss's L2 normalisation
    (hypersphere)."""

    name = "simclr"
    view_recipe = "simsiam"  # crop, flip, colour jitter p 0.8, grayscale p 0.2, blur p 0.5
    compact_space = "hypersphere"
    param_ranges = {"hidden_dim": at_least(1),  # None: the backbone's feature size
                    "dim": at_least(1), "temperature": above(0), "feature_dim": at_least(1)}
    # no collapse value: a collapsed model's loss, ln(2N - 1), depends on the global batch

    def __init__(self, backbone: str | nn.Module = "resnet50", small_images: bool = False,
                 in_channels: int = 3, hidden_dim: int | None = None, dim: int = 128,
                 temperature: float = 0.1, feature_dim: int | None = None) -> None:
        super().__init__()
        self.backbone, self.feature_dim, bb_hparams = resolve_backbone(
            backbone, small_images, in_channels, feature_dim)
        hidden = self.feature_dim if hidden_dim is None else hidden_dim
        self.projector = moco_mlp(2, self.feature_dim, hidden, dim)
        self.temperature = float(temperature)
        self.record_hparams(bb_hparams, hidden_dim=hidden)

    def forward(self, views: Sequence[torch.Tensor]) -> MethodOutput:
        check_views(views, 2, "SimCLR")
        z1, z2 = (self.projector(self.backbone(v)) for v in views[:2])
        loss = nt_xent_loss(z1, z2, self.temperature)
        return MethodOutput(loss=loss, terms={"nt_xent": loss.detach()}, embeddings=[z1, z2])
