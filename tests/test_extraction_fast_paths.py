"""The two fast paths of feature extraction: an in-memory image array transformed a batch at a
time (the same tensors as a DataLoader of its items), and a convolutional backbone run as a
channels-last copy on a CPU (the same features to float rounding; the model itself untouched)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Subset

from e2mc.data.datasets import ArrayDataset
from e2mc.data.views import eval_transform
from e2mc.evaluation.features import cpu_channels_last, extract_features
from e2mc.models import build_backbone


def _images(shape, seed=0):
    return np.random.default_rng(seed).integers(0, 256, size=shape, dtype=np.uint8)


@pytest.mark.parametrize("shape, channels, mean", [
    ((50, 12, 12), 1, None), ((50, 12, 12, 3), 3, None), ((50, 12, 12), 1, (0.3,)),
])
def test_array_batches_equal_the_dataloader_of_its_items(shape, channels, mean):
    ds = ArrayDataset(_images(shape), np.arange(50) % 7,
                      eval_transform(12, channels, mean=mean, std=(0.2,) * channels
                                     if mean else None))
    for indices in (None, [3, 1, 4, 1, 5, 9, 2, 6, 49]):
        part = ds if indices is None else Subset(ds, indices)
        expected = list(DataLoader(part, batch_size=8))
        got = list(ds.batches(8, indices))
        assert len(got) == len(expected)
        for (a, ya), (b, yb) in zip(expected, got, strict=True):
            assert torch.equal(a, b) and a.dtype == b.dtype and torch.equal(ya, yb)


@pytest.mark.parametrize("shape, size, channels", [
    ((10, 12, 12), 8, 1),        # needs a resize and crop
    ((10, 12, 12), 12, 3),       # grayscale to RGB
    ((10, 12, 12, 3), 12, 1),    # RGB to grayscale
])
def test_images_the_batch_form_cannot_take_go_item_by_item(shape, size, channels):
    ds = ArrayDataset(_images(shape), None, eval_transform(size, channels))
    assert ds.batches(4) is None
    assert ArrayDataset(_images(shape), None, None).batches(4) is None  # no transform


def test_extraction_of_an_array_is_the_dataloaders_and_the_model_keeps_its_layout():
    torch.manual_seed(0)
    backbone, _ = build_backbone("cnn5_small", in_channels=1)
    backbone.train()
    ds = ArrayDataset(_images((70, 28, 28)), np.arange(70) % 10, eval_transform(28, 1))
    feats, labels = extract_features(backbone, ds, batch_size=32, progress=False)
    # the reference: the per-item DataLoader and the model as it is (contiguous)
    backbone.eval()
    with torch.no_grad():
        ref = torch.cat([backbone(x) for x, _ in DataLoader(ds, batch_size=32)]).numpy()
    np.testing.assert_allclose(feats, ref, rtol=1e-5, atol=1e-6)
    assert np.array_equal(labels, np.arange(70) % 10)
    # the backbone itself was neither converted nor left in eval mode by the extraction
    backbone.train()
    extract_features(backbone, ds, batch_size=32, progress=False)
    assert backbone.training
    assert all(p.is_contiguous() for p in backbone.parameters())


def test_channels_last_copy_only_for_convolutions_on_a_cpu():
    conv, _ = build_backbone("cnn5_small", in_channels=1)
    copy = cpu_channels_last(conv, torch.device("cpu"))
    assert copy is not conv
    assert copy[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert conv[0].weight.is_contiguous()
    mlp = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 2))
    assert cpu_channels_last(mlp, torch.device("cpu")) is mlp
    assert cpu_channels_last(conv, torch.device("meta")) is conv
