"""In-memory datasets (numpy arrays, IDX folders, ``.npz`` files, the shipped Fashion-MNIST
subset): items ``(transform(PIL image), int label)``, ``labels``/``targets`` int64 numpy."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from .idx import load_idx

__all__ = ["FASHION_MNIST_CLASSES", "MNIST_CLASSES", "ArrayDataset", "builtin_fashion_mnist",
           "builtin_fashion_mnist_path", "fashion_mnist", "find_idx_folder", "idx_dataset", "mnist",
           "npz_dataset"]

FASHION_MNIST_CLASSES: tuple[str, ...] = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)  # fmt: skip
MNIST_CLASSES: tuple[str, ...] = (
    "0 - zero", "1 - one", "2 - two", "3 - three", "4 - four",
    "5 - five", "6 - six", "7 - seven", "8 - eight", "9 - nine",
)  # fmt: skip

# File stems of the four IDX files per split (torchvision's names; ".gz" optional).
IDX_FILES: dict[str, tuple[str, str]] = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
BUILTIN_NAME = "fashion_mnist_subset.npz"

Transform = Callable[[Image.Image], Any]


class ArrayDataset(Dataset):
    """Items ``(transform(PIL image), label)`` of uint8 images ``[N, H, W(, C)]``; -1: no label."""

    def __init__(
        self,
        images: np.ndarray,
        labels: np.ndarray | None,
        transform: Transform | None = None,
        classes: Sequence[str] | None = None,
    ) -> None:
        images = np.asarray(images)
        if images.dtype != np.uint8:
            raise ValueError(f"images must be uint8, got {images.dtype}")
        if images.ndim == 4 and images.shape[-1] == 1:
            images = images[..., 0]
        if not (images.ndim == 3 or (images.ndim == 4 and images.shape[-1] == 3)):
            raise ValueError(f"images must have shape [N, H, W] or [N, H, W, C] with C in (1, 3), "
                             f"got {images.shape}")
        n = images.shape[0]
        if labels is None:
            labels = np.full(n, -1, dtype=np.int64)
        labels = np.asarray(labels)
        if labels.shape != (n,):
            raise ValueError(f"labels must have shape ({n},), got {labels.shape}")
        if not np.issubdtype(labels.dtype, np.integer):
            raise ValueError(f"labels must be integers, got {labels.dtype}")
        self.images = images
        self.labels = labels.astype(np.int64)
        self.transform = transform
        self.classes = list(classes) if classes is not None else None
        if self.classes is not None and n and self.labels.max() >= len(self.classes):
            raise ValueError(f"label {self.labels.max()} out of range for {len(self.classes)} "
                             "classes")

    @property
    def targets(self) -> np.ndarray:
        """Alias of ``labels`` (torchvision's name)."""
        return self.labels

    def __len__(self) -> int:
        return int(self.images.shape[0])

    def __getitem__(self, index: int) -> tuple[Any, int]:
        image = Image.fromarray(self.images[index])
        if self.transform is not None:
            image = self.transform(image)
        return image, int(self.labels[index])

    def batches(self, batch_size: int, indices: Sequence[int] | None = None
                ) -> Iterator[tuple[Any, torch.Tensor]] | None:
        """The items ``indices`` (default: all) as ``(images, labels)`` batches, equal to collating
        :meth:`__getitem__`'s, transformed a batch at a time; None when the transform has no
        batch form for these images (then use a DataLoader)."""
        batchable = getattr(self.transform, "batchable", None)
        if batchable is None or not batchable(self.images):
            return None
        batch = self.transform.batch
        order = np.arange(len(self)) if indices is None else np.asarray(indices, dtype=np.int64)

        def generate() -> Iterator[tuple[Any, torch.Tensor]]:
            for start in range(0, len(order), batch_size):
                rows = order[start:start + batch_size]
                yield batch(self.images[rows]), torch.from_numpy(self.labels[rows])

        return generate()

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(n={len(self)}, image_shape={self.images.shape[1:]}, "
                f"classes={len(self.classes) if self.classes else None})")


def _check_split(split: str, allowed: Sequence[str]) -> None:
    if split not in allowed:
        raise ValueError(f"split must be one of {list(allowed)}, got {split!r}")


def _idx_file(folder: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz"):
        if (folder / name).is_file():
            return folder / name
    return None


def _has_idx_files(folder: Path) -> bool:
    return all(_idx_file(folder, s) is not None for pair in IDX_FILES.values() for s in pair)


def find_idx_folder(
    root: str | Path, subfolders: Sequence[str] = ("FashionMNIST", "MNIST")
) -> Path:
    """The folder of the IDX files: ``root`` or one ``root/<subfolder>/raw``, else ValueError."""
    root = Path(root)
    candidates = [root] + [root / name / "raw" for name in subfolders]
    found = [c for c in candidates if c.is_dir() and _has_idx_files(c)]
    if len(found) > 1:
        raise ValueError(f"ambiguous IDX folder: several hold the IDX files: {found}")
    if not found:
        names = ", ".join(s + "[.gz]" for pair in IDX_FILES.values() for s in pair)
        raise ValueError(f"no IDX files ({names}) found in any of {[str(c) for c in candidates]}")
    return found[0]


def idx_dataset(
    root: str | Path,
    split: str = "train",
    transform: Transform | None = None,
    classes: Sequence[str] | None = None,
    subfolders: Sequence[str] = ("FashionMNIST", "MNIST"),
) -> ArrayDataset:
    """An :class:`ArrayDataset` from the IDX files of ``split`` ("train" or "test")."""
    _check_split(split, tuple(IDX_FILES))
    folder = find_idx_folder(root, subfolders)
    image_stem, label_stem = IDX_FILES[split]
    images = load_idx(_idx_file(folder, image_stem))
    labels = load_idx(_idx_file(folder, label_stem))
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise ValueError(f"{folder}: inconsistent IDX files: images {images.shape}, "
                         f"labels {labels.shape}")
    return ArrayDataset(images, labels, transform=transform, classes=classes)


def fashion_mnist(
    root: str | Path, split: str = "train", transform: Transform | None = None
) -> ArrayDataset:
    """Fashion-MNIST from its four IDX files in ``root`` or ``root/FashionMNIST/raw``."""
    return idx_dataset(root, split, transform, FASHION_MNIST_CLASSES, ("FashionMNIST",))


def mnist(
    root: str | Path, split: str = "train", transform: Transform | None = None
) -> ArrayDataset:
    """MNIST from its four IDX files in ``root`` or ``root/MNIST/raw``."""
    return idx_dataset(root, split, transform, MNIST_CLASSES, ("MNIST",))


def npz_dataset(
    path: str | Path, split: str = "train", transform: Transform | None = None
) -> ArrayDataset:
    """An :class:`ArrayDataset` from arrays ``x_<split>``, ``y_<split>`` (and ``classes``)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"npz file not found: {path}")
    with np.load(path, allow_pickle=False) as npz:
        keys = set(npz.files)
        x_key, y_key = f"x_{split}", f"y_{split}"
        if x_key not in keys or y_key not in keys:
            splits = sorted(k[2:] for k in keys if k.startswith("x_") and f"y_{k[2:]}" in keys)
            raise ValueError(f"{path}: no arrays {x_key!r}/{y_key!r}; splits available: "
                             f"{splits}, arrays: {sorted(keys)}")
        classes = [str(c) for c in npz["classes"]] if "classes" in keys else None
        return ArrayDataset(npz[x_key], npz[y_key], transform=transform, classes=classes)


def builtin_fashion_mnist_path() -> Path:
    """Path of the Fashion-MNIST subset shipped inside the package."""
    return Path(str(resources.files("e2mc") / "assets" / BUILTIN_NAME))


def builtin_fashion_mnist(split: str = "train", transform: Transform | None = None) -> ArrayDataset:
    """The shipped Fashion-MNIST subset (``scripts/make_fashion_mnist_subset.py``; MIT)."""
    _check_split(split, ("train", "test"))
    return npz_dataset(builtin_fashion_mnist_path(), split, transform)
