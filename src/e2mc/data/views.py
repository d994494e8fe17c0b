"""View recipes as the official VICReg, SwAV and SimSiam code builds them, parameterized by image
size and channel count (each view a :class:`ViewSpec`), one view's parameters drawn as its
transforms draw them (:func:`draw_view_params`, for the fast pipeline) and the evaluation
transform (adaptations: ``docs/data.md``). Every random draw uses torch's RNG, so seeding torch and
the workers makes the views reproducible (exact resume relies on it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image
from torchvision import transforms as T
from torchvision.transforms import InterpolationMode

from .image_folder import to_8bit

__all__ = ["DATASET_STATS", "PARAM_FIELDS", "PARAM_INDEX", "RECIPES", "EvalTransform",
           "MultiCropTransform", "ViewSpec", "blur_kernel_size", "build_views",
           "default_normalization", "draw_view_params", "eval_transform"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
SWAV_IMAGENET_STD = (0.228, 0.224, 0.225)  # as in SwAV's multicropdataset.py
DATASET_STATS: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "imagenet": (IMAGENET_MEAN, IMAGENET_STD), "fashion-mnist": ((0.2860,), (0.3530,)),
    "mnist": ((0.1307,), (0.3081,))}
RECIPES = ("vicreg", "swav", "simsiam")
BLUR_SIGMA = (0.1, 2.0)


def default_normalization(channels: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """ImageNet mean/std for 3 channels, Fashion-MNIST's for 1 channel."""
    _check_channels(channels)
    return DATASET_STATS["imagenet" if channels == 3 else "fashion-mnist"]


def blur_kernel_size(image_size: int) -> int:
    """Odd Gaussian-blur kernel of about 10% of the image side, at least 3."""
    k = max(3, round(0.1 * image_size))
    return k if k % 2 == 1 else k + 1


def _check_channels(channels: int) -> None:
    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 or 3, got {channels}")


def _check_size(name: str, size: int) -> None:
    if isinstance(size, bool) or not isinstance(size, int) or size < 4:
        raise ValueError(f"{name} must be an integer >= 4, got {size!r}")


class _ToMode:
    """A PIL image as ``L`` (1 channel) or ``RGB`` (3), scaled by :func:`to_8bit`."""

    def __init__(self, channels: int) -> None:
        self.mode = "L" if channels == 1 else "RGB"

    def __call__(self, img: Image.Image) -> Image.Image:
        img = to_8bit(img)  # 16-bit and float images: scaled, not clipped
        return img if img.mode == self.mode else img.convert(self.mode)

    def __repr__(self) -> str:
        return f"_ToMode({self.mode!r})"


def _normalize(
    channels: int, mean: Sequence[float] | None, std: Sequence[float] | None, default_std=None
) -> T.Normalize:
    d_mean, d_std = default_normalization(channels)
    if default_std is not None and channels == 3:
        d_std = default_std
    mean = tuple(mean) if mean is not None else d_mean
    std = tuple(std) if std is not None else d_std
    if len(mean) != channels or len(std) != channels:
        raise ValueError(f"mean/std need {channels} values, got mean={mean}, std={std}")
    if any(s <= 0 for s in std):
        raise ValueError(f"std must be positive, got {std}")
    return T.Normalize(mean, std)


class ViewSpec(T.Compose):
    """One view of a recipe: its torchvision transforms (the PIL pipeline; the fast pipeline draws
    its parameters with them, :func:`draw_view_params`) and the values the fast pipeline applies
    them with. ``jitter``: ColorJitter's brightness, contrast, saturation, hue strengths (the last
    two dropped on 1 channel); the blur's kernel is the one of ``blur_size`` (default ``size``)."""

    def __init__(self, size: int, channels: int, norm: T.Normalize,
                 jitter: tuple[float, float, float, float], p_blur: float, *,
                 scale: tuple[float, float] = (0.08, 1.0),
                 interpolation: InterpolationMode = InterpolationMode.BILINEAR,
                 blur_size: int | None = None, p_solarize: float | None = None,
                 flip_last: bool = False) -> None:
        b, c, s, h = jitter
        color = T.ColorJitter(b, c) if channels == 1 else T.ColorJitter(b, c, s, h)
        # capped so the blur's reflect padding fits in the crop
        kernel = min(blur_kernel_size(blur_size or size), 2 * size - 1)
        blur = T.GaussianBlur(kernel_size=kernel, sigma=BLUR_SIGMA)
        steps = [T.RandomApply([color], p=0.8),
                 *([T.RandomGrayscale(p=0.2)] if channels == 3 else []),
                 blur if p_blur >= 1.0 else T.RandomApply([blur], p=p_blur)]
        if p_solarize is not None:
            steps.append(T.RandomSolarize(threshold=128, p=p_solarize))
        flip = T.RandomHorizontalFlip(p=0.5)
        steps = [*steps, flip] if flip_last else [flip, *steps]
        crop = T.RandomResizedCrop(size, scale=scale, interpolation=interpolation)
        super().__init__([_ToMode(channels), crop, *steps, T.ToTensor(), norm])
        self.size, self.interpolation, self.channels = size, interpolation, channels
        self.jitter = (color.brightness, color.contrast, color.saturation, color.hue)
        self.blur_kernel, self.solarize_threshold = kernel, 128.0  # on the 0-255 scale
        self.mean, self.std = tuple(norm.mean), tuple(norm.std)


class MultiCropTransform:
    """Each of ``transforms`` applied to one image; the first ``num_main_views`` are full-size."""

    def __init__(self, transforms: Sequence[ViewSpec], num_main_views: int = 2) -> None:
        self.transforms = list(transforms)
        self.num_main_views = num_main_views

    def __call__(self, img: Image.Image) -> list[torch.Tensor]:
        return [t(img) for t in self.transforms]

    def __repr__(self) -> str:
        inner = "\n".join(f"  {t}" for t in self.transforms)
        return f"MultiCropTransform(num_main_views={self.num_main_views},\n{inner}\n)"


def build_views(
    recipe: str,
    image_size: int,
    channels: int = 3,
    small_crop_size: int | None = None,
    *,
    num_small_crops: int = 6,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
) -> MultiCropTransform:
    """The view recipe ``recipe`` (``vicreg``, ``swav``, ``simsiam``; their parameters:
    ``docs/data.md``) as a callable ``PIL image -> list[Tensor]`` (float32, C x S x S). SwAV's
    small crops default to ``round(image_size * 96 / 224)``; normalization defaults to
    :func:`default_normalization` (``mean``/``std`` override it)."""
    if recipe not in RECIPES:
        raise ValueError(f"unknown view recipe {recipe!r}; choose one of {list(RECIPES)}")
    _check_size("image_size", image_size)
    _check_channels(channels)
    size = image_size
    if recipe == "vicreg":
        norm = _normalize(channels, mean, std)
        return MultiCropTransform([
            ViewSpec(size, channels, norm, (0.4, 0.4, 0.2, 0.1), p_blur, p_solarize=p_solarize,
                     interpolation=InterpolationMode.BICUBIC)
            for p_blur, p_solarize in ((1.0, 0.0), (0.1, 0.2))])
    if recipe == "simsiam":  # MoCo-v2's order: the flip last
        view = ViewSpec(size, channels, _normalize(channels, mean, std), (0.4, 0.4, 0.4, 0.1),
                        0.5, scale=(0.2, 1.0), flip_last=True)
        return MultiCropTransform([view, view])
    small = round(image_size * 96 / 224) if small_crop_size is None else small_crop_size
    _check_size("small_crop_size", small)
    if isinstance(num_small_crops, bool) or not isinstance(num_small_crops, int) \
            or num_small_crops < 0:
        raise ValueError(f"num_small_crops must be an integer >= 0, got {num_small_crops!r}")
    norm = _normalize(channels, mean, std, default_std=SWAV_IMAGENET_STD)
    # SwAV blurs every crop, small ones included, with the kernel of the full-size crop
    big, little = (ViewSpec(side, channels, norm, (0.8, 0.8, 0.8, 0.2), 0.5, scale=scale,
                            blur_size=size)
                   for side, scale in ((size, (0.14, 1.0)), (small, (0.05, 0.14))))
    return MultiCropTransform([big, big] + [little] * num_small_crops)


class EvalTransform:
    """Evaluation transform: an image not already ``image_size`` square is first resized (shorter
    side ``round(image_size * 256/224)``) and center-cropped, the ImageNet protocol."""

    def __init__(self, image_size: int, channels: int, normalize: T.Normalize) -> None:
        self.image_size = image_size
        self.to_mode = _ToMode(channels)
        self.resize_crop = T.Compose([
            T.Resize(round(image_size * 256 / 224)),
            T.CenterCrop(image_size),
        ])  # fmt: skip
        self.normalize = normalize
        self.to_tensor = T.Compose([T.ToTensor(), normalize])

    def __call__(self, img: Image.Image) -> torch.Tensor:
        img = self.to_mode(img)
        if img.size != (self.image_size, self.image_size):
            img = self.resize_crop(img)
        return self.to_tensor(img)

    def batchable(self, images: np.ndarray) -> bool:
        """Whether :meth:`batch` takes these images (uint8, square, this mode: no conversion)."""
        gray = images.ndim == 3
        return images.dtype == np.uint8 and images.shape[1:3] == (self.image_size,) * 2 and \
            (self.to_mode.mode == "L") == gray and (gray or images.shape[3] == 3)

    def batch(self, images: np.ndarray) -> torch.Tensor:
        """The transform of uint8 images ``[N, H, W]`` or ``[N, H, W, 3]`` at once, bit-identical
        to stacking :meth:`__call__` of each, for images :meth:`batchable` takes."""
        gray = images.ndim == 3
        x = torch.from_numpy(np.ascontiguousarray(images))
        x = x.unsqueeze(1) if gray else x.permute(0, 3, 1, 2)
        x = x.to(dtype=torch.get_default_dtype()).div(255)
        return self.normalize(x).contiguous()  # the Normalize of __call__, on [N, C, H, W]

    def __repr__(self) -> str:
        return f"EvalTransform(image_size={self.image_size}, {self.to_mode}, {self.to_tensor})"


def eval_transform(
    image_size: int,
    channels: int = 3,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
) -> EvalTransform:
    """The evaluation transform (:class:`EvalTransform`), normalized like :func:`build_views`."""
    _check_size("image_size", image_size)
    _check_channels(channels)
    return EvalTransform(image_size, channels, _normalize(channels, mean, std))


# Layout of one view's parameter vector (float32, :func:`draw_view_params`). Crop box in
# full-resolution pixels.
PARAM_FIELDS = ("top", "left", "height", "width", "flip", "jitter", "brightness", "contrast",
                "saturation", "hue", "order0", "order1", "order2", "order3", "gray", "blur",
                "sigma", "solarize")
PARAM_INDEX = {name: k for k, name in enumerate(PARAM_FIELDS)}
_I = PARAM_INDEX
_IDENTITY = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 2.0, 3.0, 0.0, 0.0, 0.0,
             0.0]


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
