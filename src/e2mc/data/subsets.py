"""Subsets (:class:`LabeledSubset`, :func:`subset_parts`), label subsets for semi-supervised
evaluation (stratified seeded fractions, SimCLR-style file lists) and a data set's labels."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Dataset, Subset

__all__ = ["LabeledSubset", "dataset_labels", "fraction_label", "label_fraction_indices",
           "per_class_indices", "read_file_list", "stratified_indices", "Transformed",
           "subset_from_file_list", "subset_parts"]


class LabeledSubset(Dataset):
    """``dataset`` restricted to ``indices`` (the one subset type), keeping the parent's ``labels``
    and ``classes``; a subset of a subset is a subset of the first parent (seen through once)."""

    def __init__(self, dataset: Any, indices: Sequence[int] | np.ndarray) -> None:
        indices = np.asarray(indices, dtype=np.int64)
        if indices.ndim != 1:
            raise ValueError(f"indices must be 1-D, got shape {indices.shape}")
        if indices.size and (indices.min() < 0 or indices.max() >= len(dataset)):
            raise ValueError(f"indices out of range for a dataset of {len(dataset)} samples")
        dataset, parent = subset_parts(dataset)
        self.dataset = dataset
        self.indices = indices if parent is None else parent[indices]
        labels = dataset_labels(dataset, False)
        self.labels = None if labels is None else labels[self.indices]
        self.classes = getattr(dataset, "classes", None)

    @property
    def targets(self) -> np.ndarray | None:
        """Alias of ``labels``."""
        return self.labels

    def __len__(self) -> int:
        return int(self.indices.size)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[int(self.indices[index])]


def subset_parts(dataset: Any) -> tuple[Any, np.ndarray | None]:
    """``(parent, indices)`` of a subset (ours or torch's), else ``(dataset, None)``."""
    if isinstance(dataset, (LabeledSubset, Subset)):
        return dataset.dataset, np.asarray(dataset.indices, dtype=np.int64)
    return dataset, None


class Transformed(Dataset):
    """``dataset`` with ``transform`` applied to each image, keeping its ``labels`` (alias
    ``targets``) and ``classes``."""

    def __init__(self, dataset: Any, transform: Any) -> None:
        self.dataset, self.transform = dataset, transform
        self.labels = dataset_labels(dataset, False)
        self.classes = getattr(dataset, "classes", None)

    @property
    def targets(self) -> np.ndarray | None:
        return self.labels

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        image, label = self.dataset[index]
        return self.transform(image), label


def dataset_labels(dataset: Any, required: bool = True) -> np.ndarray | None:
    """``dataset``'s ``labels`` (else ``targets``) as int64; missing: error or None."""
    for attr in ("labels", "targets"):
        if getattr(dataset, attr, None) is not None:
            return np.asarray(getattr(dataset, attr), dtype=np.int64)
    if required:
        raise ValueError(f"{type(dataset).__name__} has no 'labels' or 'targets' attribute")
    return None


def _check_labels(labels: np.ndarray | Sequence[int]) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {labels.shape}")
    if labels.size and not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must be integers, got {labels.dtype}")
    return labels.astype(np.int64)


def per_class_indices(
    labels: np.ndarray | Sequence[int], per_class: int | dict[int, int], seed: int
) -> np.ndarray:
    """Sorted indices of ``per_class`` (int or dict) samples per class, drawn with ``seed``."""
    labels = _check_labels(labels)
    rng = np.random.default_rng(seed)
    chosen = []
    for cls in np.unique(labels):
        members = np.flatnonzero(labels == cls)
        k = per_class if isinstance(per_class, int) else per_class[int(cls)]
        if not 0 <= k <= members.size:
            raise ValueError(f"class {cls} has {members.size} samples, cannot draw {k}")
        chosen.append(rng.choice(members, size=k, replace=False))
    return np.sort(np.concatenate(chosen)) if chosen else np.zeros(0, dtype=np.int64)


def label_fraction_indices(
    labels: np.ndarray | Sequence[int], fraction: float, seed: int
) -> np.ndarray:
    """Stratified, seeded indices of about ``fraction`` (:func:`stratified_indices`, keep 0)."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float, np.floating)):
        raise ValueError(f"fraction must be a number in (0, 1], got {fraction!r}")
    if not (math.isfinite(fraction) and 0.0 < fraction <= 1.0):
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    return stratified_indices(labels, fraction, seed)


def stratified_indices(labels: np.ndarray | Sequence[int], fraction: float, seed: int,
                       keep: int = 0) -> np.ndarray:
    """The stratified, seeded draw (:func:`per_class_indices`): a class of ``n_c`` samples gives
    ``min(n_c - keep, max(1, floor(fraction * n_c + 0.5)))`` (none when ``n_c <= keep``)."""
    labels = _check_labels(labels)
    classes, counts = np.unique(labels, return_counts=True)
    per_class = {
        int(c): min(int(n) - keep, max(1, math.floor(fraction * int(n) + 0.5))) if n > keep
        else 0 for c, n in zip(classes, counts, strict=True)
    }
    return per_class_indices(labels, per_class, seed)


def fraction_label(fraction: float) -> str:
    """A label fraction in column and metric names: ``0.01 -> '1%'``, ``0.125 -> '12.5%'``."""
    return f"{100 * fraction:g}%"


def read_file_list(path: str | Path) -> list[str]:
    """The names of a SimCLR-style file list (one a line); ``ValueError`` if empty or repeated."""
    path = Path(path)
    names = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    if not names:
        raise ValueError(f"{path}: empty file list")
    repeated = sorted(n for n, count in Counter(names).items() if count > 1)
    if repeated:
        raise ValueError(f"{path}: {len(repeated)} repeated name(s), e.g. {repeated[:5]}")
    return names


def subset_from_file_list(dataset: Any, names: Iterable[str]) -> LabeledSubset:
    """The samples whose base name is in ``names``; ValueError if one is missing or ambiguous."""
    samples = getattr(dataset, "samples", None)
    if samples is None:
        raise ValueError(f"{type(dataset).__name__} has no 'samples' (file paths); file lists "
                         "need an image-folder dataset")
    wanted = [Path(n).name for n in names]
    if not wanted:
        raise ValueError("empty list of file names")
    where: dict[str, list[int]] = {}
    for i, (path, _) in enumerate(samples):
        where.setdefault(Path(path).name, []).append(i)
    missing = [n for n in wanted if n not in where]
    if missing:
        raise ValueError(f"{len(missing)} of {len(wanted)} listed file(s) not found in the "
                         f"dataset ({len(samples)} samples), e.g. {missing[:10]}")
    ambiguous = [n for n in wanted if len(where[n]) > 1]
    if ambiguous:
        raise ValueError(f"{len(ambiguous)} listed name(s) match several files, e.g. "
                         f"{ambiguous[:5]}")
    return LabeledSubset(dataset, np.sort([where[n][0] for n in wanted]))
