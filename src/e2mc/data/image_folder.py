"""Image-folder datasets (torchvision ``ImageFolder``) with corrupt-file handling."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from torchvision.datasets import ImageFolder

__all__ = ["CorruptImageError", "SafeImageFolder", "image_folder"]


class CorruptImageError(OSError):
    """An image file that cannot be decoded; the message names the file."""


def _load_rgb_or_l(path: str) -> Image.Image:
    """Decode an image fully; keep grayscale as ``L``, everything else becomes ``RGB``."""
    try:
        with Image.open(path) as img:
            img.load()
            return (
                img.convert("L") if img.mode in ("L", "1", "I;16", "I", "F") else img.convert("RGB")
            )
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        raise CorruptImageError(f"cannot read image file {path}: {err}") from err


def _is_readable(path: str) -> bool:
    """Whether ``path`` decodes completely. JPEGs are decoded at reduced scale (``draft``), which
    still parses the whole stream, so truncation is detected at a fraction of the cost."""
    try:
        with Image.open(path) as img:
            if img.format == "JPEG":
                img.draft(img.mode, (max(1, img.width // 8), max(1, img.height // 8)))
            img.load()
        return True
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):
        return False


class SafeImageFolder(ImageFolder):
    """torchvision ``ImageFolder`` whose loader raises :class:`CorruptImageError` naming the file.

    With ``skip_corrupt=True`` every file is decoded once at construction (in threads) and the
    unreadable ones are dropped; ``skipped_files`` lists them, ``num_skipped`` counts them and a
    warning says how many. ``labels``/``targets`` are int64 numpy arrays.
    """

    def __init__(
        self,
        root: str | Path,
        transform: Callable[[Image.Image], Any] | None = None,
        skip_corrupt: bool = False,
    ) -> None:
        super().__init__(str(root), transform=transform, loader=_load_rgb_or_l)
        self.skip_corrupt = skip_corrupt
        self.skipped_files: list[str] = []
        if skip_corrupt:
            paths = [p for p, _ in self.samples]
            workers = min(32, (os.cpu_count() or 1) * 2)
            with ThreadPoolExecutor(max_workers=workers) as pool:
                ok = list(pool.map(_is_readable, paths, chunksize=64))
            self.skipped_files = [p for p, good in zip(paths, ok, strict=True) if not good]
            self.samples = [s for s, good in zip(self.samples, ok, strict=True) if good]
            self.imgs = self.samples
            if self.skipped_files:
                warnings.warn(
                    f"skipped {len(self.skipped_files)} corrupt or unreadable image(s) under "
                    f"{root} (first: {self.skipped_files[0]})",
                    stacklevel=2,
                )
        self.labels = np.asarray([t for _, t in self.samples], dtype=np.int64)
        self.targets = self.labels

    @property
    def num_skipped(self) -> int:
        """How many unreadable files were dropped (0 unless ``skip_corrupt``)."""
        return len(self.skipped_files)


def image_folder(
    root: str | Path,
    transform: Callable[[Image.Image], Any] | None = None,
    skip_corrupt: bool = False,
) -> SafeImageFolder:
    """An image-folder dataset (``root/<class>/<image>``); see :class:`SafeImageFolder`."""
    if not Path(root).is_dir():
        raise FileNotFoundError(f"image folder not found: {root}")
    return SafeImageFolder(root, transform=transform, skip_corrupt=skip_corrupt)
