"""Embedding statistics: known values, reference formulas, invariances, bad input."""

from __future__ import annotations

import json
import math

import pytest
import torch

from e2mc.diagnostics.embedding_stats import (
    SATURATION_TOL,
    EmbeddingStatistics,
    abs_correlations,
    auh_uniformity,
    effective_rank,
    embedding_statistics,
    marginal_values,
    nearest_neighbor_distances,
    nn_overlap,
    saturated_fraction,
)


def _rank_one(n: int = 1000, d: int = 16, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, generator=gen) @ torch.randn(1, d, generator=gen)


def test_independent_uniform_is_maximal_entropy_uncorrelated_full_rank():
    torch.manual_seed(0)
    x = torch.rand(2000, 8)
    s = embedding_statistics(x, "unit", k=100)
    # m-spacings estimate of U(0,1) is slightly below its maximum 0 (docs/method.md).
    assert -0.05 < s.entropy_mean < 0.0
    assert s.entropy_min > -0.05
    assert s.abs_corr_mean < 0.04  # E|r| ~ sqrt(2/(pi n)) = 0.018 for independent columns
    assert s.effective_rank > 0.98 * 8
    assert s.constant_dims == 0
    # 8-D uniform: the 100th neighbour is ~100^(1/8) = 1.8x further than the 1st.
    assert s.nn_overlap < 0.05
    assert s.nnk_median > 1.5 * s.nn1_median
    assert s.saturated_fraction == pytest.approx(2 * SATURATION_TOL, abs=2e-3)


def test_rank_one_data_collapses():
    x = _rank_one()
    s = embedding_statistics(x, "hypercube", k=100)
    assert s.effective_rank == pytest.approx(1.0, abs=1e-3)
    assert s.nn_overlap > 0.9
    assert s.abs_corr_mean > 0.95  # all compact columns are monotone functions of one scalar
    uniform = embedding_statistics(torch.rand(1000, 16), "unit", k=100)
    assert s.entropy_mean < uniform.entropy_mean - 0.3


def test_effective_rank_matches_roy_vetterli_formula():
    n, d = 300, 12
    gen = torch.Generator().manual_seed(1)
    # Centred orthonormal columns: the singular values of the centred matrix are exactly s.
    basis = torch.randn(n, 4, generator=gen, dtype=torch.float64)
    q, _ = torch.linalg.qr(basis - basis.mean(0))
    v, _ = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))
    s = torch.tensor([3.0, 2.0, 1.0, 0.5], dtype=torch.float64)
    x = q @ torch.diag(s) @ v[:, :4].T + 7.0  # the shift is removed by centring
    p = s / s.sum()
    expected = math.exp(-(p * p.log()).sum().item())
    assert effective_rank(x) == pytest.approx(expected, rel=1e-6)
    assert effective_rank(5.0 * x) == pytest.approx(expected, rel=1e-6)
    assert effective_rank(x.T.contiguous() - 7.0) > 1.0  # wide matrices go through the n x n Gram
    assert effective_rank(torch.ones(10, 3)) == 0.0


def test_auh_uniformity_matches_direct_formula_and_chunking():
    torch.manual_seed(2)
    x = torch.randn(70, 5, dtype=torch.float64)
    e = torch.nn.functional.normalize(x, dim=1)
    reference = torch.log(torch.exp(-2.0 * torch.pdist(e) ** 2).mean()).item()
    assert auh_uniformity(x, t=2.0, chunk_size=16) == pytest.approx(reference, rel=1e-9)
    assert auh_uniformity(x, t=2.0, chunk_size=1000) == pytest.approx(reference, rel=1e-9)
    assert auh_uniformity(3.0 * x) == pytest.approx(reference, rel=1e-9)  # scale-free
    # All points equal: every pair has distance 0 -> log 1 = 0, the worst value.
    assert auh_uniformity(torch.ones(10, 4)) == pytest.approx(0.0, abs=1e-12)


def test_nearest_neighbor_distances_match_brute_force():
    torch.manual_seed(3)
    x = torch.randn(90, 6, dtype=torch.float64)
    first, kth = nearest_neighbor_distances(x, k=7, normalize=False, chunk_size=32)
    full = torch.cdist(x, x, compute_mode="donot_use_mm_for_euclid_dist")
    full.fill_diagonal_(float("inf"))
    ordered = full.sort(dim=1).values
    torch.testing.assert_close(first, ordered[:, 0])
    torch.testing.assert_close(kth, ordered[:, 6])
    # Normalised geometry equals the raw geometry of the normalised rows.
    f2, k2 = nearest_neighbor_distances(4.0 * x, k=7, normalize=True)
    f3, k3 = nearest_neighbor_distances(torch.nn.functional.normalize(x, dim=1), k=7,
                                        normalize=False)
    torch.testing.assert_close(f2, f3)
    torch.testing.assert_close(k2, k3)


def test_nearest_neighbor_counts_duplicates_but_not_self():
    x = torch.tensor([[0.0, 0.0], [0.0, 0.0], [3.0, 4.0]], dtype=torch.float64)
    first, kth = nearest_neighbor_distances(x, k=2, normalize=False)
    torch.testing.assert_close(first, torch.tensor([0.0, 0.0, 5.0], dtype=torch.float64))
    torch.testing.assert_close(kth, torch.tensor([5.0, 5.0, 5.0], dtype=torch.float64))


def test_nn_overlap_known_value():
    first = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])  # median 3
    kth = torch.tensor([2.5, 3.0, 3.5, 9.0, 10.0])
    assert nn_overlap(first, kth) == pytest.approx(2 / 5)
    with pytest.raises(ValueError, match="equal"):
        nn_overlap(first, kth[:3])


def test_saturation_and_correlation_known_values():
    c = torch.tensor([[0.0, 0.5], [0.9995, 0.2], [0.5, 0.002], [0.3, 1.0]])
    assert saturated_fraction(c) == pytest.approx(3 / 8)
    x = torch.tensor([[1.0, 2.0, 5.0], [2.0, 4.0, 5.0], [3.0, 5.0, 5.0]])
    corr = abs_correlations(x)  # order: (0,1),(0,2),(1,0),(1,2),(2,0),(2,1)
    r01 = torch.corrcoef(x[:, :2].T)[0, 1].abs().item()
    torch.testing.assert_close(corr.float(), torch.tensor([r01, 0, r01, 0, 0, 0]))


def test_standardized_space_is_affine_invariant_and_zero_for_gaussian():
    torch.manual_seed(4)
    x = torch.randn(3000, 4)
    s = embedding_statistics(x, "standardized", k=10)
    assert -0.05 < s.entropy_mean < 0.0  # Phi(z) of Gaussian z is uniform
    scaled = embedding_statistics(x * torch.tensor([0.01, 3.0, 50.0, 1.0]) + 4.0,
                                  "standardized", k=10)
    assert scaled.entropy_mean == pytest.approx(s.entropy_mean, abs=1e-6)
    assert scaled.abs_corr_mean == pytest.approx(s.abs_corr_mean, abs=1e-6)
    # A heavy-tailed feature has lower entropy than a Gaussian one after standardising.
    heavy = embedding_statistics(torch.distributions.StudentT(2.0).sample((3000, 4)),
                                 "standardized", k=10)
    assert heavy.entropy_mean < s.entropy_mean - 0.02


def test_compact_spaces_use_the_criterion_transforms():
    torch.manual_seed(5)
    z = torch.randn(512, 3)
    torch.testing.assert_close(marginal_values(z, "hypercube"), torch.sigmoid(z))
    torch.testing.assert_close(marginal_values(z, "hypersphere"),
                               0.5 * (1 + torch.erf(z / math.sqrt(2))))
    # Known value (docs/method.md): at n=512, sigmoid(N(0,1)) has m-spacings entropy about
    # -0.27 (the true entropy is -0.193; the estimator is biased low at small n).
    s = embedding_statistics(torch.randn(512, 20), "hypercube", k=5)
    assert s.entropy_mean == pytest.approx(-0.27, abs=0.02)


def test_dead_dimensions_and_column_subsampling():
    torch.manual_seed(6)
    x = torch.rand(200, 40)
    x[:, 5] = 0.25
    x[:, 30] = 0.75
    s = embedding_statistics(x, "unit", k=5, max_corr_dims=10)
    assert s.constant_dims == 2  # counted over all columns, not only the subsample
    full = embedding_statistics(x, "unit", k=5)
    assert s.abs_corr_mean == pytest.approx(full.abs_corr_mean, abs=0.03)
    assert s.entropy_min < -10  # log(eps) for a constant column


def test_result_is_json_serialisable_and_reuses_nn_distances():
    torch.manual_seed(7)
    x = torch.randn(60, 5)
    nn = nearest_neighbor_distances(x, k=4)
    s = embedding_statistics(x, "hypersphere", k=4, nn_distances=nn)
    assert s == embedding_statistics(x, "hypersphere", k=4)
    assert isinstance(s, EmbeddingStatistics)
    back = json.loads(json.dumps(s.to_dict()))
    assert EmbeddingStatistics(**back) == s


@pytest.mark.parametrize(
    ("x", "kwargs", "match"),
    [
        (torch.rand(10), {}, "2-D"),
        (torch.rand(1, 4), {}, "at least 2 rows"),
        (torch.tensor([[0.1, float("nan")], [0.2, 0.3]]), {}, "NaN"),
        (torch.rand(10, 3), {"k": 10}, "k must be"),
        (torch.rand(10, 3), {"space": "cube"}, "unknown space"),
        (torch.rand(10, 3) + 1.0, {"space": "unit"}, r"\[0, 1\]"),
    ],
)
def test_bad_input_raises(x, kwargs, match):
    kwargs = {"space": "unit", "k": 3, **kwargs}
    with pytest.raises(ValueError, match=match):
        embedding_statistics(x, **kwargs)
