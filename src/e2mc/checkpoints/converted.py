"""SimCLR's TensorFlow releases as converted to PyTorch (docs/checkpoints.md): v1
(tonylins/simclr-converter) is a torchvision ResNet read as any backbone; v2
(Separius/SimCLRv2-Pytorch, ``{"resnet", "head"}``) is renamed here to torchvision's names (``sk0``
1x only; its heads are not e2mc's, so they start new)."""

from __future__ import annotations

import re
from typing import Any

import torch

#: The converter's bottleneck layers (``net.K``) and torchvision's names for them.
_BOTTLENECK = {"0": "conv1", "1": "bn1", "2": "conv2", "3": "bn2", "4": "conv3", "5": "bn3"}
_RULES = [
    (re.compile(r"net\.0\.0\.weight$"), lambda m: "conv1.weight"),
    (re.compile(r"net\.0\.1\.0\.(\w+)$"), lambda m: f"bn1.{m[1]}"),
    (re.compile(r"net\.([1-4])\.blocks\.(\d+)\.net\.([024])\.weight$"),
     lambda m: f"layer{m[1]}.{m[2]}.{_BOTTLENECK[m[3]]}.weight"),
    (re.compile(r"net\.([1-4])\.blocks\.(\d+)\.net\.([135])\.0\.(\w+)$"),
     lambda m: f"layer{m[1]}.{m[2]}.{_BOTTLENECK[m[3]]}.{m[4]}"),
    (re.compile(r"net\.([1-4])\.blocks\.(\d+)\.projection\.shortcut\.weight$"),
     lambda m: f"layer{m[1]}.{m[2]}.downsample.0.weight"),
    (re.compile(r"net\.([1-4])\.blocks\.(\d+)\.projection\.bn\.0\.(\w+)$"),
     lambda m: f"layer{m[1]}.{m[2]}.downsample.1.{m[3]}"),
    (re.compile(r"fc\.(weight|bias)$"), lambda m: f"fc.{m[1]}"),
]


def is_simclr_v2(obj: Any) -> bool:
    """Whether ``obj`` is a file of Separius/SimCLRv2-Pytorch (``{"resnet", "head"}``)."""
    return (isinstance(obj, dict) and set(obj) == {"resnet", "head"}
            and isinstance(obj["resnet"], dict)
            and any(isinstance(k, str) and k.startswith("net.0.") for k in obj["resnet"]))


def simclr_v2_backbone(obj: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The ResNet of a SimCLR v2 file under torchvision's names (``fc`` kept, for the caller
    to drop); a selective-kernel model or an unknown key is a ``ValueError`` naming it."""
    out: dict[str, torch.Tensor] = {}
    for key, value in obj["resnet"].items():
        if ".mixing_conv." in key or ".main_conv." in key:
            raise ValueError("this SimCLR v2 file holds a ResNet with selective kernels (sk1), "
                             "which no e2mc backbone has; the sk0 models convert")
        for pattern, name in _RULES:
            if (m := pattern.match(key)) is not None:
                out[name(m)] = value
                break
        else:
            raise ValueError(f"SimCLR v2 file: no torchvision ResNet name for {key!r} (a "
                             "width other than 1x, or another converter's file)")
    return out
