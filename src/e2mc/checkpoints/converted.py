"""Weights converted from SimCLR's TensorFlow releases, which users hold as PyTorch files.

- SimCLR v1 (google-research/simclr, converted by tonylins/simclr-converter):
  ``{"state_dict": ...}`` with torchvision's ResNet names and a supervised ``fc``: read as any
  torchvision ResNet backbone (the ``fc`` dropped); only the 1x width is a torchvision
  architecture.
- SimCLR v2 (converted by Separius/SimCLRv2-Pytorch, ``r50_1x_sk0.pth``):
  ``{"resnet": ..., "head": ...}`` with the converter's own module names. Its ResNets without
  selective kernels (``sk0``) at width 1x are torchvision's ResNet-50/101/152 (v1.5: the stride
  in the 3x3 convolution, the projection shortcut a strided 1x1 convolution and a BatchNorm, the
  same stem): :func:`simclr_v2_backbone` renames them to torchvision's names. Its 3-layer
  contrastive head (affine BatchNorms) is not e2mc's SimCLR head: the heads start new
  (``--new-heads``). ``sk1`` models (selective kernels) have no e2mc backbone and are refused.

Both releases were trained on images in [0, 1] *without* a mean/std normalisation, where e2mc
normalises with ImageNet's mean and std: their features under e2mc's transforms differ from those
of their own linear evaluation (docs/checkpoints.md).
"""

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
    """The ResNet of a SimCLR v2 file under torchvision's names (its ``fc``, the supervised
    head, kept for the caller to drop as any classifier). A selective-kernel model, or a key
    the renaming does not know, is a ``ValueError`` naming it."""
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
