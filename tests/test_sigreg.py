"""The SIGReg add-on (LeJEPA's regularizer): its statistic against the Epps-Pulley integral
computed by scipy, what it prefers, its directions (seeded, resumable, off torch's default
generator) and its parameter checks. Against lightly's ``SIGReg``: ``test_lightly_oracle.py``;
under two gloo processes: ``test_distributed_addons.py``; killed and resumed: ``test_faults.py``."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import integrate

from e2mc.addons import SIGReg, build_addon

CPU, F64 = torch.device("cpu"), torch.float64


def _fixed(addon: SIGReg, directions: torch.Tensor) -> SIGReg:
    addon.directions = lambda dim, device, dtype: directions.to(dtype)  # type: ignore[method-assign]
    return addon


def epps_pulley_by_quadrature(x: np.ndarray, t_max: float) -> float:
    """``n * int_{-t_max}^{t_max} |ECF(t) - exp(-t^2/2)|^2 exp(-t^2/2) dt`` (the statistic of
    LeJEPA's Eq. for one slice), by adaptive quadrature."""
    def integrand(t: float) -> float:
        cf = np.exp(1j * t * x).mean()
        return abs(cf - math.exp(-t * t / 2)) ** 2 * math.exp(-t * t / 2)

    return len(x) * integrate.quad(integrand, -t_max, t_max, limit=200)[0]


@pytest.mark.parametrize("scale, t_max", [(1.0, 3.0), (0.3, 3.0), (2.0, 5.0)])
def test_statistic_is_the_epps_pulley_integral(scale: float, t_max: float) -> None:
    g = torch.Generator().manual_seed(0)
    z = scale * torch.randn(200, 5, dtype=F64, generator=g)
    one = torch.zeros(5, 1, dtype=F64)
    one[2] = 1.0  # the slice is the third coordinate
    addon = _fixed(SIGReg(weight=1.0, num_slices=1, knots=801, t_max=t_max), one)
    expected = epps_pulley_by_quadrature(z[:, 2].numpy(), t_max)
    assert addon([z])["sigreg"].item() == pytest.approx(expected, rel=1e-4)


def test_the_loss_is_weight_times_the_mean_over_views_and_slices() -> None:
    g = torch.Generator().manual_seed(1)
    za, zb = (torch.randn(64, 6, dtype=F64, generator=g) for _ in range(2))
    eye = torch.eye(6, dtype=F64)
    per_slice = [[_fixed(SIGReg(weight=1.0, num_slices=1), eye[:, [j]])([z])["loss"].item()
                  for j in range(6)] for z in (za, zb)]
    out = _fixed(SIGReg(weight=0.05, num_slices=6), eye)([za, zb])
    assert out["sigreg"].item() == pytest.approx(np.mean(per_slice), rel=1e-12)
    assert out["loss"].item() == pytest.approx(0.05 * np.mean(per_slice), rel=1e-12)


def test_an_isotropic_gaussian_scores_low_and_a_shrunk_one_high() -> None:
    torch.manual_seed(0)
    addon = SIGReg(weight=1.0, num_slices=256)
    g = torch.Generator().manual_seed(2)
    gaussian = torch.randn(512, 32, generator=g)
    # under N(0, 1), E|ECF(t) - exp(-t^2/2)|^2 = (1 - exp(-t^2)) / n: the expected statistic is
    # int_{-3}^{3} (1 - exp(-t^2)) exp(-t^2/2) dt = 1.0527, whatever n
    expected = integrate.quad(lambda t: (1 - math.exp(-t * t)) * math.exp(-t * t / 2), -3, 3)[0]
    assert expected == pytest.approx(1.0527, abs=1e-4)
    assert addon([gaussian])["sigreg"].item() == pytest.approx(expected, abs=0.25)
    # every projection ~ N(0, 0.01): the characteristic function stays near 1, far from the
    # target's exp(-t^2/2), and the statistic grows with n
    assert addon([0.1 * gaussian])["sigreg"].item() > 100.0
    # uniform marginals are not Gaussian either, even at unit variance per coordinate ...
    uniform = (torch.rand(512, 1, generator=g) - 0.5) * math.sqrt(12)
    assert _fixed(addon, torch.ones(1, 1))([uniform])["sigreg"].item() > 3.0


def test_minimising_it_makes_projections_standard_normal() -> None:
    g = torch.Generator().manual_seed(3)
    z = (0.2 * torch.randn(256, 8, generator=g)).requires_grad_()
    torch.manual_seed(3)
    addon = SIGReg(weight=1.0, num_slices=64)
    opt = torch.optim.Adam([z], lr=0.05)
    for _ in range(200):
        opt.zero_grad()
        addon([z])["loss"].backward()
        opt.step()
    std = z.detach().std(dim=0)
    assert torch.all((std > 0.8) & (std < 1.2)), std
    assert addon([z.detach()])["sigreg"].item() < 1.0


def test_directions_are_seeded_resumable_and_leave_the_default_generator_alone() -> None:
    torch.manual_seed(7)
    a = SIGReg(num_slices=16)
    before = torch.get_rng_state()
    first = [a.directions(10, CPU, F64) for _ in range(3)]
    assert torch.equal(torch.get_rng_state(), before)  # nothing drawn from torch's generator
    assert all(torch.allclose(d.norm(dim=0), torch.ones(16, dtype=F64)) for d in first)
    assert not torch.equal(first[0], first[1])  # fresh directions at every call
    torch.manual_seed(7)
    again = SIGReg(num_slices=16)
    assert all(torch.equal(d, again.directions(10, CPU, F64)) for d in first)  # same seed
    torch.manual_seed(8)
    assert not torch.equal(SIGReg(num_slices=16).directions(10, CPU, F64), first[0])
    resumed = SIGReg(num_slices=16)  # another seed, until the state of a comes in
    resumed.load_state_dict(a.state_dict())
    assert a.state_dict()["_extra_state"]["draws"] == 3
    assert torch.equal(resumed.directions(10, CPU, F64), a.directions(10, CPU, F64))


def test_build_and_parameter_errors() -> None:
    assert isinstance(build_addon("sigreg", weight=0.1, num_slices=8, knots=17, t_max=3.0),
                      SIGReg)
    for key, value, text in [("num_slices", 0, ">= 1"), ("knots", 1, ">= 2"),
                             ("t_max", 0, "> 0"), ("weight", -1, ">= 0")]:
        with pytest.raises(ValueError, match=f"^{key} must be {text}, got {value}$"):
            build_addon("sigreg", **{key: value})
    with pytest.raises(ValueError, match="bad arguments for add-on 'sigreg'"):
        build_addon("sigreg", lam=1)


def test_computes_in_float32_under_autocast() -> None:
    z = [torch.randn(64, 16, dtype=torch.bfloat16) for _ in range(2)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = build_addon("sigreg", num_slices=32)(z)
    assert out["loss"].dtype == torch.float32 and torch.isfinite(out["loss"])
