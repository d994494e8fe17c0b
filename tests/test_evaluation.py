"""Evaluation protocols on synthetic features and tiny models."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.metrics import average_precision_score
from sklearn.svm import LinearSVC
from torch import nn
from torch.utils.data import TensorDataset

from e2mc.evaluation import (
    FeatureCache,
    HeadSpec,
    LinearProbeConfig,
    extract_features,
    finetune,
    finetune_settings,
    knn_classify,
    linear_protocol,
    linear_settings,
    svm_transfer,
    train_augmented_linear_probe,
    train_linear_heads,
)
from e2mc.evaluation.knn import class_scores, nearest_neighbours
from e2mc.evaluation.linear import random_resized_crop_flip
from e2mc.evaluation.probe_settings import FinetuneConfig
from reference import train_linear_probe


def blobs(n_per_class: int, classes: int, dim: int, sep: float, seed: int):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(classes, dim)) * sep
    y = np.repeat(np.arange(classes), n_per_class)
    x = centers[y] + rng.normal(size=(len(y), dim))
    perm = rng.permutation(len(y))
    return x[perm].astype(np.float32), y[perm]


def one_head(x, y, tx, ty, cfg, seed=0):
    """One linear probe: a single head of the batched engine on all training rows."""
    return train_linear_heads(x, y, tx, ty, [HeadSpec(np.arange(len(x)), cfg, seed)])[0]


# ---------------------------------------------------------------- subsets and presets
def test_presets_follow_method_md():
    assert linear_settings("vicreg", 0.01).weight_decay == 1e-4
    assert linear_settings("vicreg", 1.0).weight_decay == 1e-6
    assert linear_settings("vicreg", 0.1).lr == 0.02
    assert linear_settings("swav", 0.1).lr == 0.3
    s = linear_settings("simsiam", 0.1)
    assert (s.optimizer, s.lr, s.batch_size, s.weight_decay) == ("lars", 0.2, 2048, 0.0)
    assert linear_settings("simsiam", 0.05).lr == 2.0  # nearest listed fraction at or below
    assert linear_settings("swav", 1.0, epochs=7).epochs == 7
    f = finetune_settings("swav", 0.01)
    assert (f.backbone_lr, f.head_lr, f.schedule, f.milestones, f.gamma) == \
        (0.02, 5.0, "steps", (12, 16), 0.2)
    assert finetune_settings("vicreg", 0.1).head_lr == 0.1
    with pytest.raises(ValueError, match="preset"):
        linear_settings("byol", 0.1)
    with pytest.raises(ValueError):
        LinearProbeConfig(lr=-1)


# ---------------------------------------------------------------- linear probe
def test_linear_probe_separable_reaches_100_and_shuffled_is_chance():
    x, y = blobs(150, 4, 16, sep=4.0, seed=0)
    tx, ty = blobs(100, 4, 16, sep=4.0, seed=0)  # same centers (same seed), fresh noise
    cfg = LinearProbeConfig(epochs=10, lr=0.1, batch_size=64)
    res = one_head(x, y, tx, ty, cfg, seed=0)
    assert res.top1_last >= 99.0
    assert res.top5_last == 100.0  # 4 classes: top-5 capped at 4
    assert len(res.history) == 10 and res.top1_best == max(res.history)
    assert res.top1_best >= res.top1_last
    assert res.history[res.best_epoch - 1] == res.top1_best
    assert res.predictions.shape == ty.shape
    assert 100 * np.mean(res.predictions == ty) == pytest.approx(res.top1_last)

    rng = np.random.default_rng(1)
    shuffled = one_head(x, rng.permutation(y), tx, ty, cfg, seed=0)
    # chance = 25%; 400 test images -> binomial SE ~2.2%
    assert 12.0 < shuffled.top1_last < 38.0


def test_linear_probe_is_seeded_and_checks_input():
    x, y = blobs(20, 3, 8, sep=1.0, seed=2)
    cfg = LinearProbeConfig(epochs=3, batch_size=16, standardize=True)
    a = one_head(x, y, x, y, cfg, seed=5)
    b = one_head(x, y, x, y, cfg, seed=5)
    assert a.history == b.history and np.array_equal(a.predictions, b.predictions)
    with pytest.raises(ValueError, match="same D"):
        one_head(x, y, x[:, :4], y, cfg)
    with pytest.raises(ValueError, match="labels"):
        one_head(x, y[:-1], x, y, cfg)


def test_the_reference_probe_lr_schedule_is_cosine_to_zero(monkeypatch):
    """The oracle of the batched heads (tests/reference.py) follows the protocol's schedule."""
    lrs: list[float] = []
    orig = torch.optim.SGD.step

    def spy(self, *a, **k):
        lrs.append(self.param_groups[0]["lr"])
        return orig(self, *a, **k)

    monkeypatch.setattr(torch.optim.SGD, "step", spy)
    x, y = blobs(8, 2, 4, sep=1.0, seed=0)
    train_linear_probe(x, y, x, y, LinearProbeConfig(epochs=4, lr=0.4, batch_size=16))
    # one step per epoch (16 examples, batch 16); per-epoch cosine: lr_e = lr (1 + cos(pi e/E))/2
    assert lrs == pytest.approx([0.4 * (1 + math.cos(math.pi * e / 4)) / 2 for e in range(4)])


def test_linear_protocol_uses_fraction_subsets():
    x, y = blobs(50, 4, 8, sep=4.0, seed=3)
    out = linear_protocol(x, y, x, y, fractions=(0.1, 1.0), seeds=(0, 1),
                          config_for=lambda f: LinearProbeConfig(epochs=5, batch_size=32))
    assert [(e.fraction, e.seed, len(e.rows)) for e in out] == [
        (0.1, 0, 20), (0.1, 1, 20), (1.0, 0, 200), (1.0, 1, 200)]
    assert all(e.result.top1_last > 90 for e in out[2:])


# ---------------------------------------------------------------- kNN
def unit(angle: float) -> list[float]:
    return [math.cos(angle), math.sin(angle)]


def test_knn_hand_built_bank_and_weighting():
    bank = np.array([unit(0.1), unit(0.2), unit(0.25), unit(3.0)], dtype=np.float32)
    bank[1] *= 7.0  # cosine similarity: scale must not matter
    labels = np.array([0, 1, 1, 0])
    query = np.array([unit(0.0)], dtype=np.float32)
    # k=1: nearest is class 0. k=3 with T=0.07: two class-1 votes outweigh one closer class-0
    # vote; with T=0.01 the sharper weighting lets the closest neighbour win.
    (k1,) = knn_classify(bank, labels, query, np.array([0]), ks=(1,))
    assert k1.predictions.tolist() == [0]
    (warm,) = knn_classify(bank, labels, query, np.array([1]), ks=(3,), temperature=0.07)
    (cold,) = knn_classify(bank, labels, query, np.array([1]), ks=(3,), temperature=0.01)
    assert warm.predictions.tolist() == [1] and warm.top1 == 100.0
    assert cold.predictions.tolist() == [0] and cold.top1 == 0.0
    sims, idx = nearest_neighbours(F.normalize(torch.tensor(bank), dim=1),
                                   F.normalize(torch.tensor(query), dim=1), 3, 1024)
    scores = class_scores(sims, torch.tensor(labels)[idx], 3, 2, "weighted", 0.07)
    ref0 = math.exp(math.cos(0.1) / 0.07)
    ref1 = math.exp(math.cos(0.2) / 0.07) + math.exp(math.cos(0.25) / 0.07)
    assert scores[0].tolist() == pytest.approx([ref0, ref1], rel=1e-4)


def test_knn_chunking_invariance_and_accuracy():
    x, y = blobs(40, 5, 12, sep=3.0, seed=4)
    tx, ty = blobs(20, 5, 12, sep=3.0, seed=4)
    a = knn_classify(x, y, tx, ty, ks=(5, 20), chunk_size=7)
    b = knn_classify(x, y, tx, ty, ks=(5, 20), chunk_size=10_000)
    for ra, rb in zip(a, b, strict=True):
        assert np.array_equal(ra.predictions, rb.predictions) and ra.top1 == rb.top1
    assert a[0].top1 > 95
    with pytest.raises(ValueError, match="k must be"):
        knn_classify(x, y, tx, ty, ks=(len(x) + 1,))


# ---------------------------------------------------------------- SVM
def test_svm_map_equals_sklearn_and_refit():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(120, 6)).astype(np.float32)
    w = rng.normal(size=(6, 3))
    y = (x @ w + 0.3 * rng.normal(size=(120, 3)) > 0.2).astype(int)  # multi-label
    y[0, 0] = -1  # ignored entry
    tr, te = slice(0, 80), slice(80, 120)
    costs = (0.01, 1.0, 100.0)
    res = svm_transfer(x[tr], y[tr], x[te], y[te], costs=costs, folds=3, seed=0)
    assert res.accuracy is None and len(res.costs) == 3
    assert set(res.costs) <= set(costs)
    ref_aps = [average_precision_score(y[te][:, c], res.scores[:, c]) for c in range(3)]
    assert res.mean_ap == pytest.approx(100 * np.mean(ref_aps))
    # Scores are those of a LinearSVC refit on all (valid) training rows with the chosen C.
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    keep = y[tr][:, 0] >= 0
    ref = LinearSVC(C=res.costs[0], max_iter=2000, random_state=0).fit(xn[tr][keep],
                                                                     y[tr][keep, 0])
    assert res.scores[:, 0] == pytest.approx(ref.decision_function(xn[te]), abs=1e-4)
    assert res.mean_ap > 80


def test_svm_single_label_accuracy():
    x, y = blobs(30, 3, 8, sep=4.0, seed=5)
    res = svm_transfer(x[:60], y[:60], x[60:], y[60:], costs=(0.1, 10.0), folds=2)
    assert res.accuracy == pytest.approx(100 * np.mean(res.predictions == y[60:]))
    assert res.accuracy > 95 and res.mean_ap > 95


# ---------------------------------------------------------------- features and cache
class TinyNet(nn.Module):
    def __init__(self, channels: int = 1, dim: int = 8) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, dim, 3, padding=1)
        self.bn = nn.BatchNorm2d(dim)
        self.drop = nn.Dropout(0.5)
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x):
        return self.drop(self.pool(torch.relu(self.bn(self.conv(x)))).flatten(1))


def image_data(n: int = 24, seed: int = 0, size: int = 8) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 3
    x = torch.randn(n, 1, size, size, generator=g) * 0.3 + y[:, None, None, None].float()
    return TensorDataset(x, y)


def test_extract_features_eval_mode_no_grad_and_restores_mode():
    torch.manual_seed(0)
    net = TinyNet().train()
    data = image_data()
    feats, labels = extract_features(net, data, batch_size=5, progress=False)
    assert net.training  # restored
    with torch.no_grad():
        ref = net.eval()(data.tensors[0]).numpy()
    assert feats.dtype == np.float32 and feats.shape == (24, 8)
    np.testing.assert_allclose(feats, ref, rtol=1e-5, atol=1e-6)  # dropout off, running BN
    assert labels.tolist() == data.tensors[1].tolist()


def test_feature_cache_reused_and_invalidated(tmp_path):
    torch.manual_seed(0)
    net = TinyNet()
    data = image_data()
    calls = []

    def counting(backbone, dataset, **kw):
        calls.append(1)
        return extract_features(backbone, dataset, **kw)

    ckpt = tmp_path / "a.pt"
    torch.save(net.state_dict(), ckpt)
    cache = FeatureCache(tmp_path / "cache")
    f1, _, hit1 = cache.get_or_extract(net, data, "d:train", ckpt, extractor=counting,
                                       progress=False)
    f2, _, hit2 = cache.get_or_extract(net, data, "d:train", ckpt, extractor=counting,
                                       progress=False)
    assert (hit1, hit2, len(calls)) == (False, True, 1)
    np.testing.assert_array_equal(f1, f2)
    # The same images under another name are the same entry; other images another one.
    _, _, hit_named = cache.get_or_extract(net, data, "elsewhere:train", ckpt,
                                           extractor=counting, progress=False)
    assert hit_named and len(calls) == 1
    cache.get_or_extract(net, torch.utils.data.Subset(data, range(len(data) - 1)), "d:train",
                         ckpt, extractor=counting, progress=False)
    assert len(calls) == 2
    # A changed checkpoint file invalidates.
    with torch.no_grad():
        net.conv.weight.add_(1.0)
    torch.save(net.state_dict(), ckpt)
    f3, _, hit3 = cache.get_or_extract(net, data, "d:train", ckpt, extractor=counting,
                                       progress=False)
    assert not hit3 and len(calls) == 3 and not np.allclose(f1, f3)
    # Without a file, the state dict (incl. BN buffers) is the key.
    _, _, h4 = cache.get_or_extract(net, data, "d:train", extractor=counting, progress=False)
    _, _, h5 = cache.get_or_extract(net, data, "d:train", extractor=counting, progress=False)
    net.bn.running_mean.add_(0.5)
    _, _, h6 = cache.get_or_extract(net, data, "d:train", extractor=counting, progress=False)
    assert (h4, h5, h6) == (False, True, False)
    # Changed data behind the same id invalidates as well.
    _, _, h7 = cache.get_or_extract(net, image_data(seed=9), "d:train", extractor=counting,
                                    progress=False)
    assert not h7


# ---------------------------------------------------------------- augmented probe, fine-tune
def test_random_resized_crop_flip_full_crop_is_identity_or_flip():
    x = torch.randn(6, 2, 8, 8)
    out = random_resized_crop_flip(x, torch.Generator().manual_seed(0), scale=(1, 1),
                                   ratio=(1, 1))
    for i in range(6):
        assert torch.allclose(out[i], x[i], atol=1e-5) or \
            torch.allclose(out[i], x[i].flip(-1), atol=1e-5)
    out2 = random_resized_crop_flip(x, torch.Generator().manual_seed(0))
    assert out2.shape == x.shape and not torch.allclose(out2, x)


def test_augmented_probe_keeps_backbone_frozen_and_learns():
    torch.manual_seed(0)
    net = TinyNet()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    train, test = image_data(48, seed=0), image_data(24, seed=1)
    tx, ty = extract_features(net, test, progress=False)
    res = train_augmented_linear_probe(net, train, tx, ty, num_classes=3,
                                       config=LinearProbeConfig(epochs=8, lr=0.5, batch_size=16),
                                       progress=False)
    for k, v in net.state_dict().items():
        assert torch.equal(v, before[k]), k  # eval mode: BN running stats untouched
    assert len(res.history) == 8 and res.top1_best > 60


def test_finetune_learns_and_leaves_caller_backbone_untouched():
    torch.manual_seed(0)
    net = TinyNet()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    train, test = image_data(48, seed=0), image_data(30, seed=1)
    cfg = FinetuneConfig(epochs=6, batch_size=16, backbone_lr=0.05, head_lr=0.5,
                         schedule="steps", milestones=(4,), augment=False)
    res = finetune(net, 8, 3, train, test, cfg, progress=False)
    assert all(torch.equal(v, before[k]) for k, v in net.state_dict().items())
    assert len(res.history) == 6 and res.top1_best > 80


def test_the_reference_lars_probe_uses_simsiam_larc_step(monkeypatch):
    """The oracle of the batched heads: SimSiam's LARC (trust 0.001, no clip, wd 0): the first
    step moves the weight by exactly lr * 0.001 * ||w0|| (the gradient is rescaled to norm
    0.001 * ||w0||)."""
    x, y = blobs(8, 2, 4, sep=1.0, seed=0)
    weights: list[torch.Tensor] = []
    orig = nn.Linear.forward

    def spy(self, inp):
        weights.append(self.weight.detach().clone())
        return orig(self, inp)

    monkeypatch.setattr(nn.Linear, "forward", spy)
    cfg = linear_settings("simsiam", 0.01, epochs=1, batch_size=16)
    train_linear_probe(x, y, x, y, cfg, seed=0)
    w0, w1 = weights[0], weights[1]  # before the step, then at the test-set evaluation
    assert torch.linalg.vector_norm(w1 - w0).item() == pytest.approx(
        cfg.lr * 0.001 * torch.linalg.vector_norm(w0).item(), rel=1e-4)
