"""Reference formulas written from the paper and the official code, for tests only.

Straightforward on purpose: direct d x d covariance, plain torch.sort under autograd.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def reference_entropy(x: torch.Tensor, m: int, eps: float = 1e-7) -> torch.Tensor:
    """Paper Algorithm 1 (m_spacings_estimator) per column, plain torch.sort under autograd."""
    n = x.shape[0]
    s, _ = torch.sort(x, dim=0)
    spacings = (s[m:] - s[: n - m]) * (n + 1) / m
    return torch.log(spacings + eps).sum(dim=0) / (n - m)


def reference_covariance(x: torch.Tensor, n: int | None = None) -> torch.Tensor:
    """Paper appendix form: (1/d) sum_{j != k} C_jk^2 with the direct d x d covariance."""
    rows, d = x.shape
    n = rows if n is None else n
    xc = x - x.mean(dim=0)
    cov = xc.T @ xc / (n - 1)
    off = cov - torch.diag(torch.diag(cov))
    return off.pow(2).sum() / d


def reference_e2mc(za, zb, space, beta, gamma, reduction="mean", n=None):
    """Paper Algorithm 1 with the authors' view reduction (mean) or the paper's (sum)."""
    psi = torch.sigmoid if space == "hypercube" else torch.special.ndtr
    ents, covs = [], []
    for z in (za, zb):
        zc = psi(z)
        ents.append(reference_entropy(zc, round(z.shape[0] ** 0.5)).mean())
        covs.append(reference_covariance(zc, n))
    ent = (ents[0] + ents[1]) / (2 if reduction == "mean" else 1)
    return -beta * ent + gamma * (covs[0] + covs[1])


def reference_vicreg_std_cov(x, y):
    """VICReg official: std_loss averaged over views, cov_loss summed (divided by n-1 and d)."""
    n, d = x.shape
    x = x - x.mean(dim=0)
    y = y - y.mean(dim=0)
    std_x = torch.sqrt(x.var(dim=0) + 0.0001)
    std_y = torch.sqrt(y.var(dim=0) + 0.0001)
    std_loss = torch.mean(F.relu(1 - std_x)) / 2 + torch.mean(F.relu(1 - std_y)) / 2
    cov_x = (x.T @ x) / (n - 1)
    cov_y = (y.T @ y) / (n - 1)
    off = ~torch.eye(d, dtype=torch.bool)
    cov_loss = cov_x[off].pow(2).sum() / d + cov_y[off].pow(2).sum() / d
    return std_loss, cov_loss


def reference_uniformity(x, t=2.0):
    """Wang & Isola (2020): log of the mean Gaussian potential over distinct pairs."""
    x = F.normalize(x, dim=1)
    return torch.pdist(x, p=2).pow(2).mul(-t).exp().mean().log()


def reference_nuclear_norm_of_centroids(views):
    c = torch.stack([F.normalize(z, dim=1) for z in views]).mean(dim=0)
    return torch.linalg.matrix_norm(c, ord="nuc")
