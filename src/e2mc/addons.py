"""Add-on criteria applied on top of a method's own loss during continued pre-training.

Each add-on is an ``nn.Module`` called with the method's embeddings (a list of ``[n, d]``
tensors: the two main views, or every view for MMCR) and returning a dict of named terms,
detached for logging, plus the differentiable ``"loss"`` to add to the base loss.

With ``gather=True`` inside an initialised process group, embeddings are all-gathered with
gradients, so every statistic is over the global batch. All ranks then compute the same loss;
the gather's backward sums the ranks' gradients, so each rank's rows receive ``world_size``
times their share, which DDP's gradient averaging turns into exactly the single-process gradient.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import nn

from e2mc.criterion import (
    Space,
    as_compute_dtype,
    compact_transform,
    covariance_penalty,
    m_spacings_entropy,
    vicreg_variance,
)
from e2mc.distributed import broadcast_from_main, gather_with_grad
from e2mc.ranges import Bound, OneOf, above, at_least, checked

ViewReduction = Literal["mean", "sum"]
VIEW_REDUCTIONS = ("mean", "sum")


def _reduce(values: Sequence[torch.Tensor], how: ViewReduction) -> torch.Tensor:
    stacked = torch.stack(list(values))
    return stacked.mean() if how == "mean" else stacked.sum()


class Addon(nn.Module):
    """Base class: ``forward(embeddings) -> {"loss": ..., <named detached terms>}``."""

    #: True when the add-on wants every view's embeddings (MMCR), not only the two main views.
    uses_all_views: bool = False
    #: The smallest number of views the add-on can work with.
    min_views: int = 1
    #: The range of every constructor parameter but the flags (``e2mc.ranges``): checked by the
    #: configuration (``addon.params``) before anything is built, and on every construction.
    param_ranges: ClassVar[dict[str, Bound]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "__init__" in vars(cls):
            cls.__init__ = checked(vars(cls)["__init__"], "param_ranges")  # type: ignore[method-assign]

    def __init__(self, gather: bool = True) -> None:
        super().__init__()
        self.gather = gather

    def _prepare(self, embeddings: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        if isinstance(embeddings, torch.Tensor) or len(embeddings) < self.min_views:
            raise ValueError(
                f"{type(self).__name__} needs a list of at least {self.min_views} embedding "
                f"tensors (one per view), got {type(embeddings).__name__}"
                + ("" if isinstance(embeddings, torch.Tensor) else f" of {len(embeddings)}")
            )
        shapes = {tuple(z.shape) for z in embeddings}
        if len(shapes) != 1 or len(next(iter(shapes))) != 2:
            raise ValueError(f"every view's embeddings must be [n, d] of one shape, got {shapes}")
        with torch.autocast(device_type=embeddings[0].device.type, enabled=False):
            views = [as_compute_dtype(z) for z in embeddings]
            return [gather_with_grad(z) for z in views] if self.gather else views


class NoAddon(Addon):
    """The "continued" baseline: the method's own loss alone."""

    def forward(self, embeddings: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"loss": embeddings[0].new_zeros((), dtype=torch.float32)}


class E2MC(Addon):
    """The E2MC criterion (paper Eq. 6, Algorithm 1; docs/method.md#total-loss).

    ``loss = -beta * reduce_v(H_v) + gamma * sum_v C_v`` where ``H_v`` is the mean over dimensions
    of the m-spacings entropy of ``compact_transform(z_v, space)`` and ``C_v`` its covariance
    penalty. ``view_reduction="mean"`` (default) averages the entropies as the authors' code did;
    ``"sum"`` is the paper's Algorithm 1 (needs half the beta). ``batch_size_for_cov`` divides the
    covariance by the configured global batch size minus one, as the authors did.
    """

    min_views = 2
    param_ranges = {"space": OneOf(("hypercube", "hypersphere")), "beta": at_least(0),
                    "gamma": at_least(0), "eps": above(0), "view_reduction": OneOf(VIEW_REDUCTIONS),
                    "m": at_least(1),  # None: round(sqrt(n)); below the batch, checked there
                    "batch_size_for_cov": at_least(2)}

    def __init__(
        self,
        space: Space = "hypercube",
        beta: float = 1.0,
        gamma: float = 1.0,
        eps: float = 1e-7,
        view_reduction: ViewReduction = "mean",
        gather: bool = True,
        m: int | None = None,
        batch_size_for_cov: int | None = None,
    ) -> None:
        super().__init__(gather)
        self.space, self.beta, self.gamma, self.eps = space, float(beta), float(gamma), eps
        self.view_reduction, self.m, self.batch_size_for_cov = view_reduction, m, batch_size_for_cov

    def forward(self, embeddings: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        views = self._prepare(embeddings)
        entropies, covariances = [], []
        for z in views:
            zc = compact_transform(z, self.space)
            entropies.append(m_spacings_entropy(zc, m=self.m, eps=self.eps).mean())
            covariances.append(covariance_penalty(zc, n=self.batch_size_for_cov))
        entropy = _reduce(entropies, self.view_reduction)
        covariance = torch.stack(covariances).sum()
        loss = -self.beta * entropy + self.gamma * covariance
        return {"loss": loss, "entropy": entropy.detach(), "covariance": covariance.detach()}


class VCReg(Addon):
    """VICReg's variance and covariance terms as an add-on (paper App. B, SwAV ablation).

    ``loss = mu * mean_v variance(z_v) + nu * sum_v covariance(z_v)``, as VICReg combines them
    (the variance averaged over the two views, the covariance summed); mu = 0.1, nu = 0.001.
    """

    min_views = 2
    param_ranges = {"mu": at_least(0), "nu": at_least(0), "eps": above(0)}

    def __init__(self, mu: float = 0.1, nu: float = 0.001, eps: float = 1e-4,
                 gather: bool = True) -> None:
        super().__init__(gather)
        self.mu, self.nu, self.eps = float(mu), float(nu), eps

    def forward(self, embeddings: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        views = self._prepare(embeddings)
        variance = torch.stack([vicreg_variance(z, self.eps) for z in views]).mean()
        covariance = torch.stack([covariance_penalty(z) for z in views]).sum()
        loss = self.mu * variance + self.nu * covariance
        return {"loss": loss, "variance": variance.detach(), "covariance": covariance.detach()}


def uniformity(z: torch.Tensor, t: float = 2.0) -> torch.Tensor:
    """AUH uniformity ``log mean_{p<q} exp(-t ||e_p - e_q||^2)`` of L2-normalised rows."""
    e = F.normalize(z, dim=1)
    sq_dists = torch.pdist(e, p=2).pow(2)
    return torch.logsumexp(-t * sq_dists, dim=0) - math.log(sq_dists.numel())


class Uniformity(Addon):
    """AUH uniformity (Wang & Isola 2020) as an add-on (paper Eq. unifloss; lambda 0.5, t 2).

    ``loss = lam * reduce_v uniformity(z_v)``; averaged over the views by default (docs/method.md),
    ``view_reduction="sum"`` for the paper's equation.
    """

    min_views = 1
    param_ranges = {"lam": at_least(0), "t": above(0), "view_reduction": OneOf(VIEW_REDUCTIONS)}

    def __init__(self, lam: float = 0.5, t: float = 2.0, view_reduction: ViewReduction = "mean",
                 gather: bool = True) -> None:
        super().__init__(gather)
        self.lam, self.t, self.view_reduction = float(lam), float(t), view_reduction

    def forward(self, embeddings: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        views = self._prepare(embeddings)
        value = _reduce([uniformity(z, self.t) for z in views], self.view_reduction)
        return {"loss": self.lam * value, "uniformity": value.detach()}


class MMCR(Addon):
    """Maximum manifold capacity (Yerxa et al. 2023) as an add-on (paper App. B; lambda 0.005).

    ``loss = -lam * ||C||_*``: the nuclear norm of the ``[n, d]`` matrix of per-image centroids
    of the L2-normalised embeddings over all V views.
    """

    uses_all_views = True
    min_views = 1
    param_ranges = {"lam": at_least(0)}

    def __init__(self, lam: float = 0.005, gather: bool = True) -> None:
        super().__init__(gather)
        self.lam = float(lam)

    def forward(self, embeddings: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        views = self._prepare(embeddings)
        centroids = torch.stack([F.normalize(z, dim=1) for z in views]).mean(dim=0)
        nuclear = torch.linalg.svdvals(centroids).sum()
        return {"loss": -self.lam * nuclear, "nuclear_norm": nuclear.detach()}


# --------------------------------------------------------------------------- SIGReg (LeJEPA)
def epps_pulley(x: torch.Tensor, t: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The Epps-Pulley statistic of each column of ``x`` ([n, s]: n samples of s slices) against
    N(0, 1), averaged over the slices: ``n * integral |ECF(t) - exp(-t^2/2)|^2 exp(-t^2/2) dt``
    over ``[-t_max, t_max]``, by the trapezoidal rule on the knots ``t`` >= 0 (the integrand is
    even; ``weights`` are the doubled trapezoid weights times ``exp(-t^2/2)``)."""
    xt = x.unsqueeze(-1) * t  # [n, s, knots]
    phi = torch.exp(-t.square() / 2)
    error = (xt.cos().mean(0) - phi).square() + xt.sin().mean(0).square()  # [s, knots]
    return ((error @ weights) * x.shape[0]).mean()


class SIGReg(Addon):
    """SIGReg, LeJEPA's regularizer (Balestriero & LeCun 2025), as an add-on (docs/method.md).

    ``loss = weight * mean_v mean_slices EP(z_v a_s)``: each view's embeddings projected on
    ``num_slices`` random unit directions ``a_s``, each projection's Epps-Pulley distance to
    N(0, 1) (:func:`epps_pulley`), so the loss pulls the embeddings towards an isotropic Gaussian.
    Equal to lightly's ``SIGReg`` on the stacked views for the same directions
    (``tests/test_lightly_oracle.py``).

    The directions are drawn afresh at every call from a generator of its own, seeded by the run's
    seed (``torch.initial_seed()`` at construction) and the draws so far: both are its state in
    ``checkpoint.pt``, so a resumed run draws what the uninterrupted one drew, on any device,
    and every rank draws rank 0's (its seed is broadcast once).
    """

    min_views = 1
    param_ranges = {"weight": at_least(0), "num_slices": at_least(1), "knots": at_least(2),
                    "t_max": above(0)}

    def __init__(self, weight: float = 0.05, num_slices: int = 1024, knots: int = 17,
                 t_max: float = 3.0, gather: bool = True) -> None:
        super().__init__(gather)
        self.weight, self.num_slices = float(weight), num_slices
        self.knots, self.t_max = knots, t_max
        self.seed, self.draws, self._seed_shared = torch.initial_seed() % 2**63, 0, False
        t = torch.linspace(0, t_max, knots, dtype=torch.float64)
        weights = torch.full((knots,), 2 * t_max / (knots - 1), dtype=torch.float64)
        weights[[0, -1]] /= 2
        self.register_buffer("t", t, persistent=False)  # not in the state dict: from the params
        self.register_buffer("weights", weights * torch.exp(-t.square() / 2), persistent=False)

    def get_extra_state(self) -> dict[str, int]:
        return {"seed": self.seed, "draws": self.draws}

    def set_extra_state(self, state: dict[str, int]) -> None:
        self.seed, self.draws, self._seed_shared = int(state["seed"]), int(state["draws"]), False

    def directions(self, dim: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """The next ``[dim, num_slices]`` random unit columns (normal draws, normalised)."""
        if not self._seed_shared:
            shared = broadcast_from_main(torch.tensor(self.seed, dtype=torch.int64,
                                                      device=device))
            self.seed, self._seed_shared = int(shared), True
        generator = torch.Generator(device).manual_seed(hash((self.seed, self.draws)) % 2**63)
        self.draws += 1
        a = torch.randn(dim, self.num_slices, generator=generator, device=device, dtype=dtype)
        return a / a.norm(dim=0)

    def forward(self, embeddings: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        views = self._prepare(embeddings)
        with torch.autocast(device_type=views[0].device.type, enabled=False):
            a = self.directions(views[0].shape[1], views[0].device, views[0].dtype)
            t, weights = (b.to(views[0].device, views[0].dtype) for b in (self.t, self.weights))
            value = torch.stack([epps_pulley(z @ a, t, weights) for z in views]).mean()
        return {"loss": self.weight * value, "sigreg": value.detach()}


ADDONS: dict[str, type[Addon]] = {
    "none": NoAddon,
    "e2mc": E2MC,
    "vcreg": VCReg,
    "uniformity": Uniformity,
    "mmcr": MMCR,
    "sigreg": SIGReg,
}


def build_addon(name: str, **kwargs: Any) -> Addon:
    """Build an add-on by name: ``none``, ``e2mc``, ``vcreg``, ``uniformity``, ``mmcr`` or
    ``sigreg``."""
    if name not in ADDONS:
        raise ValueError(f"unknown add-on {name!r}; choose one of {', '.join(ADDONS)}")
    try:
        return ADDONS[name](**kwargs)
    except TypeError as error:
        raise ValueError(f"bad arguments for add-on {name!r}: {error}") from None
