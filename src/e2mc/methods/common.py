"""Helpers shared by the method classes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from e2mc.models import build_backbone


def resolve_backbone(backbone: str | nn.Module, small_images: bool, in_channels: int,
                     feature_dim: int | None = None) -> tuple[nn.Module, int, dict[str, Any]]:
    """Return ``(module, feature_dim, hparams)`` for a backbone name or a user module.

    A name is built with :func:`e2mc.models.build_backbone`; a module needs ``feature_dim``
    (its pooled output size). ``hparams`` are the JSON-serialisable entries that rebuild it
    (``backbone`` is ``None`` for a user module, which cannot be rebuilt from a name).
    """
    if isinstance(backbone, str):
        module, dim = build_backbone(backbone, small_images=small_images, in_channels=in_channels)
        if feature_dim is not None and feature_dim != dim:
            raise ValueError(f"feature_dim={feature_dim} contradicts {backbone!r} ({dim})")
        return module, dim, {"backbone": backbone, "small_images": small_images,
                             "in_channels": in_channels}
    if isinstance(backbone, nn.Module):
        if feature_dim is None:
            raise ValueError("feature_dim (the backbone's output size) is required when "
                             "the backbone is an nn.Module")
        return backbone, int(feature_dim), {"backbone": None,
                                            "backbone_class": type(backbone).__name__,
                                            "feature_dim": int(feature_dim)}
    raise ValueError(f"backbone must be a name or an nn.Module, got {type(backbone).__name__}")


def check_views(views: Any, at_least: int, method: str) -> None:
    if not isinstance(views, (list, tuple)) or len(views) < at_least:
        length = len(views) if hasattr(views, "__len__") else "?"
        raise ValueError(f"{method} needs a list of at least {at_least} views, got "
                         f"{type(views).__name__} of length {length}")


def multicrop_features(backbone: nn.Module, views: Sequence[torch.Tensor]) -> torch.Tensor:
    """Backbone features of all views, one backbone call per run of equal-resolution crops
    (the official SwAV model's and DINO's ``MultiCropWrapper``)."""
    feats, start = [], 0
    while start < len(views):
        end = start + 1
        while end < len(views) and views[end].shape[-2:] == views[start].shape[-2:]:
            end += 1
        feats.append(backbone(torch.cat(list(views[start:end]))))
        start = end
    return torch.cat(feats)
