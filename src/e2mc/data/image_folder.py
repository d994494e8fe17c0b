"""Image-folder datasets (torchvision ``ImageFolder``) with corrupt-file handling, one class list
for every split, symlinked directories walked once and high-bit-depth images scaled to 8 bits."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from torchvision.datasets import ImageFolder
from torchvision.datasets.folder import IMG_EXTENSIONS, has_file_allowed_extension

from e2mc.errors import CorruptImageError

__all__ = ["SafeImageFolder", "image_folder", "to_8bit"]

#: Splits of an image-folder data set (``ROOT/<split>/<class>/...``) that take train's classes.
EVAL_SPLITS = ("test", "val")


def to_8bit(img: Image.Image) -> Image.Image:
    """A 16-bit, 32-bit integer or float grayscale image scaled to ``L`` (PIL's ``convert``
    clips at 255): ``round(v / 257)`` for integers in [0, 65535], ``round(255 v)`` for ``F`` in
    [0, 1], else the image's own range stretched to 0-255 (a constant image becomes 0).
    Non-finite values raise ``ValueError``; any other image is returned as it is."""
    if not (img.mode.startswith("I") or img.mode == "F"):
        return img
    v = np.asarray(img).astype(np.float64)
    if not np.isfinite(v).all():
        raise ValueError(f"{img.mode} image has non-finite pixel values")
    lo, hi = (float(v.min()), float(v.max())) if v.size else (0.0, 0.0)
    if img.mode == "F" and lo >= 0.0 and hi <= 1.0:
        v = v * 255.0
    elif img.mode != "F" and lo >= 0.0 and hi <= 65535.0:
        v = v / 257.0
    else:
        v = (v - lo) * (255.0 / (hi - lo)) if hi > lo else np.zeros_like(v)
    return Image.fromarray(np.rint(v).clip(0, 255).astype(np.uint8), "L")


def _load_rgb_or_l(path: str) -> Image.Image:
    """Decode an image fully: grayscale as ``L`` (:func:`to_8bit`), anything else ``RGB``."""
    try:
        with Image.open(path) as img:
            img.load()
            img = to_8bit(img)
            return img.convert("L") if img.mode in ("L", "1") else img.convert("RGB")
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
            to_8bit(img)  # non-finite float pixels are unreadable too
        return True
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):
        return False


def _walk_once(directory: str, seen: set[str], reserved: set[str]) -> list[str]:
    """The files under ``directory``, following symlinks but entering each real directory once:
    one already in ``seen`` (a loop, or one reached before by another link) or in ``reserved``
    (the root and the other class folders) is skipped. Sorted as torchvision sorts them."""
    found = []
    for root, dirs, files in os.walk(directory, followlinks=True):
        real = os.path.realpath(root)
        if real in seen or (real in reserved and root != directory):
            dirs.clear()
            continue
        seen.add(real)
        dirs.sort()
        found += [(root, name) for name in files]
    return [os.path.join(root, name) for root, name in sorted(found)]


class SafeImageFolder(ImageFolder):
    """torchvision ``ImageFolder`` whose loader raises :class:`CorruptImageError` naming the file.
    ``classes`` fixes the class list (a missing class keeps the indices, an extra class folder is
    a ``ValueError``); every real directory is walked once (:func:`_walk_once`). With
    ``skip_corrupt`` every file is decoded once (in threads) and the unreadable ones are dropped
    (``skipped_files``, with a warning). ``labels``/``targets`` are int64 numpy arrays."""

    def __init__(
        self,
        root: str | Path,
        transform: Callable[[Image.Image], Any] | None = None,
        skip_corrupt: bool = False,
        classes: Sequence[str] | None = None,
        classes_from: str | Path | None = None,
    ) -> None:
        self._fixed_classes = list(classes) if classes is not None else None
        self._classes_from = classes_from or "the class list"
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

    def find_classes(self, directory: str | Path) -> tuple[list[str], dict[str, int]]:
        if self._fixed_classes is None:
            return super().find_classes(directory)
        present = sorted(e.name for e in os.scandir(directory) if e.is_dir())
        extra = [c for c in present if c not in self._fixed_classes]
        if extra:
            raise ValueError(f"image folder {directory} has class folder(s) not in "
                             f"{self._classes_from}: {', '.join(extra)}")
        return self._fixed_classes, {c: i for i, c in enumerate(self._fixed_classes)}

    def make_dataset(  # type: ignore[override]
        self,
        directory: str | Path,
        class_to_idx: dict[str, int],
        extensions: tuple[str, ...] | None = None,
        is_valid_file: Callable[[str], bool] | None = None,
        allow_empty: bool = False,
    ) -> list[tuple[str, int]]:
        """torchvision's ``make_dataset`` with :func:`_walk_once`; with a fixed class list a
        missing class folder is fine, an empty one present is still an error."""
        allow_empty = allow_empty or self._fixed_classes is not None
        directory = os.path.expanduser(directory)
        valid = is_valid_file or (
            lambda p: has_file_allowed_extension(p, extensions or IMG_EXTENSIONS))
        class_dirs = {c: os.path.join(directory, c) for c in sorted(class_to_idx)}
        reserved = {os.path.realpath(directory)} | {
            os.path.realpath(d) for d in class_dirs.values() if os.path.isdir(d)}
        seen: set[str] = set()
        samples, empty = [], []
        for name, target_dir in class_dirs.items():
            if not os.path.isdir(target_dir):
                if not allow_empty:
                    empty.append(name)
                continue
            files = [p for p in _walk_once(target_dir, seen, reserved) if valid(p)]
            samples += [(p, class_to_idx[name]) for p in files]
            if not files:
                empty.append(name)
        if empty or not samples:
            raise FileNotFoundError(f"Found no valid file for the classes "
                                    f"{', '.join(empty or class_dirs)} in {directory}")
        return samples

    @property
    def num_skipped(self) -> int:
        """How many unreadable files were dropped (0 unless ``skip_corrupt``)."""
        return len(self.skipped_files)


def image_folder(
    root: str | Path,
    transform: Callable[[Image.Image], Any] | None = None,
    skip_corrupt: bool = False,
    classes: Sequence[str] | None = None,
) -> SafeImageFolder:
    """An image-folder dataset (``root/<class>/<image>``, :class:`SafeImageFolder`) whose class
    list is ``classes``, else train's for a ``test``/``val`` split beside a ``train`` folder (every
    split numbers the classes alike), else the class folders of ``root``."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"image folder not found: {root}")
    source: Path | None = None
    if classes is None and root.name in EVAL_SPLITS and (root.parent / "train").is_dir():
        source = root.parent / "train"
        classes = sorted(e.name for e in os.scandir(source) if e.is_dir())
    return SafeImageFolder(root, transform=transform, skip_corrupt=skip_corrupt,
                           classes=classes, classes_from=source)
