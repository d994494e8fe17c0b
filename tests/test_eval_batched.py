"""Batched linear heads: equal to independently trained probes, against sklearn, and the
learning-rate grid chosen on validation only."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from e2mc.data.subsets import label_fraction_indices
from e2mc.evaluation.batched import HeadSpec, train_linear_heads
from e2mc.evaluation.probe_settings import LinearProbeConfig, linear_settings
from e2mc.evaluation.sweep import linear_protocol, validation_split
from reference import sequential_linear_sweep, train_linear_probe


def blobs(n: int, classes: int, dim: int, sep: float, seed: int, offset: float = 0.0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(classes, dim)) * sep
    y = rng.integers(0, classes, n)
    return (centers[y] + rng.normal(size=(n, dim)) + offset).astype(np.float32), y


def mixed_heads(n: int) -> list[HeadSpec]:
    """Heads that share streams (grid points) and heads that differ in every setting."""
    base = LinearProbeConfig(epochs=3, batch_size=32, lr=0.1)
    half, small = np.arange(0, n, 2), np.arange(n // 3)
    return [
        HeadSpec(half, base, seed=0),
        HeadSpec(half, replace(base, lr=0.5, weight_decay=1e-3), seed=0),       # same stream
        HeadSpec(half, replace(base, epochs=1), seed=0),                        # stops early
        HeadSpec(half, replace(base, epochs=2, standardize=True), seed=1),
        HeadSpec(small, replace(base, optimizer="lars", lr=2.0, weight_decay=1e-2,
                                epochs=4), seed=3),
        HeadSpec(small, replace(base, batch_size=50, momentum=0.5), seed=3),    # other batch
        HeadSpec(np.arange(n), replace(base, batch_size=64, optimizer="lars",
                                       standardize=True), seed=2),
    ]


def test_batched_heads_equal_independent_probes_float64():
    x, y = blobs(240, 4, 6, sep=1.5, seed=0, offset=0.7)
    tx, ty = blobs(60, 4, 6, sep=1.5, seed=1, offset=0.7)
    heads = mixed_heads(len(x))
    batched = train_linear_heads(x, y, tx, ty, heads, num_classes=4, dtype=torch.float64,
                                 keep_weights=True)
    for h, got in zip(heads, batched, strict=True):
        ref = train_linear_probe(x[h.rows], y[h.rows], tx, ty, h.config, seed=h.seed,
                                 num_classes=4, dtype=torch.float64, keep_weights=True)
        assert got.weight.shape == (6, 4)
        np.testing.assert_allclose(got.weight, ref.weight, rtol=0, atol=1e-5)
        np.testing.assert_allclose(got.bias, ref.bias, rtol=0, atol=1e-5)
        assert got.history == ref.history and len(got.history) == h.config.epochs
        assert np.array_equal(got.predictions, ref.predictions)
        assert np.array_equal(got.best_predictions, ref.best_predictions)
        assert got.best_epoch == ref.best_epoch
        # The weights moved: a head that was not trained would fail the comparison above
        # only if the reference did not move either.
        assert np.abs(ref.weight).max() > 0.02


def test_heads_alone_equal_heads_together_and_finished_heads_stop():
    """A head's result does not depend on which other heads share the run; a 1-epoch head in
    a 3-epoch stream keeps its weights after its epoch."""
    x, y = blobs(200, 3, 5, sep=2.0, seed=2)
    heads = mixed_heads(len(x))
    together = train_linear_heads(x, y, x, y, heads, dtype=torch.float64, keep_weights=True)
    for i in (0, 2, 4):
        alone = train_linear_heads(x, y, x, y, [heads[i]], dtype=torch.float64,
                                   keep_weights=True)[0]
        np.testing.assert_allclose(together[i].weight, alone.weight, rtol=0, atol=1e-12)
    one_epoch = replace(heads[0].config, epochs=1)
    ref = train_linear_probe(x[heads[0].rows], y[heads[0].rows], x, y, one_epoch, seed=0,
                             dtype=torch.float64, keep_weights=True)
    np.testing.assert_allclose(together[2].weight, ref.weight, rtol=0, atol=1e-12)
    assert not np.allclose(together[2].weight, together[0].weight)


def test_batched_float32_matches_sequential_sweep():
    x, y = blobs(600, 5, 16, sep=1.0, seed=3)
    tx, ty = blobs(300, 5, 16, sep=1.0, seed=4)

    def cfg(f: float) -> LinearProbeConfig:
        return linear_settings("generic", f, epochs=4)

    seq = sequential_linear_sweep(x, y, tx, ty, (0.2, 1.0), (0, 1), config_for=cfg)
    bat = linear_protocol(x, y, tx, ty, (0.2, 1.0), (0, 1), config_for=cfg)
    pairs = [(f, s, r) for f in (0.2, 1.0) for s, r in seq[f]]
    for (f, s, a), e in zip(pairs, bat, strict=True):
        assert (f, s) == (e.fraction, e.seed)
        assert np.mean(a.predictions != e.result.predictions) <= 0.01
        assert abs(a.top1_last - e.result.top1_last) <= 0.5


def test_batched_probe_matches_sklearn_logistic_regression_on_digits():
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    x, y = load_digits(return_X_y=True)
    xtr, xte, ytr, yte = train_test_split(x.astype(np.float32), y, test_size=0.3,
                                          random_state=0, stratify=y)
    c = 1.0
    scaler = StandardScaler().fit(xtr)
    sk = LogisticRegression(C=c, max_iter=5000).fit(scaler.transform(xtr), ytr)
    sk_acc = 100 * sk.score(scaler.transform(xte), yte)
    # sklearn minimizes sum(CE) + ||W||^2 / (2C); per example: mean(CE) + wd/2 ||W||^2 with
    # wd = 1 / (C n). (SGD decays the bias too; its effect here is negligible.)
    cfg = LinearProbeConfig(epochs=60, batch_size=64, lr=0.1, weight_decay=1 / (c * len(xtr)),
                            standardize=True)
    heads = [HeadSpec(np.arange(len(xtr)), cfg, seed=s) for s in (0, 1)]
    results = train_linear_heads(xtr, ytr, xte, yte, heads)
    sk_pred = sk.predict(scaler.transform(xte))
    for r in results:
        assert abs(r.top1_last - sk_acc) <= 1.0, (r.top1_last, sk_acc)
        assert np.mean(r.predictions == sk_pred) >= 0.98
    assert sk_acc > 93


def test_validation_split_is_stratified_and_disjoint():
    labels = np.array([0] * 10 + [1] * 5 + [2] * 1 + [3] * 2)
    tr, val = validation_split(labels, 0.2, seed=0)
    assert np.intersect1d(tr, val).size == 0 and len(tr) + len(val) == len(labels)
    counts = np.bincount(labels[val], minlength=4)
    assert counts.tolist() == [2, 1, 0, 1]  # round(0.2 n_c), >= 1, n_c = 1 stays in training
    assert not np.array_equal(val, validation_split(labels, 0.2, seed=1)[1])
    with pytest.raises(ValueError):
        validation_split(labels, 1.0, seed=0)


def _grid_run(test_y: np.ndarray, test_x: np.ndarray | None = None):
    x, y = blobs(500, 4, 10, sep=0.8, seed=5)
    tx, _ = blobs(200, 4, 10, sep=0.8, seed=6)
    return linear_protocol(
        x, y, tx if test_x is None else test_x, test_y, (0.2, 1.0), (0, 1),
        config_for=lambda f: LinearProbeConfig(epochs=3, batch_size=32, lr=0.1),
        lr_grid={0.2: (0.001, 0.03, 1.0), 1.0: (0.001, 0.3)}, wd_grid={1.0: (0.0, 0.05)})


def test_lr_choice_is_made_on_validation_and_ignores_test_labels():
    _, ty = blobs(200, 4, 10, sep=0.8, seed=6)
    first = _grid_run(ty)
    permuted = _grid_run(np.random.default_rng(0).permutation(ty))
    assert [e.selection for e in first] == [e.selection for e in permuted]
    assert [e.config for e in first] == [e.config for e in permuted]
    for e in first:
        sel = e.selection
        assert sel is not None and len(sel["grid"]) == (3 if e.fraction == 0.2 else 4)
        assert (e.config.lr, e.config.weight_decay) == (sel["chosen"]["lr"],
                                                        sel["chosen"]["weight_decay"])
        best = max(g["val_top1"] for g in sel["grid"])
        assert next(g for g in sel["grid"] if g["lr"] == e.config.lr and
                    g["weight_decay"] == e.config.weight_decay)["val_top1"] == best
        assert sel["train_size"] + sel["validation_size"] == len(e.rows)
        assert e.config.lr != 0.001  # the tiny lr under-trains in 3 epochs
    # The test accuracy of the reported heads does depend on the test labels.
    assert [e.result.top1_last for e in first] != [e.result.top1_last for e in permuted]


def test_fixed_preset_without_grid_and_subsets_override():
    x, y = blobs(300, 3, 6, sep=2.0, seed=7)
    rows = np.arange(0, 300, 3)
    cfg = LinearProbeConfig(epochs=2, batch_size=16)
    out = linear_protocol(x, y, x, y, (0.5,), (0, 1), config_for=lambda f: cfg,
                          subsets={0.5: rows})
    for e in out:
        assert e.selection is None and e.config == cfg and np.array_equal(e.rows, rows)
        ref = train_linear_probe(x[rows], y[rows], x, y, cfg, seed=e.seed)
        assert abs(ref.top1_last - e.result.top1_last) <= 1.0


def test_a_grid_of_one_point_is_the_probe_trained():
    """A one-value --lr-grid / --wd-grid has nothing to choose from: the probe trains at that
    value (it trained at the preset's before, though settings recorded the grid)."""
    x, y = blobs(300, 3, 6, sep=2.0, seed=7)
    cfg = LinearProbeConfig(epochs=2, batch_size=16, lr=0.1)
    out = linear_protocol(x, y, x, y, (1.0,), (0,), config_for=lambda f: cfg,
                          lr_grid={1.0: (0.5,)}, wd_grid={1.0: (0.01,)}, dtype=torch.float64)
    assert out[0].selection is None and (out[0].config.lr, out[0].config.weight_decay) == (
        0.5, 0.01)
    ref = train_linear_probe(x, y, x, y, replace(cfg, lr=0.5, weight_decay=0.01), seed=0,
                             dtype=torch.float64)
    assert out[0].result.history == ref.history


@pytest.mark.parametrize("method", ["vicreg", "swav", "simsiam", "generic"])
def test_paper_presets_run_through_the_batched_path(method):
    """Each method's presets (SimSiam: LARC, batch 256 at 1% and 2048 above) in one batched
    run give the sequential probe's numbers (float64)."""
    x, y = blobs(2500, 5, 8, sep=1.0, seed=8)
    tx, ty = blobs(200, 5, 8, sep=1.0, seed=9)

    def cfg(f: float) -> LinearProbeConfig:
        return linear_settings(method, f, epochs=2)

    out = linear_protocol(x, y, tx, ty, (0.1, 1.0), (0, 1), config_for=cfg,
                          dtype=torch.float64)
    for e in out:
        assert e.config == cfg(e.fraction) and e.selection is None
        idx = label_fraction_indices(y, e.fraction, e.seed)
        ref = train_linear_probe(x[idx], y[idx], tx, ty, e.config, seed=e.seed, num_classes=5,
                                 dtype=torch.float64)
        assert e.result.history == ref.history
        assert np.array_equal(e.result.predictions, ref.predictions)


def test_plan_shares_a_stream_per_batch_order_and_a_group_per_batch_size():
    """Grid points of one subset and seed share a stream (one set of batches); another seed,
    standardization or batch size is another stream; groups are batch sizes, longest first."""
    from e2mc.evaluation.batched.plan import plan_groups, plan_streams

    heads = mixed_heads(240)
    streams, slots = plan_streams(heads)
    assert [s.heads for s in streams] == [[0, 1, 2], [3], [4], [5], [6]]
    assert [(s, slot) for s, slot in slots][:3] == [(streams[0], 0), (streams[0], 1),
                                                    (streams[0], 2)]
    assert streams[0].total_steps == 3 * 4 and streams[2].total_steps == 4 * 3  # 120/32, 80/32
    groups = plan_groups(streams)
    assert [[s.batch_size for s in g] for g in groups] == [[32, 32, 32], [50], [64]]
    assert [s.total_steps for s in groups[0]] == sorted((s.total_steps for s in groups[0]),
                                                        reverse=True)


def test_best_head_is_chosen_on_finished_results_top1_then_loss_then_order():
    from e2mc.evaluation.batched import best_head
    from e2mc.evaluation.linear import ProbeResult

    def result(top1: float, loss: float) -> ProbeResult:
        return ProbeResult(top1_last=top1, top5_last=100.0, top1_best=top1, top5_best=100.0,
                           best_epoch=1, history=[top1], loss_last=loss)

    assert best_head([result(50, 1.0), result(60, 2.0), result(55, 0.1)]) == 1
    assert best_head([result(60, 2.0), result(60, 1.0), result(60, 1.0)]) == 1
    assert best_head([result(60, float("nan")), result(60, 9.0)]) == 1
    assert best_head([result(60, float("nan")), result(60, float("nan"))]) == 0
    with pytest.raises(ValueError):
        best_head([])
