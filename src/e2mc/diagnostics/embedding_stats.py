"""Numbers that say whether an embedding is spread out, decorrelated and full rank (the table of
what each statistic sees and means: docs/diagnostics.md)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal

import torch

from e2mc.criterion import compact_transform, m_spacings_entropy

#: How raw values become marginal values in ``[0, 1]``: the two E2MC compact transforms
#: (projector embeddings, in the method's space), ``"standardized"`` (per-column z-score, then
#: the normal CDF; for backbone features, whose scale is arbitrary: the entropy then equals minus
#: the negentropy of each standardised feature, 0 exactly for Gaussian features) and ``"unit"``
#: (values already in ``[0, 1]``, used as they are).
MarginalSpace = Literal["hypercube", "hypersphere", "standardized", "unit"]
MARGINAL_SPACES: tuple[str, ...] = ("hypercube", "hypersphere", "standardized", "unit")

#: A marginal value is *saturated* when it lies within this distance of 0 or 1 (for the sigmoid:
#: ``|z| > 6.9``; for the normal CDF: ``|z| > 3.09``). Saturated values carry no gradient through
#: the compact transform and make ties that the m-spacings estimator punishes.
SATURATION_TOL = 1e-3


@dataclass(frozen=True)
class EmbeddingStatistics:
    """The statistics of one ``[n, d]`` matrix; plain numbers, JSON-serialisable via
    :meth:`to_dict`."""

    num_samples: int
    dim: int
    space: str
    entropy_mean: float
    entropy_std: float
    entropy_min: float
    abs_corr_mean: float
    abs_corr_p99: float
    constant_dims: int
    effective_rank: float
    uniformity: float
    saturated_fraction: float
    knn_k: int
    nn_overlap: float
    nn1_median: float
    nnk_median: float

    def to_dict(self) -> dict[str, int | float | str]:
        return asdict(self)


def _check_matrix(x: torch.Tensor, name: str = "x", min_rows: int = 2) -> torch.Tensor:
    x = torch.as_tensor(x)
    if x.dim() != 2:
        raise ValueError(f"{name} must be a 2-D [n, d] matrix, got shape {tuple(x.shape)}")
    if x.shape[0] < min_rows or x.shape[1] < 1:
        raise ValueError(f"{name} needs at least {min_rows} rows and 1 column, got "
                         f"{tuple(x.shape)}")
    if not torch.isfinite(x).all():
        raise ValueError(f"{name} contains NaN or infinite values")
    return x


def marginal_values(x: torch.Tensor, space: str) -> torch.Tensor:
    """Map ``x`` ``[n, d]`` to values in ``[0, 1]`` per :data:`MarginalSpace`."""
    x = _check_matrix(x)
    if space in ("hypercube", "hypersphere"):
        return compact_transform(x, space)
    if space == "standardized":
        x = x.double()
        z = (x - x.mean(0)) / x.std(0).clamp_min(1e-12)
        return 0.5 * (1.0 + torch.erf(z / math.sqrt(2.0)))
    if space == "unit":
        if x.min() < 0 or x.max() > 1:
            raise ValueError("space='unit' needs values in [0, 1], got range "
                             f"[{x.min().item():.4g}, {x.max().item():.4g}]")
        return x
    raise ValueError(f"unknown space {space!r}; expected one of {', '.join(MARGINAL_SPACES)}")


def saturated_fraction(c: torch.Tensor, tol: float = SATURATION_TOL) -> float:
    """Fraction of marginal values within ``tol`` of 0 or 1."""
    c = _check_matrix(c, "c", min_rows=1)
    return ((c <= tol) | (c >= 1.0 - tol)).double().mean().item()


def constant_columns(x: torch.Tensor) -> torch.Tensor:
    """Boolean mask ``[d]`` of the columns of ``x`` that are constant (dead dimensions)."""
    x = _check_matrix(x, min_rows=1)
    spread = x.max(0).values - x.min(0).values
    return spread <= 1e-12 * max(1.0, x.abs().max().item())


def abs_correlations(x: torch.Tensor) -> torch.Tensor:
    """Off-diagonal ``|corr|`` of the columns of ``x`` (flat, ``d(d-1)`` values); constant
    columns have correlation 0 by convention."""
    x = _check_matrix(x).double()
    xc = x - x.mean(0)
    norm = xc.norm(dim=0)
    xn = xc / torch.where(constant_columns(x), torch.ones_like(norm), norm)
    corr = (xn.T @ xn).abs()
    return corr[~torch.eye(x.shape[1], dtype=torch.bool)]


def effective_rank(x: torch.Tensor) -> float:
    """``exp(-sum_k p_k log p_k)`` with ``p_k = s_k / sum(s)``, ``s`` the singular values of the
    column-centred ``x`` (Roy & Vetterli 2007). Between 1 (rank one) and ``min(n, d)``; returns
    0 for a constant matrix."""
    x = _check_matrix(x).double()
    xc = x - x.mean(0)
    gram = xc @ xc.T if xc.shape[0] <= xc.shape[1] else xc.T @ xc  # the smaller Gram matrix
    s = torch.linalg.eigvalsh(gram).clamp_min(0).sqrt()
    total = s.sum()
    if total <= 0:
        return 0.0
    p = s / total
    p = p[p > 0]
    return math.exp(-(p * p.log()).sum().item())


def auh_uniformity(x: torch.Tensor, t: float = 2.0, chunk_size: int = 1024) -> float:
    """``log mean_{p<q} exp(-t ||e_p - e_q||^2)`` on ``e = x / ||x||`` (rows), computed in
    chunks with a running log-sum-exp so that memory stays ``O(chunk_size * n)``."""
    x = _check_matrix(x).double()
    e = torch.nn.functional.normalize(x, dim=1)
    n = e.shape[0]
    idx = torch.arange(n)
    parts = []
    for start in range(0, n - 1, chunk_size):
        rows = e[start:start + chunk_size]
        sq = (2.0 - 2.0 * rows @ e.T).clamp_min(0)
        upper = idx[None, :] > idx[start:start + rows.shape[0], None]  # pairs p < q only
        parts.append(torch.logsumexp((-t * sq)[upper], dim=0))
    log_pairs = math.log(n * (n - 1) / 2)
    return (torch.logsumexp(torch.stack(parts), dim=0) - log_pairs).item()


def nearest_neighbors(x: torch.Tensor, k: int = 100, normalize: bool = True,
                      chunk_size: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact distances ``[n, k]`` (ascending) of every row to its ``k`` nearest other rows, and
    their row indices ``[n, k]``.

    Rows are L2-normalised first when ``normalize`` (the cosine geometry of kNN evaluation and
    of the uniformity). Computed in float64 (the matrix-product path of :func:`torch.cdist` loses
    ``sqrt(float eps)`` of absolute precision) in chunks of queries; a point is never its own
    neighbour, but exact duplicates of it are (distance 0).
    """
    x = _check_matrix(x).double()
    n = x.shape[0]
    if not 1 <= k <= n - 1:
        raise ValueError(f"k must be in [1, n-1] = [1, {n - 1}] for n={n} points, got {k}")
    if normalize:
        x = torch.nn.functional.normalize(x, dim=1)
    distances, indices = [], []
    for start in range(0, n, chunk_size):
        q = x[start:start + chunk_size]
        dist = torch.cdist(q, x)
        rows = torch.arange(q.shape[0])
        dist[rows, rows + start] = float("inf")
        near = torch.topk(dist, k, dim=1, largest=False, sorted=True)
        distances.append(near.values)
        indices.append(near.indices)
    return torch.cat(distances), torch.cat(indices)


def nearest_neighbor_distances(x: torch.Tensor, k: int = 100, normalize: bool = True,
                               chunk_size: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """Distances of every row to its 1st and ``k``-th nearest other row (``[n]`` each), of
    :func:`nearest_neighbors`."""
    distances, _ = nearest_neighbors(x, k, normalize, chunk_size)
    return distances[:, 0], distances[:, k - 1]


def nn_overlap(first: torch.Tensor, kth: torch.Tensor, atol: float = 1e-6) -> float:
    """Fraction of points whose k-th-NN distance is ``<=`` the median 1st-NN distance (+ ``atol``,
    which absorbs float rounding when points coincide; the default suits distances between unit
    vectors, at most 2): about 0 when the two distance histograms are apart, high when
    neighbourhoods collapse (the paper's Fig. 3)."""
    if first.shape != kth.shape or first.dim() != 1 or first.numel() == 0:
        raise ValueError(f"expected two equal non-empty 1-D tensors, got {tuple(first.shape)} "
                         f"and {tuple(kth.shape)}")
    return (kth.double() <= first.double().median() + atol).double().mean().item()


def embedding_statistics(x: torch.Tensor, space: str = "standardized", *, k: int = 100,
                         m: int | None = None, eps: float = 1e-7, uniformity_t: float = 2.0,
                         max_corr_dims: int = 2048, seed: int = 0,
                         nn_distances: tuple[torch.Tensor, torch.Tensor] | None = None
                         ) -> EmbeddingStatistics:
    """All statistics of ``x`` ``[n, d]`` (their table: docs/diagnostics.md).

    ``space``: how values become marginals in ``[0, 1]`` (:data:`MarginalSpace`); use the method's
    ``compact_space`` for projector embeddings and ``"standardized"`` for backbone features.
    ``m``/``eps``: m-spacings parameters (default ``round(sqrt(n))``, ``1e-7``).
    ``max_corr_dims``: the correlations use a seeded random subset of this many columns when
    ``d`` is larger (``d = 8192`` would mean 67M pairs). ``nn_distances``: precomputed output of
    :func:`nearest_neighbor_distances` (with the same ``k``) to avoid recomputing it.
    """
    x = _check_matrix(x).detach().cpu()
    n, d = x.shape
    if max_corr_dims < 2:
        raise ValueError(f"max_corr_dims must be >= 2, got {max_corr_dims}")
    c = marginal_values(x, space).double()
    h = m_spacings_entropy(c, m=m, eps=eps).double()
    cols = torch.arange(d)
    if d > max_corr_dims:
        gen = torch.Generator().manual_seed(seed)
        cols = torch.randperm(d, generator=gen)[:max_corr_dims].sort().values
    corr_mean = corr_p99 = 0.0
    if cols.numel() >= 2:
        corr = abs_correlations(c[:, cols])
        corr_mean, corr_p99 = corr.mean().item(), torch.quantile(corr, 0.99).item()
    first, kth = nn_distances if nn_distances is not None else nearest_neighbor_distances(x, k)
    if first.numel() != n:
        raise ValueError(f"nn_distances has {first.numel()} points, x has {n}")
    return EmbeddingStatistics(
        num_samples=n,
        dim=d,
        space=space,
        entropy_mean=h.mean().item(),
        entropy_std=h.std().item() if d > 1 else 0.0,
        entropy_min=h.min().item(),
        abs_corr_mean=corr_mean,
        abs_corr_p99=corr_p99,
        constant_dims=int(constant_columns(c).sum().item()),
        effective_rank=effective_rank(x),
        uniformity=auh_uniformity(x, t=uniformity_t),
        saturated_fraction=saturated_fraction(c),
        knn_k=k,
        nn_overlap=nn_overlap(first, kth),
        nn1_median=first.double().median().item(),
        nnk_median=kth.double().median().item(),
    )
