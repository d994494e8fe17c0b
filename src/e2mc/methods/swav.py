"""SwAV (Caron et al., 2020) as in the official ``main_swav.py`` and ``src/resnet50.py``."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from e2mc.distributed import all_reduce_sum, world_size
from e2mc.methods.base import CollapseValue, MethodOutput, SSLMethod
from e2mc.methods.common import check_views, multicrop_features, resolve_backbone
from e2mc.methods.heads import mlp
from e2mc.optim import LARC, LARC_TRUST
from e2mc.ranges import Each, IndicesOf, above, at_least, between


@torch.no_grad()
def sinkhorn(scores: torch.Tensor, epsilon: float = 0.05, iterations: int = 3) -> torch.Tensor:
    """SwAV's ``distributed_sinkhorn``: soft assignments ``Q`` (``[B, K]``) of this process's
    ``B`` samples to ``K`` prototypes. With ``B_total`` samples over all processes, the rows of
    ``Q^T`` are scaled to sum to ``1/K`` and the columns to ``1/B_total`` alternately
    (sums all-reduced), then ``Q`` is multiplied by ``B_total`` so each sample's row sums to 1.
    Runs in float32."""
    q = torch.exp(scores.float() / epsilon).t()  # K x B
    b_total = q.shape[1] * world_size()
    k = q.shape[0]
    q /= all_reduce_sum(torch.sum(q))
    for _ in range(iterations):
        q /= all_reduce_sum(torch.sum(q, dim=1, keepdim=True))
        q /= k
        q /= torch.sum(q, dim=0, keepdim=True)
        q /= b_total
    q *= b_total
    return q.t()


class SwAV(SSLMethod):
    """SwAV: backbone, ``projection_head`` (Linear, BN, ReLU, Linear) and ``prototypes``
    (Linear without bias), swapped prediction over multi-crop views.

    ``views``: ``sum(n_crops)`` tensors, the large crops first. The backbone runs once per run of
    equal-resolution crops and the head on all crops together, as the official model does. The
    add-on gets the projections of the two large crops before L2 normalisation.
    """

    name = "swav"
    view_recipe = "swav"
    compact_space = "hypersphere"
    param_ranges = {
        "hidden_dim": at_least(1), "output_dim": at_least(1),
        "n_prototypes": at_least(2),  # one prototype: every assignment is 1, the loss 0
        "temperature": above(0), "epsilon": above(0), "sinkhorn_iterations": at_least(1),
        "freeze_prototypes_iters": at_least(0), "queue_length": at_least(0),  # 0: no queue
        "queue_start_epoch": at_least(0), "n_crops": Each(at_least(0), min_sum=2),
        "crops_for_assign": IndicesOf("n_crops"),  # after n_crops: it indexes its crops
        "feature_dim": at_least(1)}
    optimizer_ranges = {"momentum": between(0, 1, high_open=True),
                        "trust_coefficient": above(0)}

    @classmethod
    def collapse_value(cls, hparams: Mapping[str, Any] | None = None) -> CollapseValue:
        """``ln K`` for ``K`` prototypes (a learning run ends well below: 3.3 for ln 100 = 4.61)."""
        k = int(dict(hparams or {}).get("n_prototypes", 3000))
        ln_k = math.log(k)
        return CollapseValue("base/swav", ln_k, 0.02 * ln_k,
                             f"ln K = ln {k} = {ln_k:.3f}, the loss of a uniform prediction")

    def __init__(self, backbone: str | nn.Module = "resnet50", small_images: bool = False,
                 in_channels: int = 3, hidden_dim: int = 2048, output_dim: int = 128,
                 n_prototypes: int = 3000, temperature: float = 0.1, epsilon: float = 0.05,
                 sinkhorn_iterations: int = 3, freeze_prototypes_iters: int = 0,
                 queue_length: int = 0, queue_start_epoch: int = 0,
                 crops_for_assign: Sequence[int] = (0, 1), n_crops: Sequence[int] = (2, 6),
                 feature_dim: int | None = None) -> None:
        super().__init__()
        self.backbone, self.feature_dim, bb_hparams = resolve_backbone(
            backbone, small_images, in_channels, feature_dim)
        self.projection_head = mlp([self.feature_dim, hidden_dim, output_dim], last_bias=True)
        self.prototypes = nn.Linear(output_dim, n_prototypes, bias=False)
        self.temperature, self.epsilon = temperature, epsilon
        self.sinkhorn_iterations = sinkhorn_iterations
        self.freeze_prototypes_iters = freeze_prototypes_iters
        self.queue_length, self.queue_start_epoch = queue_length, queue_start_epoch
        self.crops_for_assign = tuple(int(c) for c in crops_for_assign)
        self.n_crops = tuple(int(c) for c in n_crops)
        self.queue: torch.Tensor | None = None
        self.use_the_queue = False
        self.record_hparams(bb_hparams, crops_for_assign=list(self.crops_for_assign),
                            n_crops=list(self.n_crops))

    def set_epoch(self, epoch: int) -> None:
        """Create the queue (length ``queue_length // world_size`` on this process) at
        ``queue_start_epoch``; every epoch starts with ``use_the_queue = False`` (it turns on
        once the queue is full), as in the official loop."""
        if self.queue_length > 0 and epoch >= self.queue_start_epoch and self.queue is None:
            per_rank = self.queue_length // world_size()
            if per_rank < 1:
                raise ValueError(f"queue_length {self.queue_length} < world size {world_size()}")
            self.queue = torch.zeros(len(self.crops_for_assign), per_rank,
                                     self.prototypes.in_features,
                                     device=self.prototypes.weight.device)
        self.use_the_queue = False

    @torch.no_grad()
    def before_step(self, iteration: int) -> None:
        """L2-normalise the prototypes (every step, before the forward pass)."""
        self.prototypes.weight.copy_(F.normalize(self.prototypes.weight, dim=1, p=2))

    def after_backward(self, iteration: int) -> None:
        """Drop the prototypes' gradients during the first ``freeze_prototypes_iters`` steps."""
        if iteration < self.freeze_prototypes_iters:
            self.prototypes.weight.grad = None

    def training_state(self) -> dict[str, Any]:
        """This process's queue (``None`` before it starts) and whether it is in use."""
        return {"queue": None if self.queue is None else self.queue.detach().cpu().clone(),
                "use_the_queue": self.use_the_queue}

    def load_training_state(self, state: dict[str, Any]) -> None:
        queue = state.get("queue")
        if queue is not None:
            expected = (len(self.crops_for_assign), self.queue_length // world_size(),
                        self.prototypes.in_features)
            if tuple(queue.shape) != expected:
                raise ValueError(f"saved SwAV queue has shape {tuple(queue.shape)}, "
                                 f"expected {expected}")
            queue = queue.to(self.prototypes.weight.device, torch.float32)
        self.queue = queue
        self.use_the_queue = bool(state.get("use_the_queue", False))

    def forward(self, views: Sequence[torch.Tensor]) -> MethodOutput:
        check_views(views, 2, "SwAV")
        n_views = len(views)
        if max(self.crops_for_assign) >= n_views:
            raise ValueError(f"crops_for_assign {self.crops_for_assign} needs more than "
                             f"{n_views} views")
        bs = views[0].shape[0]
        projections = self.projection_head(multicrop_features(self.backbone, views))
        z = F.normalize(projections, dim=1, p=2)
        output = self.prototypes(z)
        embedding = z.detach()
        update_queue = self.training and torch.is_grad_enabled()
        loss = projections.new_zeros((), dtype=torch.float32)
        for i, crop_id in enumerate(self.crops_for_assign):
            with torch.no_grad():
                out = output[bs * crop_id: bs * (crop_id + 1)].detach().float()
                if self.queue is not None and update_queue:
                    if self.queue.shape[1] < bs:
                        raise ValueError(f"SwAV queue of {self.queue.shape[1]} rows per process "
                                         f"is shorter than the batch ({bs})")
                    if self.use_the_queue or not torch.all(self.queue[i, -1, :] == 0):
                        self.use_the_queue = True
                        out = torch.cat((self.queue[i] @ self.prototypes.weight.float().t(), out))
                    self.queue[i, bs:] = self.queue[i, :-bs].clone()
                    self.queue[i, :bs] = embedding[crop_id * bs: (crop_id + 1) * bs]
                q = sinkhorn(out, self.epsilon, self.sinkhorn_iterations)[-bs:]
            subloss = 0.0
            for v in range(n_views):
                if v == crop_id:
                    continue
                x = output[bs * v: bs * (v + 1)].float() / self.temperature
                subloss = subloss - torch.mean(torch.sum(q * F.log_softmax(x, dim=1), dim=1))
            loss = loss + subloss / (n_views - 1)
        loss = loss / len(self.crops_for_assign)
        per_view = list(projections.split(bs))
        return MethodOutput(loss=loss, terms={"swav": loss.detach()},
                            embeddings=per_view[:2], all_embeddings=per_view)

    def build_optimizer(self, lr: float, weight_decay: float, momentum: float = 0.9,
                        trust_coefficient: float = LARC_TRUST, clip: bool = False
                        ) -> torch.optim.Optimizer:
        """LARC around SGD (momentum 0.9, trust 0.001, clip off) over all parameters."""
        return LARC(self.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay,
                    trust_coefficient=trust_coefficient, clip=clip)
