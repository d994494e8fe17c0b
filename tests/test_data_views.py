"""View recipes, the evaluation transform, multi-view datasets and their collation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader
from torchvision import transforms as T
from torchvision.transforms import InterpolationMode

from e2mc.data import (
    ArrayDataset,
    MultiViewDataset,
    blur_kernel_size,
    build_views,
    collate_views,
    eval_transform,
)

RNG = np.random.default_rng(0)
GRAY = Image.fromarray(RNG.integers(0, 256, (28, 28), dtype=np.uint8))
RGB = Image.fromarray(RNG.integers(0, 256, (32, 32, 3), dtype=np.uint8))


@pytest.mark.parametrize(
    ("recipe", "image", "size", "channels", "sizes"),
    [
        ("vicreg", GRAY, 28, 1, [28, 28]),
        ("simsiam", GRAY, 28, 1, [28, 28]),
        ("swav", GRAY, 28, 1, [28, 28] + [12] * 6),  # round(28 * 96 / 224) = 12
        ("vicreg", RGB, 32, 3, [32, 32]),
        ("simsiam", RGB, 32, 3, [32, 32]),
        ("swav", RGB, 32, 3, [32, 32] + [14] * 6),  # round(32 * 96 / 224) = 14
    ],
)
def test_views_shapes_and_randomness(recipe, image, size, channels, sizes) -> None:
    views_fn = build_views(recipe, size, channels)
    assert len(views_fn.transforms) == len(sizes) and views_fn.num_main_views == 2
    torch.manual_seed(0)
    views = views_fn(image)
    assert [tuple(v.shape) for v in views] == [(channels, s, s) for s in sizes]
    assert all(v.dtype == torch.float32 for v in views)
    again = views_fn(image)
    assert not torch.equal(views[0], again[0]), "a second call draws new views"
    assert not torch.equal(views[0], views[1]), "the two main views differ"
    torch.manual_seed(0)
    replay = views_fn(image)
    assert all(torch.equal(a, b) for a, b in zip(views, replay, strict=True)), "torch RNG only"


def test_channel_conversion_and_small_crop_override() -> None:
    views = build_views("swav", 16, channels=3, small_crop_size=8, num_small_crops=2)(GRAY)
    assert [tuple(v.shape) for v in views] == [(3, 16, 16)] * 2 + [(3, 8, 8)] * 2
    assert [tuple(v.shape) for v in build_views("vicreg", 16, channels=1)(RGB)] == [(1, 16, 16)] * 2
    tiny = build_views("swav", 224, channels=1, small_crop_size=4)(GRAY)  # 23 px kernel capped at 7
    assert [tuple(v.shape) for v in tiny] == [(1, 224, 224)] * 2 + [(1, 4, 4)] * 6


def _ops(compose: T.Compose) -> list:
    """Flatten a Compose, unwrapping RandomApply into (p, transform)."""
    out = []
    for t in compose.transforms:
        if isinstance(t, T.RandomApply):
            out += [(t.p, inner) for inner in t.transforms]
        else:
            out.append((None, t))
    return out


def _find(ops: list, cls) -> list:
    return [(p, t) for p, t in ops if isinstance(t, cls)]


def test_vicreg_matches_official_parameters() -> None:
    first, second = (_ops(c) for c in build_views("vicreg", 224, 3).transforms)
    for ops, p_blur, p_sol in ((first, None, 0.0), (second, 0.1, 0.2)):
        ((_, crop),) = _find(ops, T.RandomResizedCrop)
        assert crop.size == (224, 224) and crop.scale == (0.08, 1.0)
        assert crop.interpolation == InterpolationMode.BICUBIC
        ((p, jitter),) = _find(ops, T.ColorJitter)
        assert p == 0.8 and jitter.brightness == (0.6, 1.4) and jitter.contrast == (0.6, 1.4)
        assert jitter.saturation == (0.8, 1.2) and jitter.hue == (-0.1, 0.1)
        assert _find(ops, T.RandomGrayscale)[0][1].p == 0.2
        assert _find(ops, T.RandomHorizontalFlip)[0][1].p == 0.5
        ((pb, blur),) = _find(ops, T.GaussianBlur)
        assert pb == p_blur and blur.kernel_size == (23, 23) and blur.sigma == (0.1, 2.0)
        assert _find(ops, T.RandomSolarize)[0][1].p == p_sol
        assert _find(ops, T.RandomSolarize)[0][1].threshold == 128
        norm = _find(ops, T.Normalize)[0][1]
        assert norm.mean == (0.485, 0.456, 0.406) and norm.std == (0.229, 0.224, 0.225)


def test_swav_and_simsiam_match_official_parameters() -> None:
    swav = [_ops(c) for c in build_views("swav", 224, 3).transforms]
    crops = [_find(ops, T.RandomResizedCrop)[0][1] for ops in swav]
    assert [(c.size[0], c.scale) for c in crops] == [(224, (0.14, 1.0))] * 2 + [
        (96, (0.05, 0.14))
    ] * 6
    for ops in swav:
        ((p, jitter),) = _find(ops, T.ColorJitter)
        assert p == 0.8 and jitter.brightness == pytest.approx((0.2, 1.8))
        assert jitter.saturation == pytest.approx((0.2, 1.8)) and jitter.hue == (-0.2, 0.2)
        ((p_blur, blur),) = _find(ops, T.GaussianBlur)
        assert p_blur == 0.5 and blur.kernel_size == (23, 23)  # cv2 (23, 23) for every crop
        assert _find(ops, T.Normalize)[0][1].std == (0.228, 0.224, 0.225)
    simsiam = [_ops(c) for c in build_views("simsiam", 224, 3).transforms]
    for ops in simsiam:
        assert _find(ops, T.RandomResizedCrop)[0][1].scale == (0.2, 1.0)
        ((p, jitter),) = _find(ops, T.ColorJitter)
        assert p == 0.8 and jitter.saturation == (0.6, 1.4) and jitter.hue == (-0.1, 0.1)
        assert _find(ops, T.RandomGrayscale)[0][1].p == 0.2
        assert _find(ops, T.GaussianBlur)[0][0] == 0.5
        # MoCo-v2 order: crop, jitter, grayscale, blur, flip
        kinds = [type(t) for _, t in ops]
        assert kinds.index(T.GaussianBlur) < kinds.index(T.RandomHorizontalFlip)


def test_grayscale_recipe_drops_saturation_hue_and_grayscale() -> None:
    for recipe in ("vicreg", "swav", "simsiam"):
        for compose in build_views(recipe, 28, 1).transforms:
            ops = _ops(compose)
            ((_, jitter),) = _find(ops, T.ColorJitter)
            assert jitter.saturation is None and jitter.hue is None
            assert jitter.brightness is not None and jitter.contrast is not None
            assert not _find(ops, T.RandomGrayscale)
            norm = _find(ops, T.Normalize)[0][1]
            assert norm.mean == (0.2860,) and norm.std == (0.3530,)
    custom = build_views("vicreg", 28, 1, mean=[0.1307], std=[0.3081]).transforms[0]
    assert _find(_ops(custom), T.Normalize)[0][1].std == (0.3081,)


def test_blur_kernel_size() -> None:
    assert [blur_kernel_size(s) for s in (224, 96, 32, 28, 12)] == [23, 11, 3, 3, 3]


def test_eval_transform_values() -> None:
    const = Image.new("L", (28, 28), 128)
    out = eval_transform(28, 1)(const)
    assert out.shape == (1, 28, 28)
    torch.testing.assert_close(out, torch.full((1, 28, 28), (128 / 255 - 0.2860) / 0.3530))
    rgb = eval_transform(32, 3)(Image.new("RGB", (64, 48), (255, 0, 51)))
    assert rgb.shape == (3, 32, 32)
    expected = (torch.tensor([1.0, 0.0, 0.2]) - torch.tensor([0.485, 0.456, 0.406])) / torch.tensor(
        [0.229, 0.224, 0.225]
    )
    torch.testing.assert_close(rgb[:, 16, 16], expected)
    # no resize when the image already has the size: pixels map one to one
    img = Image.fromarray(np.arange(16 * 16, dtype=np.uint8).reshape(16, 16))
    plain = eval_transform(16, 1, mean=[0.0], std=[1.0])(img)
    torch.testing.assert_close(plain[0], torch.arange(256, dtype=torch.float32).view(16, 16) / 255)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="unknown view recipe 'byol'"):
        build_views("byol", 28, 1)
    with pytest.raises(ValueError, match="channels"):
        build_views("vicreg", 28, 2)
    with pytest.raises(ValueError, match="mean/std need 1 values"):
        build_views("vicreg", 28, 1, mean=[0.5, 0.5, 0.5], std=[0.2, 0.2, 0.2])
    with pytest.raises(ValueError, match="image_size"):
        eval_transform(0, 1)


def test_multiview_dataset_and_collate() -> None:
    images = np.random.default_rng(1).integers(0, 256, (6, 28, 28), dtype=np.uint8)
    base = ArrayDataset(images, np.arange(6) % 3)
    ds = MultiViewDataset(base, build_views("swav", 28, 1))
    assert len(ds) == 6 and ds.labels is base.labels
    loader = DataLoader(ds, batch_size=4, collate_fn=collate_views)
    views, labels = next(iter(loader))
    assert [tuple(v.shape) for v in views] == [(4, 1, 28, 28)] * 2 + [(4, 1, 12, 12)] * 6
    torch.testing.assert_close(labels, torch.tensor([0, 1, 2, 0]))
    with pytest.raises(TypeError, match="transform=None"):
        MultiViewDataset(ArrayDataset(images, None, transform=T.ToTensor()), lambda im: [im])[0]
