"""Projection heads with exactly the official layer layouts (so official weights load strictly)."""

from __future__ import annotations

from torch import nn


def parse_mlp_spec(spec: str) -> list[int]:
    """``"8192-8192-8192"`` -> ``[8192, 8192, 8192]`` with a clear error for bad input."""
    try:
        sizes = [int(s) for s in str(spec).split("-")]
    except ValueError:
        raise ValueError(f"projector spec must look like '8192-8192-8192', got {spec!r}") from None
    if not sizes or any(s < 1 for s in sizes):
        raise ValueError(f"projector sizes must be positive integers, got {spec!r}")
    return sizes


def vicreg_projector(in_dim: int, spec: str) -> nn.Sequential:
    """VICReg's ``Projector``: (Linear+bias, BatchNorm1d, ReLU) per hidden layer, then a Linear
    without bias. ``"8192-8192-8192"`` on 2048-d features gives indices 0,1,3,4,6."""
    sizes = [in_dim, *parse_mlp_spec(spec)]
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 2):
        layers += [nn.Linear(sizes[i], sizes[i + 1]), nn.BatchNorm1d(sizes[i + 1]),
                   nn.ReLU(inplace=True)]
    layers.append(nn.Linear(sizes[-2], sizes[-1], bias=False))
    return nn.Sequential(*layers)


def swav_projection_head(in_dim: int, hidden_dim: int, output_dim: int) -> nn.Sequential:
    """SwAV's ``projection_head``: Linear, BatchNorm1d, ReLU, Linear (indices 0,1,3)."""
    return nn.Sequential(nn.Linear(in_dim, hidden_dim), nn.BatchNorm1d(hidden_dim),
                         nn.ReLU(inplace=True), nn.Linear(hidden_dim, output_dim))


def simsiam_projector(in_dim: int, dim: int) -> nn.Sequential:
    """SimSiam's projector (``encoder.fc``): two (Linear no bias, BN, ReLU) layers of width
    ``in_dim``, a Linear ``in_dim -> dim`` whose bias is frozen (the official "hack": it is
    followed by BN), and ``BatchNorm1d(dim, affine=False)``; indices 0,1,3,4,6,7."""
    head = nn.Sequential(
        nn.Linear(in_dim, in_dim, bias=False), nn.BatchNorm1d(in_dim), nn.ReLU(inplace=True),
        nn.Linear(in_dim, in_dim, bias=False), nn.BatchNorm1d(in_dim), nn.ReLU(inplace=True),
        nn.Linear(in_dim, dim), nn.BatchNorm1d(dim, affine=False))
    head[6].bias.requires_grad_(False)
    return head


def simsiam_predictor(dim: int, pred_dim: int) -> nn.Sequential:
    """SimSiam's predictor: Linear no bias, BN, ReLU, Linear (indices 0,1,3)."""
    return nn.Sequential(nn.Linear(dim, pred_dim, bias=False), nn.BatchNorm1d(pred_dim),
                         nn.ReLU(inplace=True), nn.Linear(pred_dim, dim))
