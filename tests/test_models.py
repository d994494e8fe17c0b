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


@pytest.mark.parametrize("name,dim", [("cnn5", 256), ("cnn5_small", 128)])
def test_small_cnns_pool_features_for_small_images(name: str, dim: int) -> None:
    model, feature_dim = build_backbone(name, in_channels=1)
    assert feature_dim == dim
    model.eval()
    out = model(torch.randn(3, 1, 28, 28))
    assert out.shape == (3, dim)
    assert model(torch.randn(2, 1, 32, 32)).shape == (2, dim)  # pooled: any input size
    assert sum(isinstance(m, nn.Conv2d) for m in model.modules()) == 5
    with pytest.raises(ValueError, match="in_channels"):
        build_backbone(name, in_channels=0)


def test_small_cnn_backbone_exports_and_reloads(tmp_path) -> None:
    from e2mc.checkpoints import export_backbone, load_backbone
    from e2mc.methods import VICReg

    method = VICReg(backbone="cnn5_small", in_channels=1, projector="64-64")
    export_backbone(method, tmp_path / "backbone.pt")
    backbone, dim, info = load_backbone(tmp_path / "backbone.pt")
    assert dim == 128 and info["arch"] == "cnn5_small"
    x = torch.randn(2, 1, 28, 28)
    method.backbone.eval()
    backbone.eval()
    torch.testing.assert_close(backbone(x), method.backbone(x))


@pytest.mark.parametrize("name,small,channels,size,want", [
    ("resnet18", False, 3, 28, (1, 1)),   # 32x reduction: one pixel
    ("resnet18", True, 1, 28, (4, 4)),    # the small-image stem: 8x
    ("resnet18", False, 3, 64, (2, 2)),
    ("cnn5_small", False, 1, 28, (7, 7)),
    ("vit_tiny_p4_28", False, 1, 28, (7, 7)),  # a ViT: its patch grid
])
def test_the_last_feature_map_and_the_one_pixel_note(name, small, channels, size, want) -> None:
    from e2mc.models.input_size import last_feature_map, one_pixel_note

    module, _ = build_backbone(name, small, channels)
    assert last_feature_map(module, size, channels) == want
    note = one_pixel_note(module, size, channels, name)
    assert (note is not None) == (want == (1, 1))
    if note is not None:
        assert note.startswith(f"note: at {size} px the last feature map of {name} is 1 x 1 "
                               "pixel: its last stages see no spatial structure")


def test_a_fresh_run_says_its_one_pixel_feature_map_once(tmp_path, capsys) -> None:
    import numpy as np

    from e2mc.cli import main

    data = tmp_path / "d.npz"
    rng = np.random.default_rng(0)
    np.savez(data, x_train=rng.integers(0, 256, (16, 16, 16), dtype=np.uint8),
             y_train=np.arange(16) % 4)
    args = ["pretrain", "--config", "fmnist-vicreg-pretrain", "--data", str(data), "--out",
            str(tmp_path / "r"), *[a for s in ("model.backbone=resnet18", "model.in_channels=1",
                                              "data.image_size=16", "training.batch_size=8",
                                              "training.progress=false", "data.num_workers=0",
                                              "method.params={projector: 16-16}")
                                   for a in ("--set", s)]]
    assert main([*args, "--set", "training.max_steps=1"]) == 0
    err = capsys.readouterr().err
    assert err.count("note: at 16 px the last feature map of resnet18 is 1 x 1 pixel") == 1
    assert main([*args, "--set", "training.max_steps=2"]) == 0  # resumed: said at its start
    assert "last feature map" not in capsys.readouterr().err
