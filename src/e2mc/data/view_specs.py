"""A view recipe read as parameters (:class:`ViewSpec`), and one image's view parameters drawn
with the recipe's own torchvision transforms (:func:`draw_view_params`: a seed gives the crops,
flips and factors of :func:`~e2mc.data.views.build_views`) for the fast pipeline."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torchvision import transforms as T

from .views import MultiCropTransform

__all__ = ["PARAM_FIELDS", "PARAM_INDEX", "ViewSpec", "draw_view_params", "view_specs"]

# Layout of one view's parameter vector (float32). Crop box in full-resolution pixels.
PARAM_FIELDS = ("top", "left", "height", "width", "flip", "jitter", "brightness", "contrast",
                "saturation", "hue", "order0", "order1", "order2", "order3", "gray", "blur",
                "sigma", "solarize")
PARAM_INDEX = {name: k for k, name in enumerate(PARAM_FIELDS)}
_I = PARAM_INDEX
_IDENTITY = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 2.0, 3.0, 0.0, 0.0, 0.0,
             0.0]
# photometric steps must come in this order in a recipe (the flip commutes with all of them)
_ORDER = ("jitter", "gray", "blur", "solarize")


@dataclass(frozen=True)
class ViewSpec:
    """One view of a recipe, read from its torchvision ``Compose``."""

    transforms: tuple[Any, ...]
    size: int
    interpolation: T.InterpolationMode
    channels: int
    jitter: tuple[tuple[float, float] | None, ...]  # brightness, contrast, saturation, hue ranges
    blur_kernel: int
    solarize_threshold: float  # on the 0-255 scale
    mean: tuple[float, ...]
    std: tuple[float, ...]


def _unwrap(t: Any) -> list[Any]:
    return list(t.transforms) if isinstance(t, T.RandomApply) else [t]


def view_specs(views: MultiCropTransform) -> list[ViewSpec]:
    """The :class:`ViewSpec` of each view; ``ValueError`` on what the fast pipeline lacks."""
    specs = []
    for compose in views.transforms:
        if not isinstance(compose, T.Compose):
            raise ValueError(f"expected a torchvision Compose per view, got {type(compose)}")
        size, interp, channels = None, T.InterpolationMode.BILINEAR, 3
        jitter: tuple = (None, None, None, None)
        kernel, threshold, mean, std, kinds = 0, 128.0, None, None, []
        for t in compose.transforms:
            for inner in _unwrap(t):
                if isinstance(inner, T.RandomResizedCrop):
                    size, interp = inner.size[0], inner.interpolation
                    if inner.size[0] != inner.size[1]:
                        raise ValueError("the fast pipeline needs square crops")
                elif isinstance(inner, T.ColorJitter):
                    jitter = (inner.brightness, inner.contrast, inner.saturation, inner.hue)
                    kinds.append("jitter")
                elif isinstance(inner, T.RandomGrayscale):
                    kinds.append("gray")
                elif isinstance(inner, T.GaussianBlur):
                    kernel = inner.kernel_size[0]
                    if inner.kernel_size[0] != inner.kernel_size[1]:
                        raise ValueError("the fast pipeline needs square blur kernels")
                    kinds.append("blur")
                elif isinstance(inner, T.RandomSolarize):
                    threshold = float(inner.threshold)
                    kinds.append("solarize")
                elif isinstance(inner, T.Normalize):
                    mean, std = tuple(inner.mean), tuple(inner.std)
                elif type(inner).__name__ == "_ToMode":
                    channels = 1 if inner.mode == "L" else 3
                elif not isinstance(inner, (T.RandomHorizontalFlip, T.ToTensor)):
                    raise ValueError(f"the fast pipeline has no {type(inner).__name__}")
        if size is None or mean is None or std is None:
            raise ValueError("each view needs a RandomResizedCrop and a Normalize")
        if [k for k in _ORDER if k in kinds] != kinds:
            raise ValueError(f"photometric steps in order {kinds}; the fast pipeline applies "
                             f"them as {list(_ORDER)}")
        specs.append(ViewSpec(tuple(compose.transforms), int(size), interp, channels, jitter,
                              int(kernel), threshold, mean, std))
    return specs


def _dims(width: int, height: int) -> torch.Tensor:
    """A stand-in image for ``RandomResizedCrop.get_params`` (only its size is read)."""
    return torch.empty((1, 1, 1), dtype=torch.uint8).expand(1, height, width)


def _draw_one(t: Any, p: list[float], width: int, height: int) -> None:
    if isinstance(t, T.RandomResizedCrop):
        i, j, h, w = t.get_params(_dims(width, height), t.scale, t.ratio)
        p[0:4] = [float(i), float(j), float(h), float(w)]
    elif isinstance(t, T.RandomHorizontalFlip):
        p[_I["flip"]] = float(bool(torch.rand(1) < t.p))
    elif isinstance(t, T.RandomApply):
        if t.p < torch.rand(1):
            return
        for inner in t.transforms:
            _draw_one(inner, p, width, height)
    elif isinstance(t, T.ColorJitter):
        order, b, c, s, h = t.get_params(t.brightness, t.contrast, t.saturation, t.hue)
        p[_I["jitter"]] = 1.0
        for name, value in (("brightness", b), ("contrast", c), ("saturation", s), ("hue", h)):
            if value is not None:
                p[_I[name]] = float(value)
        p[_I["order0"]: _I["order0"] + 4] = [float(k) for k in order.tolist()]
    elif isinstance(t, T.RandomGrayscale):
        p[_I["gray"]] = float(bool(torch.rand(1) < t.p))
    elif isinstance(t, T.GaussianBlur):
        p[_I["blur"]] = 1.0
        p[_I["sigma"]] = float(t.get_params(t.sigma[0], t.sigma[1]))
    elif isinstance(t, T.RandomSolarize):
        p[_I["solarize"]] = float(torch.rand(1).item() < t.p)


def draw_view_params(spec: ViewSpec, width: int, height: int) -> torch.Tensor:
    """One view's ``PARAM_FIELDS`` for a ``width x height`` image, drawn as the recipe draws."""
    p = list(_IDENTITY)
    for t in spec.transforms:
        _draw_one(t, p, width, height)
    return torch.tensor(p, dtype=torch.float32)
