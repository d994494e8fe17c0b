"""Projection heads with exactly the official layer layouts (so official weights load strictly)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from e2mc.ranges import Widths, parse_widths


def parse_mlp_spec(spec: str) -> list[int]:
    """``"8192-8192-8192"`` -> ``[8192, 8192, 8192]`` with a clear error for bad input."""
    sizes = parse_widths(spec)
    if sizes is None:
        raise ValueError(f"projector must be {Widths().text}, got {spec!r}")
    return sizes


def mlp(sizes: list[int], hidden_bias: bool = True, last_bias: bool = False,
        last_bn: bool = False) -> nn.Sequential:
    """(Linear, BatchNorm1d, ReLU) per hidden width of ``sizes``, then the last Linear and, with
    ``last_bn``, ``BatchNorm1d(affine=False)``: ``[2048, 8192, 8192, 8192]`` gives 0,1,3,4,6."""
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-2], sizes[1:-1], strict=True):
        layers += [nn.Linear(a, b, bias=hidden_bias), nn.BatchNorm1d(b), nn.ReLU(inplace=True)]
    layers.append(nn.Linear(sizes[-2], sizes[-1], bias=last_bias))
    if last_bn:
        layers.append(nn.BatchNorm1d(sizes[-1], affine=False))
    return nn.Sequential(*layers)


def vicreg_projector(in_dim: int, spec: str) -> nn.Sequential:
    """VICReg's ``Projector``: hidden Linear layers with bias, the last without."""
    return mlp([in_dim, *parse_mlp_spec(spec)])


def simsiam_predictor(dim: int, pred_dim: int) -> nn.Sequential:
    """SimSiam's predictor: Linear no bias, BN, ReLU, Linear (indices 0,1,3)."""
    return mlp([dim, pred_dim, dim], hidden_bias=False, last_bias=True)


def moco_mlp(num_layers: int, in_dim: int, mlp_dim: int, out_dim: int,
             last_bn: bool = True) -> nn.Sequential:
    """MoCo v3's ``_build_mlp`` (also SimCLR's head here, 2 layers): every Linear without bias,
    ``BatchNorm1d(out_dim, affine=False)`` last when ``last_bn``."""
    return mlp([in_dim, *[mlp_dim] * (num_layers - 1), out_dim], False, last_bn=last_bn)


class WeightNormLinear(nn.Module):
    """A Linear layer without bias under weight normalisation, with the parameter names of
    ``torch.nn.utils.weight_norm`` (``weight_g`` ``[out, 1]``, ``weight_v`` ``[out, in]``), so the
    official DINO heads load strictly: ``weight = weight_g * weight_v / ||weight_v||`` per row."""

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.weight_v = nn.Parameter(torch.empty(out_dim, in_dim))
        nn.init.trunc_normal_(self.weight_v, std=0.02)
        self.weight_g = nn.Parameter(torch.ones(out_dim, 1))

    @property
    def weight(self) -> torch.Tensor:
        return self.weight_g * self.weight_v / self.weight_v.norm(dim=1, keepdim=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class DINOHead(nn.Module):
    """DINO's ``DINOHead``: an MLP ``mlp`` (``nlayers`` Linear layers, GELU between them, BN
    after the hidden ones with ``use_bn``) to a ``bottleneck_dim`` embedding, L2 normalisation,
    and the weight-normed prototype layer ``last_layer`` (``weight_g`` fixed at 1 with
    ``norm_last_layer``). :meth:`bottleneck` is the embedding before the normalisation."""

    def __init__(self, in_dim: int, out_dim: int = 65536, use_bn: bool = False,
                 norm_last_layer: bool = True, nlayers: int = 3, hidden_dim: int = 2048,
                 bottleneck_dim: int = 256) -> None:
        super().__init__()
        widths = [in_dim, *[hidden_dim] * (max(nlayers, 1) - 1), bottleneck_dim]
        layers: list[nn.Module] = []
        for a, b in zip(widths[:-2], widths[1:-1], strict=True):
            layers += [nn.Linear(a, b), *([nn.BatchNorm1d(b)] if use_bn else []), nn.GELU()]
        layers.append(nn.Linear(widths[-2], widths[-1]))
        self.mlp = nn.Sequential(*layers)
        for m in self.mlp.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.constant_(m.bias, 0)
        self.last_layer = WeightNormLinear(bottleneck_dim, out_dim)
        if norm_last_layer:
            self.last_layer.weight_g.requires_grad_(False)

    def bottleneck(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x)

    def prototypes(self, bottleneck: torch.Tensor) -> torch.Tensor:
        return self.last_layer(F.normalize(bottleneck, dim=-1, p=2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.prototypes(self.bottleneck(x))
