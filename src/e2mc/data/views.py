"""View recipes as the official VICReg, SwAV and SimSiam code builds them, parameterized by image
size and channel count, and the evaluation transform (adaptations: ``docs/data.md``). Every random
draw uses torch's RNG, so seeding torch and the workers makes the views reproducible (exact
resume relies on it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from PIL import Image
from torchvision import transforms as T
from torchvision.transforms import InterpolationMode

from .image_folder import to_8bit

__all__ = ["DATASET_STATS", "RECIPES", "EvalTransform", "MultiCropTransform", "blur_kernel_size",
           "build_views", "default_normalization", "eval_transform"]

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


def _color(
    channels: int, jitter: tuple[float, float, float, float], p_jitter: float, p_gray: float
) -> list[Callable]:
    b, c, s, h = jitter
    if channels == 1:
        return [T.RandomApply([T.ColorJitter(brightness=b, contrast=c)], p=p_jitter)]
    return [
        T.RandomApply([T.ColorJitter(brightness=b, contrast=c, saturation=s, hue=h)], p=p_jitter),
        T.RandomGrayscale(p=p_gray),
    ]


def _blur(size: int, p: float, crop_size: int | None = None) -> list[Callable]:
    """Blur with the kernel for ``size``, capped so its reflect padding fits in ``crop_size``."""
    kernel = min(blur_kernel_size(size), 2 * (crop_size or size) - 1)
    blur = T.GaussianBlur(kernel_size=kernel, sigma=BLUR_SIGMA)
    if p >= 1.0:
        return [blur]
    return [T.RandomApply([blur], p=p)] if p > 0 else []


class MultiCropTransform:
    """Each of ``transforms`` applied to one image; the first ``num_main_views`` are full-size."""

    def __init__(self, transforms: Sequence[Callable], num_main_views: int = 2) -> None:
        self.transforms = list(transforms)
        self.num_main_views = num_main_views

    def __call__(self, img: Image.Image) -> list[torch.Tensor]:
        return [t(img) for t in self.transforms]

    def __repr__(self) -> str:
        inner = "\n".join(f"  {t}" for t in self.transforms)
        return f"MultiCropTransform(num_main_views={self.num_main_views},\n{inner}\n)"


def _vicreg(size: int, channels: int, norm: T.Normalize) -> list[Callable]:
    def branch(p_blur: float, p_solarize: float) -> T.Compose:
        return T.Compose([
            _ToMode(channels),
            T.RandomResizedCrop(size, interpolation=InterpolationMode.BICUBIC),
            T.RandomHorizontalFlip(p=0.5),
            *_color(channels, (0.4, 0.4, 0.2, 0.1), p_jitter=0.8, p_gray=0.2),
            *_blur(size, p_blur),
            T.RandomSolarize(threshold=128, p=p_solarize),
            T.ToTensor(),
            norm,
        ])  # fmt: skip

    return [branch(1.0, 0.0), branch(0.1, 0.2)]


def _swav(size: int, small: int, n_small: int, channels: int, norm: T.Normalize) -> list[Callable]:
    # SwAV blurs every crop, small ones included, with the kernel of the full-size crop.
    def crop(crop_size: int, scale: tuple[float, float]) -> T.Compose:
        return T.Compose([
            _ToMode(channels),
            T.RandomResizedCrop(crop_size, scale=scale),
            T.RandomHorizontalFlip(p=0.5),
            *_color(channels, (0.8, 0.8, 0.8, 0.2), p_jitter=0.8, p_gray=0.2),
            *_blur(size, 0.5, crop_size),
            T.ToTensor(),
            norm,
        ])  # fmt: skip

    return [crop(size, (0.14, 1.0))] * 2 + [crop(small, (0.05, 0.14))] * n_small


def _simsiam(size: int, channels: int, norm: T.Normalize) -> list[Callable]:
    branch = T.Compose([
        _ToMode(channels),
        T.RandomResizedCrop(size, scale=(0.2, 1.0)),
        *_color(channels, (0.4, 0.4, 0.4, 0.1), p_jitter=0.8, p_gray=0.2),
        *_blur(size, 0.5),
        T.RandomHorizontalFlip(p=0.5),
        T.ToTensor(),
        norm,
    ])  # fmt: skip
    return [branch, branch]


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
    if recipe == "vicreg":
        return MultiCropTransform(_vicreg(image_size, channels, _normalize(channels, mean, std)))
    if recipe == "simsiam":
        return MultiCropTransform(_simsiam(image_size, channels, _normalize(channels, mean, std)))
    small = round(image_size * 96 / 224) if small_crop_size is None else small_crop_size
    _check_size("small_crop_size", small)
    if isinstance(num_small_crops, bool) or not isinstance(num_small_crops, int) \
            or num_small_crops < 0:
        raise ValueError(f"num_small_crops must be an integer >= 0, got {num_small_crops!r}")
    norm = _normalize(channels, mean, std, default_std=SWAV_IMAGENET_STD)
    return MultiCropTransform(_swav(image_size, small, num_small_crops, channels, norm))


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
        normalize = self.to_tensor.transforms[1]
        mean = torch.as_tensor(normalize.mean, dtype=x.dtype).view(1, -1, 1, 1)
        std = torch.as_tensor(normalize.std, dtype=x.dtype).view(1, -1, 1, 1)
        return x.sub_(mean).div_(std).contiguous()

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
