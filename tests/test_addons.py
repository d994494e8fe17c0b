"""Add-on criteria against formulas written from the paper and the official code."""

from __future__ import annotations

import pytest
import torch

import e2mc
from e2mc.addons import E2MC, MMCR, NoAddon, Uniformity, VCReg, build_addon
from reference import (
    reference_e2mc,
    reference_nuclear_norm_of_centroids,
    reference_uniformity,
    reference_vicreg_std_cov,
)


def views(n: int = 48, d: int = 24, k: int = 2) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(n, d, dtype=torch.float64, generator=g, requires_grad=True)
            for _ in range(k)]


def grads(loss: torch.Tensor, inputs: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    return torch.autograd.grad(loss, inputs)


@pytest.mark.parametrize("space", ["hypercube", "hypersphere"])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_e2mc_matches_algorithm_1(space: str, reduction: str) -> None:
    za, zb = views()
    addon = E2MC(space=space, beta=3.0, gamma=7.0, view_reduction=reduction)
    out = addon([za, zb])
    ref = reference_e2mc(za, zb, space, 3.0, 7.0, reduction)
    torch.testing.assert_close(out["loss"], ref, rtol=0, atol=1e-10)
    for got, want in zip(grads(out["loss"], [za, zb]), grads(ref, [za, zb]), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    assert not out["entropy"].requires_grad and not out["covariance"].requires_grad


def test_e2mc_sum_needs_half_beta_to_equal_mean() -> None:
    za, zb = views()
    mean = E2MC(beta=2.0, gamma=1.0, view_reduction="mean")([za, zb])["loss"]
    summed = E2MC(beta=1.0, gamma=1.0, view_reduction="sum")([za, zb])["loss"]
    torch.testing.assert_close(mean, summed, rtol=0, atol=1e-12)


def test_e2mc_covariance_divisor_is_configurable() -> None:
    za, zb = views()
    out = E2MC(beta=0.0, gamma=1.0, batch_size_for_cov=512)([za, zb])
    ref = reference_e2mc(za, zb, "hypercube", 0.0, 1.0, n=512)
    torch.testing.assert_close(out["loss"], ref, rtol=0, atol=1e-12)


def test_e2mc_is_exported_at_top_level() -> None:
    assert e2mc.E2MC is E2MC


def test_optimising_e2mc_makes_marginals_uniform() -> None:
    # Descending the add-on alone drives sigmoid(z) towards uniform marginals (entropy -> 0,
    # its maximum on [0, 1]) while keeping the covariance penalty small.
    torch.manual_seed(0)
    z = (0.3 * torch.randn(256, 16)).requires_grad_(True)
    addon = E2MC(beta=1.0, gamma=1.0)
    start = addon([z, z])["entropy"].item()
    optimizer = torch.optim.Adam([z], lr=0.05)
    for _ in range(100):
        optimizer.zero_grad()
        addon([z, z])["loss"].backward()
        optimizer.step()
    end = addon([z, z])
    assert start < -1.0
    assert -0.1 < end["entropy"].item() <= 0.0
    assert end["covariance"].item() < 1e-2


def test_vcreg_matches_official_vicreg_terms() -> None:
    za, zb = views()
    out = VCReg(mu=0.1, nu=0.001)([za, zb])
    std_loss, cov_loss = reference_vicreg_std_cov(za, zb)
    torch.testing.assert_close(out["variance"], std_loss.detach(), rtol=0, atol=1e-12)
    torch.testing.assert_close(out["covariance"], cov_loss.detach(), rtol=0, atol=1e-10)
    ref = 0.1 * std_loss + 0.001 * cov_loss
    torch.testing.assert_close(out["loss"], ref, rtol=0, atol=1e-12)
    for got, want in zip(grads(out["loss"], [za, zb]), grads(ref, [za, zb]), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_uniformity_matches_wang_isola(reduction: str) -> None:
    za, zb = views()
    out = Uniformity(lam=0.5, t=2.0, view_reduction=reduction)([za, zb])
    per_view = [reference_uniformity(za), reference_uniformity(zb)]
    ref = 0.5 * (sum(per_view) / (2 if reduction == "mean" else 1))
    torch.testing.assert_close(out["loss"], ref, rtol=0, atol=1e-10)
    for got, want in zip(grads(out["loss"], [za, zb]), grads(ref, [za, zb]), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


def test_uniformity_prefers_spread_points() -> None:
    spread = torch.randn(256, 8)
    clumped = torch.randn(1, 8) + 0.01 * torch.randn(256, 8)
    u = Uniformity()
    assert u([spread])["uniformity"] < u([clumped])["uniformity"]


def test_mmcr_matches_nuclear_norm_over_all_views() -> None:
    vs = views(k=8)
    addon = MMCR(lam=0.005)
    assert addon.uses_all_views
    out = addon(vs)
    ref = -0.005 * reference_nuclear_norm_of_centroids(vs)
    torch.testing.assert_close(out["loss"], ref, rtol=0, atol=1e-10)
    for got, want in zip(grads(out["loss"], vs), grads(ref, vs), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-9)


def test_no_addon_is_zero_and_adds_nothing() -> None:
    za, zb = views()
    out = NoAddon()([za, zb])
    assert out["loss"].item() == 0.0 and not out["loss"].requires_grad


def test_build_addon_names_and_errors() -> None:
    assert isinstance(build_addon("none"), NoAddon)
    assert isinstance(build_addon("e2mc", space="hypersphere", beta=1, gamma=25), E2MC)
    assert isinstance(build_addon("vcreg"), VCReg)
    assert isinstance(build_addon("uniformity"), Uniformity)
    assert isinstance(build_addon("mmcr"), MMCR)
    with pytest.raises(ValueError, match="unknown add-on 'entropy'"):
        build_addon("entropy")
    with pytest.raises(ValueError, match="bad arguments for add-on 'e2mc'"):
        build_addon("e2mc", alpha=1)
    with pytest.raises(ValueError, match="space must be"):
        E2MC(space="ball")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="view_reduction"):
        E2MC(view_reduction="max")  # type: ignore[arg-type]


def test_addons_reject_bad_view_lists() -> None:
    za, zb = views()
    with pytest.raises(ValueError, match="at least 2 embedding tensors"):
        E2MC()([za])
    with pytest.raises(ValueError, match="list of at least"):
        E2MC()(za)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="one shape"):
        VCReg()([za, zb[:, :5]])
    with pytest.raises(ValueError, match=r"\[n, d\]"):
        Uniformity()([za.reshape(-1)])


def test_addons_compute_in_float32_under_autocast() -> None:
    z = [torch.randn(64, 16, dtype=torch.bfloat16) for _ in range(2)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for name in ("e2mc", "vcreg", "uniformity", "mmcr"):
            out = build_addon(name)(z)
            assert out["loss"].dtype == torch.float32, name
            assert torch.isfinite(out["loss"]), name
