"""Backbones: torchvision models as pooled-feature extractors."""

import pytest
import torch
import torchvision.models as tvm
from torch import nn

from e2mc.models import build_backbone


@pytest.mark.parametrize("name,dim", [("resnet18", 512), ("resnet50", 2048)])
def test_resnet_features_equal_torchvision_penultimate(name, dim):
    torch.manual_seed(0)
    model, feature_dim = build_backbone(name)
    assert feature_dim == dim
    ref = getattr(tvm, name)(weights=None)
    ref.fc = nn.Identity()
    ref.load_state_dict(model.state_dict(), strict=True)  # torchvision names, no classifier
    x = torch.randn(2, 3, 32, 32)
    model.eval(), ref.eval()
    torch.testing.assert_close(model(x), ref(x))
    assert model(x).shape == (2, dim)


@pytest.mark.parametrize("in_channels", [1, 3])
def test_small_images_stem(in_channels):
    model, dim = build_backbone("resnet18", small_images=True, in_channels=in_channels)
    assert model.conv1.kernel_size == (3, 3) and model.conv1.stride == (1, 1)
    assert model.conv1.in_channels == in_channels
    assert isinstance(model.maxpool, nn.Identity)
    # 16 px keeps a 2x2 map before pooling (the standard stem would reach 1x1 much earlier)
    feats = model.eval()(torch.randn(2, in_channels, 16, 16))
    assert feats.shape == (2, dim)


def test_grayscale_resnet_keeps_standard_stem():
    model, _ = build_backbone("resnet18", in_channels=1)
    assert model.conv1.in_channels == 1 and model.conv1.kernel_size == (7, 7)
    assert model.conv1.stride == (2, 2) and isinstance(model.maxpool, nn.MaxPool2d)


@pytest.mark.parametrize("name,dim", [("mobilenet_v3_small", 576), ("regnet_y_400mf", 440)])
@pytest.mark.parametrize("in_channels", [1, 3])
def test_other_backbones_in_channels(name, dim, in_channels):
    torch.manual_seed(0)
    model, feature_dim = build_backbone(name, in_channels=in_channels)
    assert feature_dim == dim
    first = next(m for m in model.modules() if isinstance(m, nn.Conv2d))
    assert first.in_channels == in_channels
    ref = getattr(tvm, name)(weights=None)
    assert first.out_channels == next(
        m for m in ref.modules() if isinstance(m, nn.Conv2d)).out_channels
    out = model.eval()(torch.randn(2, in_channels, 32, 32))
    assert out.shape == (2, dim) and torch.isfinite(out).all()


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown backbone"):
        build_backbone("resnet7")
    with pytest.raises(ValueError, match="only supported for ResNets"):
        build_backbone("mobilenet_v3_small", small_images=True)
    with pytest.raises(ValueError, match="in_channels"):
        build_backbone("resnet18", in_channels=0)
