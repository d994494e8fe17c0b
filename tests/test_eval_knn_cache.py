"""kNN against a brute-force numpy reference; the feature cache's stale-entry detection,
extraction workers and the bf16 autocast path (on the CPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from e2mc.evaluation.features import FeatureCache, extract_features
from e2mc.evaluation.knn import knn_classify


def brute_force_knn(x, y, q, k, weighting, temperature, classes):
    """Every similarity in float64, neighbours by (similarity desc, index asc), class scores,
    prediction = first maximal class."""
    xn = x.astype(np.float64) / np.linalg.norm(x, axis=1, keepdims=True)
    qn = q.astype(np.float64) / np.linalg.norm(q, axis=1, keepdims=True)
    sims = qn @ xn.T
    preds = []
    for row in sims:
        nn_idx = np.lexsort((np.arange(len(row)), -row))[:k]
        scores = np.zeros(classes)
        for i in nn_idx:
            scores[y[i]] += np.exp(row[i] / temperature) if weighting == "weighted" else 1.0
        preds.append(int(np.argmax(scores)))
    return np.array(preds)


@pytest.mark.parametrize(("chunk", "bank_chunk"), [(13, 64), (1024, 65536)])
def test_knn_equals_brute_force_reference(chunk, bank_chunk):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 8)).astype(np.float32)
    y = rng.integers(0, 5, 400)
    q = rng.normal(size=(61, 8)).astype(np.float32)
    qy = rng.integers(0, 5, 61)
    x[10] = x[3]
    x[300] = 2 * x[3]  # exact duplicates (same cosine) in another bank block: a tie
    q[0] = x[3]
    results = knn_classify(x, y, q, qy, ks=(1, 3, 7, 40), temperature=0.1,
                           weightings=("weighted", "uniform"), chunk_size=chunk,
                           bank_chunk=bank_chunk)
    assert [(r.k, r.weighting) for r in results] == [
        (k, w) for k in (1, 3, 7, 40) for w in ("weighted", "uniform")]
    for r in results:
        ref = brute_force_knn(x, y, q, r.k, r.weighting, 0.1, 5)
        assert np.array_equal(r.predictions, ref), (r.k, r.weighting)
        assert r.top1 == pytest.approx(100 * np.mean(ref == qy))
        assert r.top5_predictions.shape == (61, 5)
        assert np.array_equal(r.top5_predictions[:, 0], r.predictions)
    # uniform and weighted votes differ somewhere at k=40 (the test tells them apart)
    by = {(r.k, r.weighting): r.predictions for r in results}
    assert not np.array_equal(by[(40, "weighted")], by[(40, "uniform")])


def test_knn_rejects_bad_arguments():
    x = np.ones((5, 2), dtype=np.float32)
    y = np.zeros(5, dtype=int)
    with pytest.raises(ValueError, match="k must be"):
        knn_classify(x, y, x, y, ks=(6,))
    with pytest.raises(ValueError, match="weighting"):
        knn_classify(x, y, x, y, ks=(1,), weightings=("cubic",))


# ---------------------------------------------------------------- feature cache
def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())


def _data(n: int = 20) -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(n, 1, 6, 6, generator=g), torch.arange(n) % 3)


def _counting():
    calls = []

    def extractor(backbone, dataset, **kw):
        calls.append(1)
        return extract_features(backbone, dataset, **kw)

    return calls, extractor


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "identity"])
def test_stale_or_corrupt_cache_entry_is_rebuilt(tmp_path, damage):
    net, data = _net(), _data()
    cache = FeatureCache(tmp_path)
    calls, extractor = _counting()
    ref, _, hit = cache.get_or_extract(net, data, "d:train", extractor=extractor, progress=False)
    key, identity = cache.key(net, data, "d:train")
    path = cache.path(key)
    raw = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(raw[: len(raw) // 2])
    elif damage == "flip":  # one byte inside the stored feature values: the zip CRC fails
        i = raw.index(ref[5].tobytes()[:8])
        path.write_bytes(raw[:i] + bytes([raw[i] ^ 0xFF]) + raw[i + 1:])
    elif damage == "garbage":
        path.write_bytes(b"not a zip file")
    else:  # a valid file holding another identity (e.g. an older format) under this key
        np.savez(path, features=ref, labels=np.zeros(len(ref)),
                 identity=np.array('{"format": 1}'))
    with pytest.warns(UserWarning, match="stale"):
        again, labels, hit2 = cache.get_or_extract(net, data, "d:train", extractor=extractor,
                                                   progress=False)
    assert (hit, hit2, len(calls)) == (False, False, 2)
    assert cache.rebuilt == [key]
    np.testing.assert_array_equal(again, ref)
    # the rebuilt entry is valid and used
    _, _, hit3 = cache.get_or_extract(net, data, "d:train", extractor=extractor, progress=False)
    assert hit3 and len(calls) == 2


def test_cache_key_includes_precision_and_architecture(tmp_path):
    net, data = _net(), _data()
    ckpt = tmp_path / "w.pt"
    torch.save(net.state_dict(), ckpt)
    cache = FeatureCache(tmp_path / "c")
    k32, _ = cache.key(net, data, "d", ckpt)
    kbf, _ = cache.key(net, data, "d", ckpt, precision="bfloat16-autocast")
    other = nn.Sequential(nn.Conv2d(1, 4, 3), nn.Tanh(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Identity())
    other.load_state_dict(net.state_dict(), strict=False)
    k_other, _ = cache.key(nn.ModuleList([other]), data, "d", ckpt)
    assert len({k32, kbf, k_other}) == 3


def test_extraction_with_workers_and_bf16_autocast_on_cpu():
    net, data = _net(), _data(40)
    ref, labels = extract_features(net, data, batch_size=8, num_workers=0, progress=False)
    workers, labels_w = extract_features(net, data, batch_size=8, num_workers=2,
                                         progress=False)
    np.testing.assert_array_equal(workers, ref)
    np.testing.assert_array_equal(labels_w, labels)
    bf16, _ = extract_features(net, data, batch_size=8, autocast=True, progress=False)
    assert bf16.dtype == np.float32
    # bfloat16 keeps ~3 significant digits: close to, but not equal to, float32
    np.testing.assert_allclose(bf16, ref, rtol=0.05, atol=0.02)
    assert not np.array_equal(bf16, ref)
