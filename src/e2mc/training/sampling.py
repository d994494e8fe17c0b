"""Data order and augmentation randomness as pure functions of (seed, epoch, sample), so a
mid-epoch resume replays an uninterrupted run exactly, whatever the number of loader workers."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """A 32-bit seed for one sample's augmentations (numpy ``SeedSequence`` mixing)."""
    return int(np.random.SeedSequence([seed, epoch, index]).generate_state(1)[0])


class EpochBatchSampler(Sampler[list[tuple[int, int]]]):
    """Yields this process's share of every global batch as ``[(index, sample_seed), ...]``.

    Epoch ``e`` shuffles with ``torch.randperm`` seeded by ``seed + e`` and drops the remainder;
    process ``rank`` takes its rows of each global batch, so the global batches do not depend on
    the number of processes."""

    def __init__(self, n: int, global_batch: int, seed: int = 0, rank: int = 0,
                 world_size: int = 1) -> None:
        if global_batch % world_size:
            raise ValueError(f"the batch size {global_batch} is not divisible by the "
                             f"{world_size} processes")
        if n < global_batch:
            raise ValueError(f"the data set has {n} images, fewer than one batch of "
                             f"{global_batch}")
        self.n, self.global_batch, self.seed = n, global_batch, seed
        self.rank, self.world_size = rank, world_size
        self.local_batch = global_batch // world_size
        self.epoch, self.start = 0, 0

    @property
    def steps_per_epoch(self) -> int:
        return self.n // self.global_batch

    def use(self) -> dict[str, int]:
        """``images``, ``batch``, ``steps`` per epoch and ``dropped`` (images no batch takes)."""
        steps = self.steps_per_epoch
        return {"images": self.n, "batch": self.global_batch, "steps": steps,
                "dropped": self.n - steps * self.global_batch}

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        if not 0 <= start_batch <= self.steps_per_epoch:
            raise ValueError(f"start_batch must be in [0, {self.steps_per_epoch}], "
                             f"got {start_batch}")
        self.epoch, self.start = epoch, start_batch

    def __len__(self) -> int:
        return self.steps_per_epoch - self.start

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.n, generator=g).tolist()
        for b in range(self.start, self.steps_per_epoch):
            lo = b * self.global_batch + self.rank * self.local_batch
            rows = order[lo: lo + self.local_batch]
            yield [(i, sample_seed(self.seed, self.epoch, i)) for i in rows]


@contextmanager
def seeded_generators(seed: int) -> Iterator[None]:
    """Within: torch's CPU, numpy's and python's generators seeded by ``seed``; after: as before."""
    py_state, np_state = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[]):
            # the CPU generator only (the one fork_rng restores): torch.manual_seed also queues
            # a seeding of every CUDA device with a formatted stack trace when CUDA is not
            # initialised, which cost more than the views of a 28 px image
            torch.default_generator.manual_seed(seed)
            random.seed(seed)
            np.random.seed(seed)
            yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)


class SeededSamples(Dataset):
    """Item ``(index, seed)`` of a data set, produced under generators seeded by ``seed`` (the
    caller's states untouched); a data set that collates its own batches gets a batch of keys."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, key: tuple[int, int]) -> Any:
        index, seed = key
        with seeded_generators(seed):
            return self.dataset[index]

    def __getitems__(self, keys: Sequence[tuple[int, int]]) -> Any:
        if not getattr(self.dataset, "collates", False):
            return [self[key] for key in keys]
        return self.dataset.collated([index for index, _ in keys],  # type: ignore[attr-defined]
                                     [seeded_generators(seed) for _, seed in keys])
