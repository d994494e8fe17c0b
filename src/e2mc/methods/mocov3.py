"""MoCo v3 (Chen, Xie and He, 2021) as in the official ``moco/builder.py`` and ``main_moco.py``
(facebookresearch/moco-v3): ResNet and ViT backbones."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from e2mc.distributed import gather_with_grad, rank
from e2mc.methods.base import MethodOutput
from e2mc.methods.common import check_views, resolve_backbone
from e2mc.methods.ema import MOMENTUM_SCHEDULES, EMAMethod
from e2mc.methods.heads import moco_mlp
from e2mc.methods.vicreg import lars_param_groups
from e2mc.optim import LARS
from e2mc.ranges import Each, OneOf, above, at_least, between

OPTIMIZERS = ("lars", "adamw")


def mocov3_loss(q: torch.Tensor, k: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``contrastive_loss`` of MoCo v3: queries ``q`` of this process (``[n, d]``) against the keys
    of every process (``k`` gathered without gradient, ``N`` rows), both L2-normalised, logits
    ``q k^T / T``, the positive of query ``i`` the key of the same image (row ``i`` of this
    process's block), ``cross_entropy * 2 T``. In float32."""
    q = F.normalize(q.float(), dim=1)
    k = gather_with_grad(F.normalize(k.detach().float(), dim=1))
    labels = torch.arange(q.shape[0], device=q.device) + rank() * q.shape[0]
    with torch.autocast(q.device.type, enabled=False):  # float32 logits under AMP
        return F.cross_entropy(q @ k.T / temperature, labels) * (2 * temperature)


def freeze_patch_embedding(backbone: nn.Module) -> None:
    """No gradient for a timm ViT's patch projection and position embedding (moco-v3's
    ``stop_grad_conv1`` and fixed sin-cos embedding); ``ValueError`` for another backbone."""
    proj = getattr(getattr(backbone, "patch_embed", None), "proj", None)
    pos = getattr(backbone, "pos_embed", None)
    if not isinstance(proj, nn.Module) or not isinstance(pos, nn.Parameter):
        raise ValueError("method.params.frozen_patch_embedding needs a ViT backbone (a patch "
                         f"projection and a position embedding); {type(backbone).__name__} "
                         "has none")
    proj.requires_grad_(False)
    pos.requires_grad_(False)


class MoCoV3(EMAMethod):
    """MoCo v3: base encoder (``backbone`` + ``projector``), ``predictor``, and the momentum
    encoder ``teacher.backbone`` + ``teacher.projector``. ``projector_layers`` 2 and
    ``predictor_last_bn`` false for ResNets, 3 and true for ViTs (the official ``MoCo_ResNet`` and
    ``MoCo_ViT``). Loss ``ctr(q1, k2) + ctr(q2, k1)``. The add-on gets the base encoder's
    projector outputs (hypersphere). ``frozen_patch_embedding``: :func:`freeze_patch_embedding`."""

    name = "mocov3"
    view_recipe = "vicreg"  # BYOL's asymmetric augmentations, as the official runs
    compact_space = "hypersphere"
    student_parts = ("backbone", "projector")
    param_ranges = {"dim": at_least(1), "mlp_dim": at_least(1), "projector_layers": at_least(1),
                    "temperature": above(0),
                    "momentum": between(0, 1),  # 1: a frozen momentum encoder
                    "momentum_schedule": OneOf(MOMENTUM_SCHEDULES),
                    "feature_dim": at_least(1)}
    optimizer_ranges = {"optimizer": OneOf(OPTIMIZERS), "eta": above(0),
                        "momentum": between(0, 1, high_open=True),
                        "betas": Each(between(0, 1, high_open=True), length=2)}

    def __init__(self, backbone: str | nn.Module = "resnet50", small_images: bool = False,
                 in_channels: int = 3, dim: int = 256, mlp_dim: int = 4096,
                 projector_layers: int = 2, predictor_last_bn: bool = False,
                 temperature: float = 1.0, momentum: float = 0.99,
                 feature_dim: int | None = None, momentum_schedule: str = "constant",
                 frozen_patch_embedding: bool = False) -> None:
        super().__init__()
        self.backbone, self.feature_dim, bb_hparams = resolve_backbone(
            backbone, small_images, in_channels, feature_dim)
        if frozen_patch_embedding:
            freeze_patch_embedding(self.backbone)
        self.projector = moco_mlp(projector_layers, self.feature_dim, mlp_dim, dim)
        self.predictor = moco_mlp(2, dim, mlp_dim, dim, last_bn=predictor_last_bn)
        self.temperature = float(temperature)
        self.init_teacher(momentum, momentum_schedule)
        self.record_hparams(bb_hparams)

    def forward(self, views: Sequence[torch.Tensor]) -> MethodOutput:
        check_views(views, 2, "MoCo v3")
        (z1, z2), (q1, q2), (k1, k2) = self.online_and_target(views)
        loss = mocov3_loss(q1, k2, self.temperature) + mocov3_loss(q2, k1, self.temperature)
        return MethodOutput(loss=loss, terms={"contrastive": loss.detach()}, embeddings=[z1, z2])

    def build_optimizer(self, lr: float, weight_decay: float, optimizer: str = "lars",
                        eta: float = 0.001, momentum: float = 0.9,
                        betas: tuple[float, float] = (0.9, 0.999)) -> torch.optim.Optimizer:
        """``lars`` (ResNets: momentum 0.9, eta 0.001, biases and norms excluded from weight decay
        and adaptation) or ``adamw`` (ViTs: every parameter decayed), over the base encoder and
        the predictor."""
        if optimizer == "adamw":
            params = [p for p in self.parameters() if p.requires_grad]
            return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay,
                                     betas=tuple(betas))  # type: ignore[arg-type]
        return LARS(lars_param_groups(self, weight_decay), lr=lr, weight_decay=weight_decay,
                    momentum=momentum, eta=eta)
