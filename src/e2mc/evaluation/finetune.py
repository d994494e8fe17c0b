"""Semi-supervised fine-tuning: backbone and linear head trained together (docs/method.md),
the test set scored after every epoch in eval mode."""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from e2mc.evaluation.linear import EpochTracker, ProbeResult, init_head, random_resized_crop_flip
from e2mc.evaluation.probe_settings import FinetuneConfig
from e2mc.optim import cosine_factor
from e2mc.processes import loader_options


@torch.no_grad()
def _predict(model: nn.Module, loader: DataLoader, device: torch.device
             ) -> tuple[torch.Tensor, torch.Tensor]:
    model.eval()
    logits, labels = [], []
    for images, targets in loader:
        logits.append(model(images.to(device, non_blocking=True)).float())
        labels.append(torch.as_tensor(targets))
    return torch.cat(logits), torch.cat(labels).long().to(device)


def finetune(
    backbone: nn.Module,
    feature_dim: int,
    num_classes: int,
    train_dataset: Dataset,
    test_dataset: Dataset,
    config: FinetuneConfig | None = None,
    seed: int = 0,
    device: str | torch.device = "cpu",
    num_workers: int = 0,
    progress: bool = True,
) -> ProbeResult:
    """Fine-tune a copy of ``backbone`` with a new head (data sets of tensors, int labels)."""
    from e2mc.progress import progress_bar

    config = config or FinetuneConfig()
    device = torch.device(device)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    head = init_head(feature_dim, num_classes)
    model = nn.Sequential(copy.deepcopy(backbone), head).to(device)
    groups = [{"params": list(model[0].parameters()), "lr": config.backbone_lr},
              {"params": list(head.parameters()), "lr": config.head_lr}]
    optimizer = torch.optim.SGD(groups, momentum=config.momentum,
                                weight_decay=config.weight_decay)
    scheduler: torch.optim.lr_scheduler.LRScheduler
    if config.schedule == "cosine":
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer,
                                                      lambda e: cosine_factor(e, config.epochs))
    else:
        scheduler = torch.optim.lr_scheduler.MultiStepLR(
            optimizer, milestones=list(config.milestones), gamma=config.gamma)
    pin = device.type == "cuda"
    train_loader = DataLoader(train_dataset, batch_size=config.batch_size, shuffle=True,
                              generator=gen, num_workers=num_workers, pin_memory=pin,
                              **loader_options(num_workers))
    test_loader = DataLoader(test_dataset, batch_size=max(config.batch_size, 256),
                             num_workers=num_workers, pin_memory=pin,
                             **loader_options(num_workers))
    loss_fn = nn.CrossEntropyLoss()
    tracker: EpochTracker | None = None
    for _ in progress_bar(range(config.epochs), desc="fine-tune", unit="epoch",
                          disable=not progress):
        model.train()
        for images, labels in train_loader:
            images = images.to(device, non_blocking=True)
            if config.augment:
                images = random_resized_crop_flip(images, gen, scale=config.crop_scale)
            loss = loss_fn(model(images), torch.as_tensor(labels).long().to(device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        scheduler.step()
        logits, test_labels = _predict(model, test_loader, device)
        tracker = tracker or EpochTracker(test_labels)
        tracker.update(logits)
    assert tracker is not None
    return tracker.result()
