"""The fast view pipeline: the recipes of :func:`~e2mc.data.views.build_views`, drawn the same way
(:func:`~e2mc.data.views.draw_view_params`, so a seed gives the same crops, flips and
factors) but decoded once (at 1/2-1/8 scale by libjpeg's DCT scaling when every crop keeps its
view's side), cropped and resized on uint8 tensors, and jittered with OpenCV or torch
(``mode="cpu"``) or on the training device (``mode="device"``, :class:`DeviceAugment`).
Differences from the PIL path (none changes a parameter distribution): no rounding to uint8
between photometric steps, hue shifted in float HSV, part of the antialiasing done by DCT scaling.
"""

from __future__ import annotations

import contextlib
import io
import math
import warnings
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torchvision.transforms.v2.functional as TF
from PIL import Image
from torch.utils.data import Dataset, default_collate, get_worker_info
from torchvision.io import ImageReadMode, decode_jpeg

from e2mc.errors import CorruptImageError

from . import photometric_cv2
from .image_folder import to_8bit
from .multiview import ViewBatch
from .photometric import apply_photometric, normalize_levels
from .subsets import subset_parts
from .views import PARAM_INDEX, MultiCropTransform, ViewSpec, draw_view_params

__all__ = ["DeviceAugment", "FastViewDataset", "FastViews", "collate_device_views"]

_DCT_SCALES = (8, 4, 2)


def _groups(specs: Sequence[ViewSpec]) -> list[list[int]]:
    """Indices of views that can be processed as one batch (every field of their spec alike)."""
    groups: dict[tuple, list[int]] = {}
    for k, s in enumerate(specs):
        key = (s.size, s.blur_kernel, s.mean, s.std, s.jitter, s.solarize_threshold, s.channels)
        groups.setdefault(key, []).append(k)
    return list(groups.values())


class FastViews:
    """``FastViews(build_views("vicreg", 224))(path)``: the float views of an image file
    (``mode="cpu"``) or ``(uint8 crops, params)`` for :class:`DeviceAugment` (``mode="device"``).
    ``draft=False`` always decodes at full size; an unreadable file raises
    :class:`CorruptImageError` naming it."""

    def __init__(self, views: MultiCropTransform, mode: str = "cpu", draft: bool = True,
                 backend: str = "auto") -> None:
        if mode not in ("cpu", "device"):
            raise ValueError(f"mode must be 'cpu' or 'device', got {mode!r}")
        if backend not in ("auto", "opencv", "torch"):
            raise ValueError(f"backend must be 'auto', 'opencv' or 'torch', got {backend!r}")
        if backend == "opencv" and not photometric_cv2.available():
            raise ValueError("backend 'opencv' needs opencv-python-headless (pip install "
                             "'e2mc[fast]')")
        self.backend = ("opencv" if photometric_cv2.available() else "torch") \
            if backend == "auto" else backend
        if not all(isinstance(t, ViewSpec) for t in views.transforms):
            raise ValueError("the fast pipeline takes the views of build_views")
        self.views = views
        self.specs: list[ViewSpec] = list(views.transforms)
        self.num_main_views = views.num_main_views
        self.mode = mode
        self.draft = draft
        self.channels = self.specs[0].channels
        # in a worker, views of >= 128 px go one by one (no gathers), smaller ones batched
        self.cpu_groups = [g2 for g in _groups(self.specs)
                           for g2 in ([g] if self.specs[g[0]].size < 128 else [[k] for k in g])]

    # ------------------------------------------------------------------ decoding
    def _reduction(self, params: list[torch.Tensor]) -> int:
        """The largest DCT scale reduction at which every crop keeps its view's side; else 1."""
        for r in _DCT_SCALES:
            if all(min(float(p[2]), float(p[3])) / r >= s.size
                   for p, s in zip(params, self.specs, strict=True)):
                return r
        return 1

    def _decode(self, data: bytes, img: Image.Image, reduce: int) -> torch.Tensor:
        mode = "L" if self.channels == 1 else "RGB"
        if img.format == "JPEG" and reduce > 1:
            img.draft(mode, (max(1, img.width // reduce), max(1, img.height // reduce)))
        elif img.format == "JPEG" and img.mode == "RGB" and self.channels == 3 and (
                hwc := photometric_cv2.decode_rgb_hwc(data, img.width, img.height)) is not None:
            return torch.from_numpy(hwc).permute(2, 0, 1)  # CHW view of the HWC pixels
        elif img.format == "JPEG" and img.mode in ("RGB", "L"):
            read = ImageReadMode.GRAY if self.channels == 1 else ImageReadMode.RGB
            with warnings.catch_warnings():  # torchvision >= 0.29 points to TorchCodec
                warnings.simplefilter("ignore", DeprecationWarning)
                return decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8),
                                   mode=read)
        img.load()
        img = to_8bit(img)  # 16-bit and float images: scaled, not clipped
        if img.mode != mode:
            img = img.convert(mode)
        return TF.pil_to_tensor(img)

    def _crops(self, path: str | Path) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        path = str(path)
        try:
            with open(path, "rb") as f:
                data = f.read()
            img = Image.open(io.BytesIO(data))
            width, height = img.size
            params = [draw_view_params(s, width, height) for s in self.specs]
            reduce = self._reduction(params) if self.draft and img.format == "JPEG" else 1
            image = self._decode(data, img, reduce)
        except (OSError, SyntaxError, ValueError, RuntimeError, Image.DecompressionBombError) \
                as err:
            raise CorruptImageError(f"cannot read image file {path}: {err}") from err
        scale_y, scale_x = image.shape[-2] / height, image.shape[-1] / width
        if reduce > 1:  # DCT scaling maps pixel x to x / reduce exactly
            scale_y = scale_x = 1.0 / reduce
        crops = []
        for p, s in zip(params, self.specs, strict=True):
            top, left, h, w = (float(v) for v in p[:4])
            y0, x0 = round(top * scale_y), round(left * scale_x)
            y1 = min(max(round((top + h) * scale_y), y0 + 1), image.shape[-2])
            x1 = min(max(round((left + w) * scale_x), x0 + 1), image.shape[-1])
            # a contiguous channels-last batch of one: the only input for which torch's
            # antialiased uint8 resize takes its vectorised path
            crop = image[None, :, y0:y1, x0:x1].contiguous(memory_format=torch.channels_last)
            crops.append(TF.resize(crop, [s.size, s.size], interpolation=s.interpolation,
                                   antialias=True)[0])
        return crops, params

    def __call__(self, path: str | Path, out: Sequence[torch.Tensor] | None = None) -> Any:
        """The views of the image file ``path``; with ``out`` (``mode="cpu"``, one uint8
        ``[C, S, S]`` tensor per view) written into it as 8-bit images, not normalised."""
        crops, params = self._crops(path)
        if self.mode == "device":
            if out is not None:
                raise ValueError("out= is for mode='cpu' (mode='device' returns uint8 crops)")
            return crops, params
        if self.backend == "opencv":
            levels = [self._opencv_levels(c, p, s, torch.empty_like(c) if out is None else out[k])
                      for k, (c, p, s) in enumerate(zip(crops, params, self.specs, strict=True))]
            if out is not None:
                return levels
            return [normalize_levels(v[None], s)[0]
                    for v, s in zip(levels, self.specs, strict=True)]
        views: list[torch.Tensor] = [torch.empty(0)] * len(crops)
        for group in self.cpu_groups:
            x = torch.stack([crops[k] for k in group]).float().div_(255.0)
            x = apply_photometric(x, torch.stack([params[k] for k in group]),
                                  self.specs[group[0]])  # gray levels
            if out is None:
                x = normalize_levels(x, self.specs[group[0]])
            for k, view in zip(group, x, strict=True):
                views[k] = view if out is None else out[k].copy_(view)
        return views

    def new_batch(self, n: int) -> list[torch.Tensor]:
        """Per view, an uninitialised uint8 ``[n, C, S, S]`` batch for ``__call__(path, out=...)``
        (in a worker in shared memory, as ``default_collate`` allocates, so it is sent uncopied)."""
        return [_batch_tensor((n, s.channels, s.size, s.size)) for s in self.specs]

    @staticmethod
    def _opencv_levels(crop: torch.Tensor, params: torch.Tensor, spec: ViewSpec,
                       out: torch.Tensor) -> torch.Tensor:
        """The gray levels of one view, written into the uint8 ``[C, S, S]`` ``out``."""
        c = crop.shape[0]
        if c == 3 and crop.permute(1, 2, 0).is_contiguous():  # resized channels-last: HWC
            u8 = crop.permute(1, 2, 0).numpy()
        else:
            planes = crop.numpy()
            u8 = planes[0] if c == 1 else photometric_cv2.cv2.merge(list(planes))  # interleave
        x = np.multiply(u8, np.float32(1 / 255), dtype=np.float32)
        p = params.tolist()
        x = photometric_cv2.photometric_hwc(x, p, PARAM_INDEX, spec.jitter, spec.blur_kernel,
                                            spec.solarize_threshold / 255.0)
        flip = p[PARAM_INDEX["flip"]] > 0.5  # done by the final copy (see photometric_hwc)
        photometric_cv2.write_levels(x, out.numpy(), flip)
        return out

    def __repr__(self) -> str:
        return (f"FastViews(mode={self.mode!r}, draft={self.draft}, backend={self.backend!r}, "
                f"{self.views!r})")


def _batch_tensor(shape: tuple[int, ...]) -> torch.Tensor:
    if get_worker_info() is not None:
        with contextlib.suppress(AttributeError, RuntimeError):  # torch's private allocation
            elem = torch.empty(0, dtype=torch.uint8)
            storage = elem._typed_storage()._new_shared(math.prod(shape), device=elem.device)
            return elem.new(storage).resize_(shape)
    return torch.empty(shape, dtype=torch.uint8)


class DeviceAugment:
    """What :class:`FastViews` leaves to the training device, on whole uint8 batches; returns the
    float, normalised views. ``(crops, params)`` (``mode="device"``): per view, the uint8
    ``[B, C, S, S]`` crops and their parameters (drawn in the workers, so resuming replays them)
    through the photometric steps. ``photometric=False``, ``(views, out=...)``: the finished
    8-bit views of :meth:`FastViewDataset.collated`, into ``out`` when its shapes match."""

    def __init__(self, views: FastViews, photometric: bool = True) -> None:
        self.specs = views.specs
        self.photometric = photometric

    def __call__(self, crops: Sequence[torch.Tensor],
                 params: Sequence[torch.Tensor] | None = None,
                 out: Sequence[torch.Tensor] | None = None) -> list[torch.Tensor]:
        if not self.photometric:
            if len(crops) != len(self.specs):
                raise ValueError(f"expected {len(self.specs)} views, got {len(crops)}")
            if out is not None and [o.shape for o in out] != [c.shape for c in crops]:
                out = None  # another batch size (the last batch, another run): new tensors
            return [normalize_levels(c, s, None if out is None else out[k])
                    for k, (c, s) in enumerate(zip(crops, self.specs, strict=True))]
        if params is None or len(crops) != len(self.specs) or len(params) != len(self.specs):
            raise ValueError(f"expected {len(self.specs)} views, got {len(crops)} crops and "
                             f"{0 if params is None else len(params)} parameter sets")
        return [normalize_levels(apply_photometric(c.float().div_(255.0), p, s), s)
                for c, p, s in zip(crops, params, self.specs, strict=True)]


class FastViewDataset(Dataset):
    """An image folder (or a subset of one): item ``i`` is ``(views(path_i), label_i)``."""

    def __init__(self, folder: Any, views: FastViews) -> None:
        folder, indices = subset_parts(folder)  # e.g. data.limit, a validation split
        if not hasattr(folder, "samples"):
            raise ValueError(f"the fast pipeline reads image files; {type(folder).__name__} "
                             "is not an image folder (use data.pipeline=pil)")
        samples = list(folder.samples)
        self.samples = samples if indices is None else [samples[i] for i in indices]
        self.views = views
        self.labels = np.asarray([label for _, label in self.samples], dtype=np.int64)
        self.classes = getattr(folder, "classes", None)
        self.num_skipped = int(getattr(folder, "num_skipped", 0))

    @property
    def targets(self) -> Any:
        return self.labels

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        path, label = self.samples[index]
        return self.views(path), int(label)

    @property
    def collates(self) -> bool:
        """Whether :meth:`collated` applies (``mode="cpu"``)."""
        return self.views.mode == "cpu"

    def collated(self, indices: Sequence[int],
                 contexts: Sequence[AbstractContextManager] | None = None) -> ViewBatch:
        """Items ``indices`` as one batch of 8-bit views written straight into it (shared memory
        in a worker; ``DeviceAugment(views, photometric=False)`` normalises them to the views of
        ``self[i]``). ``contexts[k]`` (e.g. the sample's seeding) is entered around item ``k``."""
        if not self.collates:
            raise ValueError("collated() is for mode='cpu'; mode='device' collates uint8 crops "
                             "with collate_device_views")
        batch = self.views.new_batch(len(indices))
        labels = torch.empty(len(indices), dtype=torch.long)
        for k, index in enumerate(indices):
            path, label = self.samples[index]
            with contexts[k] if contexts is not None else contextlib.nullcontext():
                self.views(path, out=[view[k] for view in batch])
            labels[k] = int(label)
        return ViewBatch(batch, labels)


def collate_device_views(items: Sequence[Any]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per-view uint8 crop and parameter batches of ``((crops, params), label)`` items."""
    per_item = [views for views, _ in items]
    crops = [default_collate(list(v)) for v in zip(*(c for c, _ in per_item), strict=True)]
    params = [default_collate(list(v)) for v in zip(*(p for _, p in per_item), strict=True)]
    return crops, params
