"""The E2MC criterion against known values, reference formulas from the paper, and invariances."""

from __future__ import annotations

import math

import pytest
import torch

from e2mc.criterion import (
    _sort_keys,
    compact_transform,
    covariance_penalty,
    default_m,
    m_spacings_entropy,
)
from reference import reference_covariance, reference_entropy


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def test_uniform_samples_have_entropy_close_to_zero() -> None:
    h = m_spacings_entropy(torch.rand(512, 1000))
    assert h.shape == (1000,)
    assert -0.05 <= h.mean().item() <= 0.0


def test_sigmoid_of_gaussian_known_value() -> None:
    z = torch.randn(512, 1000)
    h = m_spacings_entropy(compact_transform(z, "hypercube")).mean().item()
    assert h == pytest.approx(-0.27, abs=0.02)
    # The exact entropy is H(Z) + E[log sigmoid'(Z)] = 0.5 log(2 pi e) + E[log s(1 - s)] ~ -0.193;
    # the m-spacings estimate at n = 512 is biased low (the tails are under-sampled).
    z_big = torch.randn(2_000_000, dtype=torch.float64)
    s = torch.sigmoid(z_big)
    exact = 0.5 * math.log(2 * math.pi * math.e) + torch.log(s * (1 - s)).mean().item()
    assert exact == pytest.approx(-0.193, abs=0.003)
    assert exact - 0.12 < h < exact


def test_normal_cdf_of_gaussian_behaves_like_uniform() -> None:
    z = torch.randn(512, 1000)
    via_cdf = m_spacings_entropy(compact_transform(z, "hypersphere")).mean().item()
    uniform = m_spacings_entropy(torch.rand(512, 1000)).mean().item()
    assert via_cdf == pytest.approx(uniform, abs=0.005)
    assert -0.05 <= via_cdf <= 0.0


def test_entropy_of_scaled_uniform_shifts_by_log_scale() -> None:
    # H(aU) = H(U) + log a: a real property of differential entropy the estimator keeps exactly
    # (eps = 0 so nothing but the spacings matter).
    u = torch.rand(256, 50, dtype=torch.float64)
    h1 = m_spacings_entropy(u, eps=0.0)
    h2 = m_spacings_entropy(0.25 * u, eps=0.0)
    torch.testing.assert_close(h2, h1 + math.log(0.25), rtol=0, atol=1e-12)


def test_compact_transforms_are_the_named_functions() -> None:
    z = torch.linspace(-4, 4, 17, dtype=torch.float64).reshape(-1, 1)
    torch.testing.assert_close(compact_transform(z, "hypercube"), 1 / (1 + torch.exp(-z)))
    cdf = 0.5 * (1 + torch.erf(z / math.sqrt(2)))
    torch.testing.assert_close(compact_transform(z, "hypersphere"), cdf)
    with pytest.raises(ValueError, match="space must be one of"):
        compact_transform(z, "cube")


@pytest.mark.parametrize("m", [None, 1, 5, 31])
def test_entropy_matches_reference_values_and_gradients(m: int | None) -> None:
    x = torch.randn(97, 13, dtype=torch.float64, requires_grad=True)
    mm = default_m(97) if m is None else m
    ours = m_spacings_entropy(x, m=m)
    ref = reference_entropy(x, mm)
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-10)
    w = torch.randn(13, dtype=torch.float64)
    (g_ours,) = torch.autograd.grad((ours * w).sum(), x)
    (g_ref,) = torch.autograd.grad((ref * w).sum(), x)
    torch.testing.assert_close(g_ours, g_ref, rtol=0, atol=1e-10)


def test_default_m_is_rounded_square_root() -> None:
    assert default_m(512) == 23
    assert default_m(256) == 16
    assert default_m(2) == 1
    x = torch.rand(512, 3, dtype=torch.float64)
    torch.testing.assert_close(m_spacings_entropy(x), m_spacings_entropy(x, m=23))


def test_gradcheck_entropy_and_covariance() -> None:
    x = torch.randn(12, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: m_spacings_entropy(t, m=3), (x,))
    assert torch.autograd.gradcheck(covariance_penalty, (x,))
    wide = torch.randn(4, 9, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(covariance_penalty, (wide,))
    assert torch.autograd.gradcheck(lambda t: covariance_penalty(t, n=10), (wide,))


@pytest.mark.parametrize("shape", [(16, 64), (64, 16), (32, 32)])
@pytest.mark.parametrize("n_div", [None, 100])
def test_covariance_matches_direct_formula(shape: tuple[int, int], n_div: int | None) -> None:
    x = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    ours = covariance_penalty(x, n=n_div)
    ref = reference_covariance(x, n_div)
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-10)
    (g_ours,) = torch.autograd.grad(ours, x)
    (g_ref,) = torch.autograd.grad(ref, x)
    torch.testing.assert_close(g_ours, g_ref, rtol=0, atol=1e-10)


def test_gram_path_equals_direct_path_both_ways() -> None:
    # n < d takes the n x n Gram route, n > d the d x d route: both must equal the formula.
    for n, d in [(8, 300), (300, 8)]:
        x = torch.randn(n, d, dtype=torch.float64)
        torch.testing.assert_close(
            covariance_penalty(x), reference_covariance(x), rtol=1e-12, atol=1e-12
        )


def test_covariance_of_independent_columns_is_small_and_of_copies_is_large() -> None:
    x = torch.rand(4096, 8, dtype=torch.float64)
    assert covariance_penalty(x).item() < 1e-4
    dup = torch.cat([x[:, :1]] * 8, dim=1)
    var = x[:, 0].var().item()
    # 8 identical columns: all 56 off-diagonal entries equal the variance.
    assert covariance_penalty(dup).item() == pytest.approx(56 * var**2 / 8, rel=1e-9)


def test_entropy_invariant_to_column_shift_and_row_permutation() -> None:
    x = torch.rand(200, 10, dtype=torch.float64)
    h = m_spacings_entropy(x)
    shift = torch.randn(1, 10, dtype=torch.float64)
    torch.testing.assert_close(m_spacings_entropy(x + shift), h, rtol=0, atol=1e-9)
    perm = torch.randperm(200)
    torch.testing.assert_close(m_spacings_entropy(x[perm]), h, rtol=0, atol=1e-12)
    # centring first changes nothing either (docs/method.md)
    torch.testing.assert_close(m_spacings_entropy(x - x.mean(0)), h, rtol=0, atol=1e-9)


def test_ties_give_finite_loss_and_gradients() -> None:
    base = torch.rand(16, 6)
    x = torch.cat([base, base, base]).requires_grad_(True)  # every row three times
    h = m_spacings_entropy(compact_transform(x, "hypercube"), m=1)
    c = covariance_penalty(x)
    assert torch.isfinite(h).all() and torch.isfinite(c)
    # m = 1 over exact ties: two of every three spacings are zero -> log(eps) terms
    assert h.mean().item() < -5
    (-h.mean() + c).backward()
    assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_inputs_are_computed_in_float32(dtype: torch.dtype) -> None:
    # Large, distinct values: in fp16/bf16 the normal CDF rounds them all to exactly 1.0.
    z = (3.5 + torch.rand(256, 4) * 1.5).to(dtype).requires_grad_(True)
    low = torch.special.ndtr(z.detach())
    assert (low == 1).float().mean() > 0.5  # the saturation we guard against
    zc = compact_transform(z, "hypersphere")
    assert zc.dtype == torch.float32
    h = m_spacings_entropy(zc)
    c = covariance_penalty(zc)
    assert h.dtype == torch.float32 and c.dtype == torch.float32
    assert torch.isfinite(h).all() and h.mean().item() > math.log(1e-7) + 1
    (-h.mean() + c).backward()
    assert z.grad.dtype == dtype and torch.isfinite(z.grad.float()).all()


def test_autocast_does_not_lower_precision() -> None:
    x = torch.randn(64, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        zc = compact_transform(x, "hypercube")
        h = m_spacings_entropy(zc)
        c = covariance_penalty(zc)
    assert zc.dtype == h.dtype == c.dtype == torch.float32
    torch.testing.assert_close(c, covariance_penalty(torch.sigmoid(x)))


def test_float64_stays_float64() -> None:
    x = torch.rand(32, 4, dtype=torch.float64)
    assert m_spacings_entropy(x).dtype == torch.float64
    assert covariance_penalty(x).dtype == torch.float64
    assert compact_transform(x, "hypercube").dtype == torch.float64


def test_bad_inputs_raise_clear_errors() -> None:
    with pytest.raises(ValueError, match="must be 2-D"):
        m_spacings_entropy(torch.rand(10))
    with pytest.raises(ValueError, match="must be 2-D"):
        covariance_penalty(torch.rand(2, 3, 4))
    with pytest.raises(ValueError, match="at least 2 rows"):
        m_spacings_entropy(torch.rand(1, 5))
    with pytest.raises(ValueError, match="at least 2 rows"):
        covariance_penalty(torch.rand(1, 5))
    with pytest.raises(ValueError, match=r"1 <= m < n = 10"):
        m_spacings_entropy(torch.rand(10, 3), m=10)
    with pytest.raises(ValueError, match=r"1 <= m < n"):
        m_spacings_entropy(torch.rand(10, 3), m=0)
    with pytest.raises(ValueError, match="m must be an int"):
        m_spacings_entropy(torch.rand(10, 3), m=2.5)  # type: ignore[arg-type]
    x = torch.rand(10, 20)
    x[3, 4] = float("nan")
    x[5, 4] = float("inf")
    x[0, 17] = float("-inf")
    with pytest.raises(ValueError, match=r"3 non-finite values .* in 2 columns: 4, 17"):
        m_spacings_entropy(x)
    with pytest.raises(ValueError, match="non-finite"):
        covariance_penalty(x)
    with pytest.raises(ValueError, match="floating-point"):
        m_spacings_entropy(torch.ones(10, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="n must be an int >= 2"):
        covariance_penalty(torch.rand(10, 3), n=1)
    with pytest.raises(ValueError, match="eps must be >= 0"):
        m_spacings_entropy(torch.rand(10, 3), eps=-1.0)


def test_covariance_gradient_stays_accurate_in_float32_for_inputs_with_a_large_mean() -> None:
    # The analytic backward never forms the centred matrix; it must still not lose float32
    # precision to the mean (both the Gram path n < d and the covariance path n > d).
    for n, d in [(64, 1024), (1024, 64)]:
        z = 0.3 * torch.randn(n, d, dtype=torch.float64) + 5.0
        x64 = z.clone().requires_grad_(True)
        x32 = z.float().requires_grad_(True)
        covariance_penalty(x64).backward()
        covariance_penalty(x32).backward()
        rel = (x32.grad.double() - x64.grad).norm() / x64.grad.norm()
        assert rel < 2e-5, (n, d, float(rel))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_integer_sort_keys_are_in_the_order_of_the_floats(dtype: torch.dtype) -> None:
    # The spacings sort integer keys of the floats; their order must be the floats' order over
    # signs, zeros, subnormals and the extremes, and the keys must map back to the same bits.
    info = torch.finfo(dtype)
    special = torch.tensor([0.0, -0.0, info.tiny, -info.tiny, info.tiny / 4, -info.tiny / 4,
                            info.max, -info.max, info.eps, 1.0, -1.0, 0.5], dtype=dtype)
    x = torch.cat([special, torch.randn(500, dtype=dtype) * 10.0 ** torch.randint(-30, 30, (500,))])
    keys, order = torch.sort(_sort_keys(x.clone()))
    assert torch.equal(x[order], torch.sort(x).values)
    assert torch.equal(_sort_keys(keys).view(dtype), torch.sort(x).values)
