"""Natural-looking synthetic photos for benchmarks and tests of the image pipeline.

Random images are a poor stand-in for photos: white noise compresses badly (JPEGs several times
larger than ImageNet's) and flat colours far too well. These images mix smooth gradients (noise
upsampled from a few cells), textures at three finer scales, a few opaque shapes with sharp edges,
and sensor-like grain, so that a JPEG at quality 90 has roughly the size and decode cost of an
ImageNet photo of the same size (about 80-150 kB at 500x375).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

__all__ = ["natural_image", "write_jpeg_folder"]


def _layer(rng: np.random.Generator, cells: int, width: int, height: int) -> np.ndarray:
    """Gaussian noise on a ``cells``-wide grid, upsampled bicubically, scaled to [-1, 1]."""
    rows = max(2, round(cells * height / width))
    small = rng.normal(size=(rows, cells, 3))
    small = (small - small.min()) / max(float(np.ptp(small)), 1e-6)
    up = Image.fromarray((small * 255).astype(np.uint8)).resize((width, height), Image.BICUBIC)
    return np.asarray(up, dtype=np.float32) / 127.5 - 1.0


def natural_image(rng: np.random.Generator, width: int = 500, height: int = 375) -> Image.Image:
    """An RGB photo-like image: smooth colour fields, textures, shapes with edges, grain."""
    img = np.full((height, width, 3), 128.0, dtype=np.float32)
    for cells, amplitude in ((3, 70.0), (12, 35.0), (60, 30.0), (width // 2, 40.0)):
        img += amplitude * _layer(rng, cells, width, height)
    pil = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(pil)
    for _ in range(int(rng.integers(3, 9))):
        x, y = int(rng.integers(0, width)), int(rng.integers(0, height))
        r = int(rng.integers(10, max(11, min(width, height) // 3)))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        if rng.random() < 0.5:
            draw.ellipse([x - r, y - r, x + r, y + r], fill=colour)
        else:
            draw.rectangle([x - r, y - r // 2, x + r, y + r // 2], fill=colour)
    pil = pil.filter(ImageFilter.GaussianBlur(0.4))
    grain = rng.normal(0.0, 9.0, (height, width, 1)).astype(np.float32)
    out = np.asarray(pil, dtype=np.float32) + grain
    return Image.fromarray(np.clip(out, 0, 255).astype(np.uint8))


def write_jpeg_folder(root: str | Path, n: int, size: tuple[int, int] = (500, 375),
                      quality: int = 90, classes: int = 2, seed: int = 0) -> list[Path]:
    """Write ``n`` JPEGs of ``size`` (width, height) as ``root/class_<k>/img_<i>.jpg`` (an image
    folder with ``classes`` classes); returns the paths. Deterministic in ``seed``."""
    rng = np.random.default_rng(seed)
    root = Path(root)
    paths = []
    for i in range(n):
        folder = root / f"class_{i % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"img_{i:05d}.jpg"
        natural_image(rng, *size).save(path, "JPEG", quality=quality)
        paths.append(path)
    return paths
