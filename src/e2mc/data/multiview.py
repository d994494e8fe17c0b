"""Datasets that return several augmented views per image, and their batch collation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from PIL import Image
from torch.utils.data import default_collate

from .subsets import Transformed

__all__ = ["MultiViewDataset", "ViewBatch", "collate_views"]


class ViewBatch(NamedTuple):
    """A batch its data set collated itself; :func:`collate_views` returns it as it is."""

    views: list[torch.Tensor]
    labels: torch.Tensor


class MultiViewDataset(Transformed):
    """Items ``(transform(image), label)`` of a dataset of ``(PIL image, label)`` items, where
    ``transform`` makes an image's views (:func:`~e2mc.data.views.build_views`)."""

    def __getitem__(self, index: int) -> tuple[list[torch.Tensor], int]:
        image, label = self.dataset[index]
        if not isinstance(image, Image.Image):
            raise TypeError(f"MultiViewDataset needs PIL images from the wrapped dataset, got "
                            f"{type(image).__name__}; build that dataset with transform=None")
        return self.transform(image), int(label)


def collate_views(
    batch: Sequence[tuple[Sequence[torch.Tensor], int]] | ViewBatch,
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """``(views, label)`` items as ``([B x C x S_v x S_v per view v], labels)``."""
    if isinstance(batch, ViewBatch):
        return batch.views, batch.labels
    if not batch:
        raise ValueError("empty batch")
    n_views = len(batch[0][0])
    if any(len(views) != n_views for views, _ in batch):
        raise ValueError("all items of a batch must have the same number of views")
    # default_collate stacks straight into shared memory in a DataLoader worker (one copy)
    views = [default_collate([item[0][v] for item in batch]) for v in range(n_views)]
    labels = torch.as_tensor([int(item[1]) for item in batch], dtype=torch.long)
    return views, labels
