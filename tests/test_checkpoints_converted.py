"""SimCLR's TensorFlow releases as users hold them in PyTorch: v1 through tonylins/
simclr-converter (torchvision's names in ``state_dict``, a supervised ``fc``) and v2 through
Separius/SimCLRv2-Pytorch (``{"resnet", "head"}`` with the converter's module names), built here
from a torchvision ResNet-50 with distinct tensors and read back tensor by tensor."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import torch
import torchvision

from e2mc.checkpoints import load_backbone
from e2mc.cli import main

#: torchvision's bottleneck names -> the converter's ``net.K`` (BatchNorms inside a
#: BatchNormRelu: ``net.K.0``).
CONVERTER = {"conv1": "0", "bn1": "1.0", "conv2": "2", "bn2": "3.0", "conv3": "4", "bn3": "5.0"}


def _converter_name(key: str) -> str:
    """Separius/SimCLRv2-Pytorch's name of a torchvision ResNet key."""
    if key == "conv1.weight":
        return "net.0.0.weight"
    if key.startswith("bn1."):
        return "net.0.1.0." + key[4:]
    if key.startswith("fc."):
        return key
    layer, block, part, rest = re.match(r"layer(\d)\.(\d+)\.(\w+)\.(.+)$", key).groups()
    if part == "downsample":
        index, leaf = rest.split(".", 1)
        inner = "shortcut." if index == "0" else "bn.0."
        return f"net.{layer}.blocks.{block}.projection.{inner}{leaf}"
    return f"net.{layer}.blocks.{block}.net.{CONVERTER[part]}.{rest}"


@pytest.fixture(scope="module")
def resnet50() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torchvision.models.resnet50()
    with torch.no_grad():
        for i, t in enumerate(model.state_dict().values()):
            if t.is_floating_point():
                t.copy_(torch.rand_like(t) + i)  # distinct, positive running variances
    return model.eval()


def test_simclr_v2_sk0_reads_as_torchvision_resnet50(resnet50: torch.nn.Module,
                                                    tmp_path: Path) -> None:
    sd = resnet50.state_dict()
    head = {f"layers.{i}.weight": torch.randn(8, 8) for i in (0, 3, 6)}
    path = tmp_path / "r50_1x_sk0.pth"
    torch.save({"resnet": {_converter_name(k): v for k, v in sd.items()}, "head": head}, path)
    backbone, dim, info = load_backbone(path)
    assert (info["arch"], dim, info["dropped_keys"]) == ("resnet50", 2048, ["fc.bias", "fc.weight"])
    got = backbone.state_dict()
    assert sorted(got) == sorted(k for k in sd if not k.startswith("fc."))
    for key, value in got.items():
        assert torch.equal(value, sd[key]), key
    pooled = copy.deepcopy(resnet50)
    pooled.fc = torch.nn.Identity()  # the torchvision model's pooled features
    x = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(backbone.eval()(x), pooled(x))


def test_simclr_v2_with_selective_kernels_or_another_width_is_one_error_line(
        resnet50: torch.nn.Module, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sd = {_converter_name(k): v for k, v in resnet50.state_dict().items()}
    sk = dict(sd, **{"net.1.blocks.0.net.2.main_conv.0.weight": torch.zeros(1)})
    torch.save({"resnet": sk, "head": {}}, tmp_path / "r50_1x_sk1.pth")
    assert main(["eval", str(tmp_path / "r50_1x_sk1.pth"), "--data", "builtin",
                 "--out", str(tmp_path / "e")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "selective kernels (sk1)" in err
    odd = dict(sd, **{"net.5.extra.weight": torch.zeros(1)})
    torch.save({"resnet": odd, "head": {}}, tmp_path / "odd.pth")
    with pytest.raises(ValueError, match="no torchvision ResNet name for 'net.5.extra.weight'"):
        load_backbone(tmp_path / "odd.pth")


def test_simclr_v1_converted_reads_as_torchvision_resnet50(resnet50: torch.nn.Module,
                                                          tmp_path: Path) -> None:
    """tonylins/simclr-converter saves ``{"state_dict": ...}`` of a torchvision-named ResNet
    with the supervised ``fc``."""
    torch.save({"state_dict": resnet50.state_dict()}, tmp_path / "resnet50-1x.pth")
    backbone, dim, info = load_backbone(tmp_path / "resnet50-1x.pth")
    assert (info["arch"], dim, info["dropped_keys"]) == ("resnet50", 2048, ["fc.bias", "fc.weight"])
    assert all(torch.equal(v, resnet50.state_dict()[k]) for k, v in backbone.state_dict().items())
