"""One entry point from a dataset specification string to a dataset."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from PIL import Image
from torch.utils.data import Dataset

from .datasets import (
    FASHION_MNIST_CLASSES,
    MNIST_CLASSES,
    builtin_fashion_mnist,
    find_idx_folder,
    idx_dataset,
    npz_dataset,
)
from .image_folder import image_folder

__all__ = ["BUILTIN_SPECS", "build_dataset"]

BUILTIN_SPECS = ("builtin", "builtin:fashion-mnist")
# Split -> subfolder names tried in order for image folders.
_FOLDER_SPLITS = {"train": ("train",), "test": ("test", "val"), "val": ("val", "test")}


def _folder_splits_text(split: str) -> str:
    """``train/`` for the training split, ``train/ and test/ (or val/)`` for the others."""
    others = [name for name in _FOLDER_SPLITS.get(split, ()) if name != "train"]
    return "train/" + (f" and {others[0]}/" if others else "") + \
        (f" (or {'/ or '.join(others[1:])}/)" if len(others) > 1 else "")


def _idx_classes(folder: Path) -> tuple[str, ...] | None:
    """Class names guessed from the folder path ('fashion', 'mnist'), else None."""
    text = str(folder.resolve()).lower()
    if "fashion" in text:
        return FASHION_MNIST_CLASSES
    if "mnist" in text:
        return MNIST_CLASSES
    return None


def build_dataset(
    spec: str,
    split: str,
    transform: Callable[[Image.Image], Any] | None = None,
    skip_corrupt: bool = False,
) -> Dataset:
    """The dataset described by ``spec`` for ``split``: ``builtin``, an ``.npz`` file, a folder of
    IDX files or an image folder with ``train/`` and ``test/`` (or ``val/``) subfolders (what
    each needs: the error below; ``skip_corrupt`` drops unreadable images, counting them)."""
    if spec.startswith("builtin"):
        if spec not in BUILTIN_SPECS:
            raise ValueError(f"unknown built-in dataset {spec!r}; available: {list(BUILTIN_SPECS)}")
        return builtin_fashion_mnist(split, transform)
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".npz":
        return npz_dataset(path, split, transform)
    if path.is_dir():
        try:
            folder = find_idx_folder(path)
        except ValueError:
            folder = None
        if folder is not None:
            return idx_dataset(folder, split, transform, _idx_classes(folder), subfolders=())
        if split not in _FOLDER_SPLITS:
            raise ValueError(f"split must be one of {list(_FOLDER_SPLITS)}, got {split!r}")
        has_train = (path / "train").is_dir()
        for name in _FOLDER_SPLITS[split]:
            if has_train and (path / name).is_dir():
                return image_folder(path / name, transform, skip_corrupt=skip_corrupt)
    raise ValueError(
        f"cannot make a dataset from {spec!r} (split {split!r}); looked for: 'builtin' or "
        "'builtin:fashion-mnist'; an existing .npz file with x_<split>/y_<split> arrays; a folder "
        "holding train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz], "
        "t10k-images-idx3-ubyte[.gz], t10k-labels-idx1-ubyte[.gz] (directly, in FashionMNIST/raw "
        f"or MNIST/raw); or a folder with {_folder_splits_text(split)} subfolders of class "
        "folders"
    )
