"""The E2MC criterion as pure tensor functions (paper Eqs. 4-8; docs/method.md#the-criterion).

All compute in float32 at least (float64 stays float64) with autocast disabled, because in fp16
the CDF saturates to exactly 1, ties give zero spacings and ``1/eps`` overflows."""

from __future__ import annotations

import math
from typing import Literal

import torch

Space = Literal["hypercube", "hypersphere"]
SPACES: tuple[str, ...] = ("hypercube", "hypersphere")


def as_compute_dtype(x: torch.Tensor) -> torch.Tensor:
    """float64 stays float64; every other dtype becomes float32."""
    if not torch.is_floating_point(x):
        raise ValueError(f"expected a floating-point tensor, got dtype {x.dtype}")
    return x if x.dtype == torch.float64 else x.float()


def _check_matrix(x: torch.Tensor, what: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{what} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"{what} must be 2-D [n samples, d dimensions], got shape "
                         f"{tuple(x.shape)}")
    if x.device.type != "cpu":
        # the check would cost a host-device synchronisation at every call; there a non-finite
        # input gives a non-finite value, which the trainer stops or skips (NonFiniteGuard)
        return
    # One reduction on the common path: a non-finite value makes the sum non-finite (a sum that
    # overflows without one falls through to the exact check below and passes).
    accumulate = torch.float64 if x.dtype == torch.float64 else torch.float32
    if bool(torch.isfinite(x.sum(dtype=accumulate))):
        return
    finite = torch.isfinite(x)
    if not bool(finite.all()):
        bad = ~finite
        columns = torch.nonzero(bad.any(dim=0)).flatten().tolist()
        shown = ", ".join(map(str, columns[:10])) + (", ..." if len(columns) > 10 else "")
        raise ValueError(f"{what} has {int(bad.sum())} non-finite values (NaN or inf) in "
                         f"{len(columns)} columns: {shown}")


def compact_transform(z: torch.Tensor, space: Space) -> torch.Tensor:
    """Map embeddings element-wise into ``[0, 1]`` (paper Sec. 3.2; docs/method.md).

    ``"hypercube"``: sigmoid, for unnormalised embeddings (VICReg). ``"hypersphere"``: the standard
    normal CDF, for methods that L2-normalise (SwAV, SimSiam): uniform CDF-marginals mean N(0, 1)
    marginals, which normalise to a uniform distribution on the sphere.
    """
    if space not in SPACES:
        raise ValueError(f"space must be one of {SPACES}, got {space!r}")
    with torch.autocast(device_type=z.device.type, enabled=False):
        z = as_compute_dtype(z)
        return torch.sigmoid(z) if space == "hypercube" else torch.special.ndtr(z)


def default_m(n: int) -> int:
    """The spacing order used by the paper: ``round(sqrt(n))``."""
    return max(1, round(math.sqrt(n)))


#: Columns are sorted in blocks of about this many elements, which bounds the temporaries (on a
#: CPU, where blocks also stay in cache; a GPU's kernels, whose launches dominate at these
#: sizes, take far larger ones).
_BLOCK_ELEMENTS = {"cpu": 1 << 18, "other": 1 << 24}


def _column_blocks(n: int, d: int, device: torch.device) -> list[slice]:
    width = max(1, _BLOCK_ELEMENTS["cpu" if device.type == "cpu" else "other"] // n)
    return [slice(j, min(j + width, d)) for j in range(0, d, width)]


def _sort_keys(x: torch.Tensor) -> torch.Tensor:
    """Integers in the order of the finite floats ``x`` (in place; applied to its own output it
    gives the floats' bits back).

    A float's bits read as a signed integer are in its order when it is positive and in reverse
    when negative, so the negatives' magnitude bits are flipped. Integer rows sort 1.6x faster
    than float rows on a CPU, whose float comparator also orders NaNs (the inputs are checked
    finite). ``-0.0`` sorts just before ``+0.0``: their spacing is 0 either way.
    """
    bits = x.view(torch.int64 if x.element_size() == 8 else torch.int32)
    magnitude = torch.iinfo(bits.dtype).max
    return bits.bitwise_xor_(bits.bitwise_right_shift(bits.element_size() * 8 - 1)
                             .bitwise_and_(magnitude))


class _SpacingsEntropy(torch.autograd.Function):
    """Per-column m-spacings entropy of ``x`` [n, d] with an analytic, memory-lean backward.

    Forward sorts blocks of columns as rows of ``x^T`` and keeps only the sort indices (int16 when
    they fit) and ``x`` by reference (autograd holds it anyway). Backward: with ``s`` a sorted
    column and ``g_i = (n+1)/m / ((n+1)/m (s_{i+m} - s_i) + eps) / (n - m)``, the gradient with
    respect to ``s_k`` is ``g_{k-m} - g_k`` (a difference of two reciprocal spacings), scattered to
    the original rows with the sort indices.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, m: int, eps: float) -> torch.Tensor:  # type: ignore[override]
        n, d = x.shape
        scale = (n + 1) / m
        index_dtype = torch.int16 if n <= torch.iinfo(torch.int16).max else torch.int32
        order = torch.empty(d, n, dtype=index_dtype, device=x.device)
        entropy = x.new_empty(d)
        for cols in _column_blocks(n, d, x.device):
            if x.device.type == "cpu":  # (a GPU's radix sort takes the floats as they are)
                keys, idx = torch.sort(_sort_keys(x[:, cols].t().contiguous()), dim=1)
                s = _sort_keys(keys).view(x.dtype)  # the keys map back to the sorted values
            else:
                s, idx = torch.sort(x[:, cols].t(), dim=1)
            order[cols] = idx
            spacings = (s[:, m:] - s[:, : n - m]).mul_(scale).add_(eps)
            entropy[cols] = spacings.log_().sum(dim=1).div_(n - m)
        ctx.save_for_backward(x, order)
        ctx.m, ctx.scale, ctx.eps = m, scale, eps
        return entropy

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # type: ignore[override]
        x, order = ctx.saved_tensors
        m, scale, eps = ctx.m, ctx.scale, ctx.eps
        d, n = order.shape
        factor = (grad_out * (scale / (n - m))).unsqueeze(1)
        grad_x = torch.empty_like(x)
        for cols in _column_blocks(n, d, x.device):
            idx = order[cols].long()
            s = x[:, cols].t().contiguous().gather(1, idx)
            g = (s[:, m:] - s[:, : n - m]).mul_(scale).add_(eps).reciprocal_().mul_(factor[cols])
            grad_sorted = torch.zeros_like(s)
            grad_sorted[:, m:] += g
            grad_sorted[:, : n - m] -= g
            grad_x.t()[cols].scatter_(1, idx, grad_sorted)  # straight into the [n, d] layout
        return grad_x, None, None


def m_spacings_entropy(x: torch.Tensor, m: int | None = None, eps: float = 1e-7) -> torch.Tensor:
    """Vasicek's m-spacings entropy estimate of every column of ``x`` [n, d] (paper Eq. 4).

    ``H_j = 1/(n-m) * sum_{i=1}^{n-m} log((n+1)/m * (x_(i+m),j - x_(i),j) + eps)`` with
    ``x_(i),j`` the i-th smallest value of column j and ``m = round(sqrt(n))`` by default.
    Returns a tensor of shape ``[d]`` in float32 (float64 for float64 input), differentiable.
    A CPU tensor with NaN or infinite values raises ``ValueError`` naming the columns; on a GPU
    (no synchronisation for the check) such columns give non-finite entropies.
    """
    _check_matrix(x, "x")
    n = x.shape[0]
    if m is None:
        m = default_m(n)
    if isinstance(m, bool) or not isinstance(m, int):
        raise ValueError(f"m must be an int, got {m!r}")
    if n < 2:
        raise ValueError(f"need at least 2 rows for the m-spacings estimator, got n={n}")
    if not 1 <= m < n:
        raise ValueError(f"m must satisfy 1 <= m < n = {n} rows, got m={m}")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    with torch.autocast(device_type=x.device.type, enabled=False):
        return _SpacingsEntropy.apply(as_compute_dtype(x), m, float(eps))


class _OffDiagonalSquares(torch.autograd.Function):
    """``sum_{j != k} (xc^T xc)_jk^2`` of ``xc = x - mean(x)`` via the smaller Gram matrix.

    ``||xc^T xc||_F = ||xc xc^T||_F`` and the diagonal is ``sum_j (sum_i xc_ij^2)^2``. The
    backward is analytic, ``4 (G xc - xc diag(colsq))`` with one matrix product, and needs no
    centring step because its columns already have zero mean. Only ``x`` (held by autograd for
    the compact transform anyway), the small Gram matrix and the column means are kept.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        n, d = x.shape
        mean = x.mean(dim=0, keepdim=True)
        xc = x - mean
        use_rows = n < d
        gram = xc @ xc.t() if use_rows else xc.t() @ xc
        column_squares = xc.pow_(2).sum(dim=0)
        ctx.save_for_backward(x, mean, gram, column_squares)
        ctx.use_rows = use_rows
        return gram.pow(2).sum() - column_squares.pow(2).sum()

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # type: ignore[override]
        x, mean, gram, column_squares = ctx.saved_tensors
        # G xc = G x - (G 1) mean and xc G = x G - 1 (mean G): the centred copy of x is never
        # formed. (G 1 is zero up to rounding; subtracting it keeps float32 exact for inputs
        # with a large mean.)
        if ctx.use_rows:
            product = (gram @ x).addr_(gram.sum(dim=1), mean.squeeze(0), alpha=-1)
        else:
            product = (x @ gram).sub_(mean @ gram)
        product.addcmul_(x, column_squares, value=-1).add_(mean * column_squares)
        return product.mul_(4 * grad_out)


def covariance_penalty(x: torch.Tensor, n: int | None = None) -> torch.Tensor:
    """Mean squared off-diagonal covariance ``(1/d) * sum_{j != k} C_jk^2`` (paper Eq. 8).

    ``C = centred(x)^T centred(x) / (n - 1)``; ``n`` defaults to the rows of ``x`` (the authors
    divide by their configured global batch size, so it can be passed). Computed from the
    ``n x n`` Gram matrix when ``n < d``, which never forms the ``d x d`` covariance.
    """
    _check_matrix(x, "x")
    rows, d = x.shape
    if rows < 2:
        raise ValueError(f"need at least 2 rows for a covariance, got {rows}")
    denominator = rows if n is None else n
    if isinstance(denominator, bool) or not isinstance(denominator, int) or denominator < 2:
        raise ValueError(f"n must be an int >= 2, got {n!r}")
    with torch.autocast(device_type=x.device.type, enabled=False):
        off_diagonal = _OffDiagonalSquares.apply(as_compute_dtype(x))
        return off_diagonal / ((denominator - 1) ** 2 * d)


def vicreg_variance(z: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """VICReg's hinge on the standard deviation: ``mean_j relu(1 - sqrt(var_j + eps))``."""
    return torch.relu(1 - torch.sqrt(z.var(dim=0) + eps)).mean()
