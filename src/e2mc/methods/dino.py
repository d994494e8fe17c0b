"""DINO (Caron et al., 2021) as in the official ``main_dino.py`` (facebookresearch/dino): student
and EMA teacher with the DINO head, centering, teacher temperature schedule, multi-crop; ViT
(timm names, e.g. ``timm:vit_small_patch16_224``) and ResNet backbones."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from e2mc.distributed import all_reduce_sum, world_size
from e2mc.methods.base import MethodOutput
from e2mc.methods.common import check_views, multicrop_features, resolve_backbone
from e2mc.methods.ema import MOMENTUM_SCHEDULES, EMAMethod
from e2mc.methods.heads import DINOHead
from e2mc.methods.vicreg import lars_param_groups
from e2mc.optim import LARS
from e2mc.ranges import OneOf, above, at_least, between

OPTIMIZERS = ("adamw", "sgd", "lars")


def teacher_temperature(epoch: int, teacher_temp: float, warmup_teacher_temp: float,
                        warmup_epochs: int) -> float:
    """DINOLoss's ``teacher_temp_schedule[epoch]``: ``linspace(warmup_teacher_temp,
    teacher_temp, warmup_epochs)`` for the first ``warmup_epochs`` epochs, then ``teacher_temp``."""
    if epoch >= warmup_epochs:
        return teacher_temp
    if warmup_epochs == 1:
        return warmup_teacher_temp
    return warmup_teacher_temp + (teacher_temp - warmup_teacher_temp) * epoch / (warmup_epochs - 1)


def dino_loss(student_output: torch.Tensor, teacher_output: torch.Tensor, center: torch.Tensor,
              n_crops: int, student_temp: float, teacher_temp: float) -> torch.Tensor:
    """DINOLoss.forward: the teacher's sharpened, centred softmax of each of its 2 global crops
    against the student's log-softmax of every other crop, averaged over the pairs. In float32.
    ``student_output``: ``[n_crops * B, K]``; ``teacher_output``: ``[2 * B, K]``."""
    student_out = (student_output.float() / student_temp).chunk(n_crops)
    teacher_out = F.softmax((teacher_output.float() - center) / teacher_temp, dim=-1)
    teacher_out = teacher_out.detach().chunk(2)
    total, terms = student_output.new_zeros((), dtype=torch.float32), 0
    for iq, q in enumerate(teacher_out):
        for v, s in enumerate(student_out):
            if v == iq:
                continue
            total = total + torch.sum(-q * F.log_softmax(s, dim=-1), dim=-1).mean()
            terms += 1
    return total / terms


@torch.no_grad()
def updated_center(center: torch.Tensor, teacher_output: torch.Tensor,
                   momentum: float) -> torch.Tensor:
    """DINOLoss.update_center: the EMA of the teacher outputs' mean over the global batch."""
    batch_center = all_reduce_sum(torch.sum(teacher_output.float(), dim=0, keepdim=True))
    batch_center = batch_center / (len(teacher_output) * world_size())
    return center * momentum + batch_center * (1 - momentum)


class DINO(EMAMethod):
    """DINO: student ``backbone`` + ``head`` (:class:`~e2mc.methods.heads.DINOHead`), teacher
    ``teacher.backbone`` + ``teacher.head``, ``center`` (a buffer). ``views``: the 2 global crops
    first, then the local crops; the teacher sees the global crops only.

    The add-on gets the student's bottleneck outputs of the 2 global crops (the 256-d embedding
    before the L2 normalisation and the prototype layer: hypersphere); ``all_embeddings``: every
    crop's. ``freeze_last_layer`` epochs drop the prototype layer's gradient, and ``clip_grad``
    clips each parameter's gradient norm (0: off), as the official loop does.
    """

    name = "dino"
    view_recipe = "swav"  # multi-crop: 2 global + 6 local crops
    compact_space = "hypersphere"
    student_parts = ("backbone", "head")
    param_ranges = {
        "out_dim": at_least(2),  # one prototype: every softmax is 1, the loss 0
        "hidden_dim": at_least(1), "bottleneck_dim": at_least(1), "nlayers": at_least(1),
        "momentum": between(0, 1),  # 1: a frozen teacher
        "momentum_schedule": OneOf(MOMENTUM_SCHEDULES),
        "teacher_temp": above(0), "warmup_teacher_temp": above(0),
        "warmup_teacher_temp_epochs": at_least(0), "student_temp": above(0),
        "center_momentum": between(0, 1), "freeze_last_layer": at_least(0),
        "clip_grad": at_least(0),  # 0: off
        "feature_dim": at_least(1)}
    optimizer_ranges = {"optimizer": OneOf(OPTIMIZERS), "momentum": between(0, 1, high_open=True),
                        "eta": above(0)}

    def __init__(self, backbone: str | nn.Module = "timm:vit_small_patch16_224",
                 small_images: bool = False, in_channels: int = 3, out_dim: int = 65536,
                 hidden_dim: int = 2048, bottleneck_dim: int = 256, nlayers: int = 3,
                 use_bn_in_head: bool = False, norm_last_layer: bool = True,
                 momentum: float = 0.996, teacher_temp: float = 0.04,
                 warmup_teacher_temp: float = 0.04, warmup_teacher_temp_epochs: int = 0,
                 student_temp: float = 0.1, center_momentum: float = 0.9,
                 freeze_last_layer: int = 1, clip_grad: float = 3.0,
                 feature_dim: int | None = None, momentum_schedule: str = "constant") -> None:
        super().__init__()
        self.backbone, self.feature_dim, bb_hparams = resolve_backbone(
            backbone, small_images, in_channels, feature_dim)
        self.head = DINOHead(self.feature_dim, out_dim, use_bn_in_head, norm_last_layer,
                             nlayers, hidden_dim, bottleneck_dim)
        self.register_buffer("center", torch.zeros(1, out_dim))
        self.teacher_temp, self.warmup_teacher_temp = teacher_temp, warmup_teacher_temp
        self.warmup_teacher_temp_epochs = warmup_teacher_temp_epochs
        self.student_temp, self.center_momentum = student_temp, center_momentum
        self.freeze_last_layer, self.clip_grad = freeze_last_layer, clip_grad
        self.epoch = 0
        self.init_teacher(momentum, momentum_schedule)
        self.record_hparams(bb_hparams)

    def set_epoch(self, epoch: int) -> None:
        """The epoch (counting the base model's) picks the teacher temperature and whether the
        prototype layer is frozen."""
        self.epoch = int(epoch)

    def after_backward(self, iteration: int) -> None:
        """``clip_gradients`` (each parameter's gradient norm at most ``clip_grad``), then
        ``cancel_gradients_last_layer`` during the first ``freeze_last_layer`` epochs."""
        if self.clip_grad > 0:
            for p in [*self.backbone.parameters(), *self.head.parameters()]:
                clip_coef = None if p.grad is None else self.clip_grad / (p.grad.norm(2) + 1e-6)
                if clip_coef is not None and clip_coef < 1:
                    p.grad.mul_(clip_coef)
        if self.epoch < self.freeze_last_layer:
            for p in self.head.last_layer.parameters():
                p.grad = None

    def forward(self, views: Sequence[torch.Tensor]) -> MethodOutput:
        check_views(views, 2, "DINO")
        self.ensure_teacher()
        bs = views[0].shape[0]
        bottleneck = self.head.bottleneck(multicrop_features(self.backbone, views))
        student_output = self.head.prototypes(bottleneck)
        with torch.no_grad():
            teacher_output = self.teacher["head"](multicrop_features(self.teacher["backbone"],
                                                                 views[:2]))
        teacher_temp = teacher_temperature(self.epoch, self.teacher_temp,
                                           self.warmup_teacher_temp,
                                           self.warmup_teacher_temp_epochs)
        loss = dino_loss(student_output, teacher_output, self.center, len(views),
                         self.student_temp, teacher_temp)
        if self.training and torch.is_grad_enabled():
            self.center.copy_(updated_center(self.center, teacher_output, self.center_momentum))
        per_view = list(bottleneck.split(bs))
        return MethodOutput(loss=loss, terms={"dino": loss.detach()}, embeddings=per_view[:2],
                            all_embeddings=per_view)

    def build_optimizer(self, lr: float, weight_decay: float, optimizer: str = "adamw",
                        momentum: float = 0.9, eta: float = 0.001) -> torch.optim.Optimizer:
        """``get_params_groups``: biases and norm parameters (1-D) without weight decay; AdamW
        (the ViT default), SGD with ``momentum`` (the ResNet run) or LARS; the student only."""
        if optimizer == "lars":
            return LARS(lars_param_groups(self, weight_decay), lr=lr,
                        weight_decay=weight_decay, momentum=momentum, eta=eta)
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.ndim > 1], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.ndim <= 1], "weight_decay": 0.0}]
        if optimizer == "sgd":
            return torch.optim.SGD(groups, lr=lr, momentum=momentum)
        return torch.optim.AdamW(groups, lr=lr)
