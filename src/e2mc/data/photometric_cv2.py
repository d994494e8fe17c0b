"""The photometric augmentations of one view with OpenCV (float32, height x width x channels):
the fast pipeline's worker path when ``opencv-python-headless`` is installed (the ``fast``
extra), with torchvision's formulas on float images (:mod:`e2mc.data.photometric` is the torch
fallback). Grayscale uses OpenCV's 0.299 luma weight (torchvision 0.2989: below 1e-4); the blur's
``BORDER_REFLECT_101`` is torchvision's ``reflect`` padding.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import numpy as np

try:  # optional dependency (the ``fast`` extra)
    import cv2
except ImportError:  # pragma: no cover - exercised where OpenCV is absent
    cv2 = None

__all__ = ["BLUR_TAIL", "available", "blur_size", "decode_rgb_hwc", "photometric_hwc",
           "write_levels"]

# The blur drops the kernel's outer taps holding at most this mass: a quarter of a gray level,
# less than the official pipeline's uint8 rounding after every step; about half the taps.
BLUR_TAIL = 1.0 / 1024

_THREADS_SET_IN: int | None = None


def available() -> bool:
    """Whether OpenCV can be imported."""
    return cv2 is not None


def decode_rgb_hwc(data: bytes, width: int, height: int) -> np.ndarray | None:
    """An RGB JPEG decoded by OpenCV into ``height x width x 3`` uint8 (PIL's pixels, EXIF
    orientation ignored as PIL does; interleaved, as torch's fast uint8 resize and the OpenCV
    steps want it), or None without OpenCV or when the size is not the header's."""
    if cv2 is None:
        return None
    _one_thread()
    flags = cv2.IMREAD_COLOR_RGB | cv2.IMREAD_IGNORE_ORIENTATION
    image = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), flags)
    if image is None or image.shape != (height, width, 3):
        return None
    return image


def _one_thread() -> None:
    """OpenCV on one thread per process: DataLoader workers are the parallelism."""
    global _THREADS_SET_IN
    if os.getpid() != _THREADS_SET_IN:
        cv2.setNumThreads(1)
        _THREADS_SET_IN = os.getpid()


def _luma(x: np.ndarray) -> np.ndarray:
    return cv2.cvtColor(x, cv2.COLOR_RGB2GRAY)


def _brightness(x: np.ndarray, f: float) -> np.ndarray:
    x *= f
    return np.clip(x, 0.0, 1.0, out=x)


def _contrast(x: np.ndarray, f: float) -> np.ndarray:
    means = cv2.mean(x)
    mean = (0.299 * means[0] + 0.587 * means[1] + 0.114 * means[2]) if x.ndim == 3 else means[0]
    x *= f
    x += (1.0 - f) * mean
    return np.clip(x, 0.0, 1.0, out=x)


def _saturation(x: np.ndarray, f: float) -> np.ndarray:
    if x.ndim == 2:
        return x
    gray = cv2.cvtColor(_luma(x), cv2.COLOR_GRAY2RGB)
    out = cv2.addWeighted(x, f, gray, 1.0 - f, 0.0)
    return np.clip(out, 0.0, 1.0, out=out)


def _hue(x: np.ndarray, h: float) -> np.ndarray:
    if x.ndim == 2:
        return x
    hsv = cv2.cvtColor(x, cv2.COLOR_RGB2HSV)
    # OpenCV's HSV -> RGB wraps hues in [360, 720) but not negative ones: shift by 360 h mod 360
    hsv = cv2.add(hsv, (360.0 * h % 360.0, 0.0, 0.0, 0.0))
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)


_JITTER = (_brightness, _contrast, _saturation, _hue)


def blur_size(sigma: float, kernel_size: int, tail: float = BLUR_TAIL) -> int:
    """The smallest odd kernel holding all but ``tail`` of the recipe's kernel's mass."""
    half = kernel_size // 2
    weights = [math.exp(-0.5 * (i / sigma) ** 2) for i in range(half + 1)]
    total = weights[0] + 2 * sum(weights[1:])
    outside = 0.0
    for radius in range(half, 0, -1):  # grow the dropped tail from the outermost tap inwards
        outside += 2 * weights[radius] / total
        if outside > tail:
            return 2 * radius + 1
    return 1


def write_levels(x: np.ndarray, out: np.ndarray, flip: bool) -> None:
    """A float32 ``H x W [x C]`` view in [0, 1] written into the uint8 ``C x H x W`` ``out`` as
    its gray levels ``round(255 x)`` (half to even), mirrored if ``flip``."""
    levels = cv2.convertScaleAbs(x, alpha=255.0)  # saturated to [0, 255]
    chw = levels[None] if levels.ndim == 2 else levels.transpose(2, 0, 1)
    np.copyto(out, chw[..., ::-1] if flip else chw)


def photometric_hwc(x: np.ndarray, p: Sequence[float], index: dict[str, int],
                    jitter_ranges: Sequence[object], blur_kernel: int, threshold: float
                    ) -> np.ndarray:
    """Jitter (in the drawn order), grayscale, blur and solarize one float32 view in [0, 1]
    (``H x W x 3`` or ``H x W``) with its parameters ``p`` (fields at ``index``); same layout.
    The flip commutes with every step, so the caller's final copy does it."""
    _one_thread()
    if p[index["jitter"]] > 0.5:
        factors = [p[index[k]] for k in ("brightness", "contrast", "saturation", "hue")]
        for k in range(4):
            op = int(round(p[index["order0"] + k]))
            if jitter_ranges[op] is not None:
                x = _JITTER[op](x, factors[op])
    if x.ndim == 3 and p[index["gray"]] > 0.5:
        x = cv2.cvtColor(_luma(x), cv2.COLOR_GRAY2RGB)
    if p[index["blur"]] > 0.5:
        s = p[index["sigma"]]
        k = blur_size(s, blur_kernel)
        if k > 1:
            x = cv2.GaussianBlur(x, (k, k), sigmaX=s, sigmaY=s, borderType=cv2.BORDER_REFLECT_101)
    if p[index["solarize"]] > 0.5:
        x = np.where(x >= threshold, np.float32(1.0) - x, x)
    return x
