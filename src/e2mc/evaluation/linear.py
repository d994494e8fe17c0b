"""What a linear probe gives (:class:`ProbeResult`, recorded epoch by epoch by
:class:`EpochTracker`), its initial layer, and the probe with per-epoch augmentation (the
probes on cached features are heads of :func:`e2mc.evaluation.batched.train_linear_heads`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from e2mc.evaluation.probe_settings import LinearProbeConfig
from e2mc.optim import LARC, cosine_factor
from e2mc.processes import loader_options


@dataclass
class ProbeResult:
    """One probe's accuracies (percent); the last epoch's top-1 ``predictions [N]`` and top-k
    labels ``top5 [N, k]``, and the best epoch's ``best_predictions``."""

    top1_last: float
    top5_last: float
    top1_best: float
    top5_best: float
    best_epoch: int
    history: list[float] = field(default_factory=list)
    predictions: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    top5: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int64))
    best_predictions: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    #: Mean cross-entropy on the evaluation set after the last epoch (NaN when not computed).
    loss_last: float = float("nan")
    #: Final ``[D, C]`` weight and ``[C]`` bias (only when asked for, e.g. ``keep_weights``).
    weight: np.ndarray | None = None
    bias: np.ndarray | None = None

    def metrics(self) -> dict[str, float | int]:
        return {"top1_last": self.top1_last, "top5_last": self.top5_last,
                "top1_best": self.top1_best, "top5_best": self.top5_best,
                "best_epoch": self.best_epoch}


def init_head(dim: int, num_classes: int) -> nn.Linear:
    """The probe's initial layer: ``nn.Linear`` (float32, on the CPU, drawn from the global RNG)
    with weights re-drawn from N(0, 0.01^2) and zero bias. Seed the global RNG first."""
    head = nn.Linear(dim, num_classes)
    nn.init.normal_(head.weight, std=0.01)
    nn.init.zeros_(head.bias)
    return head


class EpochTracker:
    """One probe's per-epoch test accuracy: history, best (first highest top-1), last."""

    def __init__(self, labels: torch.Tensor) -> None:
        self.labels = labels
        self.history: list[float] = []
        self.best: tuple[float, float, int, torch.Tensor | None] = (-1.0, 0.0, 0, None)
        self.last: tuple[float, float, torch.Tensor | None] = (0.0, 0.0, None)
        self.loss = float("nan")

    def add(self, top1: float, top5: float, predictions: torch.Tensor | None = None,
            top: torch.Tensor | None = None, loss: float = float("nan")) -> None:
        """Record one epoch: ``predictions`` (top-1 labels) are needed when it is a new best,
        ``top`` (top-k labels ``[N, k]``) and ``loss`` at the last epoch."""
        self.history.append(top1)
        if top1 > self.best[0]:
            self.best = (top1, top5, len(self.history), predictions)
        self.last, self.loss = (top1, top5, top), loss

    def update(self, logits: torch.Tensor) -> None:
        """Record one epoch from the logits ``[N, C]`` of every test row."""
        top = logits.topk(min(5, logits.shape[1]), dim=1).indices
        hit = top == self.labels[:, None]
        top1 = 100.0 * hit[:, 0].float().mean().item()
        top5 = 100.0 * hit.any(dim=1).float().mean().item()
        self.add(top1, top5, top[:, 0].clone(), top)

    def result(self) -> ProbeResult:
        assert self.best[3] is not None and self.last[2] is not None
        top = self.last[2].cpu().numpy()
        return ProbeResult(top1_last=self.last[0], top5_last=self.last[1],
                           top1_best=self.best[0], top5_best=self.best[1],
                           best_epoch=self.best[2], history=self.history,
                           predictions=top[:, 0].copy(), top5=top,
                           best_predictions=self.best[3].cpu().numpy(), loss_last=self.loss)


def random_resized_crop_flip(images: torch.Tensor, generator: torch.Generator,
                             scale: tuple[float, float] = (0.08, 1.0),
                             ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> torch.Tensor:
    """torchvision's random resized crop and flip of each image of ``[B, C, H, W]``, at the
    input size, drawn from ``generator``, on any device."""
    from torchvision.transforms import v2 as T

    augment = T.Compose([T.RandomResizedCrop(tuple(images.shape[-2:]), scale, ratio,
                                             antialias=True), T.RandomHorizontalFlip()])
    with torch.random.fork_rng(devices=[]):  # torchvision draws from the global generator
        torch.manual_seed(int(torch.randint(2**62, (1,), generator=generator)))
        return torch.stack([augment(image) for image in images])


def train_augmented_linear_probe(
    backbone: nn.Module,
    train_dataset: Dataset,
    test_features: np.ndarray,
    test_labels: np.ndarray,
    num_classes: int,
    config: LinearProbeConfig | None = None,
    seed: int = 0,
    device: str | torch.device = "cpu",
    num_workers: int = 0,
    augment: Callable[[torch.Tensor, torch.Generator], torch.Tensor] = random_resized_crop_flip,
    progress: bool = True,
) -> ProbeResult:
    """The official linear protocol: the frozen backbone sees a new ``augment`` of every
    (eval-transformed) training image each epoch; the test set uses ``test_features``. One
    forward pass of the training set per epoch: meant for a GPU."""
    from e2mc.progress import progress_bar

    config = config or LinearProbeConfig()
    if config.standardize:
        raise ValueError("standardize=True needs fixed features; use train_linear_heads")
    device = torch.device(device)
    backbone.eval().to(device)
    torch.manual_seed(seed)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    loader = DataLoader(train_dataset, batch_size=config.batch_size, shuffle=True,
                        num_workers=num_workers, generator=gen, drop_last=False,
                        pin_memory=device.type == "cuda",
                        **loader_options(num_workers))
    tx = torch.as_tensor(test_features, dtype=torch.float32, device=device)
    ty = torch.as_tensor(np.asarray(test_labels), dtype=torch.long, device=device)
    head = init_head(tx.shape[1], num_classes).to(device)
    kind = torch.optim.SGD if config.optimizer == "sgd" else LARC  # LARC: SimSiam's apex LARC
    optimizer = kind(head.parameters(), lr=config.lr, momentum=config.momentum,
                     weight_decay=config.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda e: cosine_factor(e, config.epochs))  # stepped per epoch
    tracker = EpochTracker(ty)
    for _ in progress_bar(range(config.epochs), desc="augmented probe", unit="epoch",
                          disable=not progress):
        for images, labels in loader:
            images = augment(images.to(device, non_blocking=True), gen)
            with torch.no_grad():
                feats = backbone(images).float()
            loss = nn.functional.cross_entropy(head(feats),
                                               torch.as_tensor(labels, device=device).long())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        scheduler.step()
        with torch.no_grad():
            tracker.update(torch.cat([head(tx[i:i + 8192]) for i in range(0, len(tx), 8192)]))
    return tracker.result()
