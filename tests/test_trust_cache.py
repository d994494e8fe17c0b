"""The feature cache's identity covers every image and label it was computed from (issue 22,
item 4), and an unwritable cache directory does not abort an evaluation (item 12)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn
from torch.utils.data import Subset, TensorDataset

from e2mc.data import ArrayDataset, build_dataset
from e2mc.evaluation.features import FeatureCache, dataset_fingerprint
from e2mc.evaluation.runner import EvalOptions, run_evaluation


def _to_tensor(img: Image.Image) -> torch.Tensor:
    return torch.from_numpy(np.asarray(img, np.float32)).reshape(-1) / 255.0


def _arrays(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` 4x4 images of 3 classes; class c has a bright row c (kNN k=1 gets 100%)."""
    labels = np.arange(n) % 3
    images = np.random.default_rng(seed).integers(0, 20, (n, 4, 4))
    images[np.arange(n), labels] += 200
    return images.astype(np.uint8), labels


def _knn(train, test, cache_dir: Path | None, out: Path) -> tuple[float, dict]:
    """kNN k=1 top-1 of an evaluation through the runner, and its cache hits."""
    options = EvalOptions(protocols=("knn",), knn_k=(1,), knn_weightings=("uniform",),
                          progress=False, num_workers=0)
    record = run_evaluation(nn.Flatten(), 16, train, test, out, options, data_id="toy",
                            cache=None if cache_dir is None else FeatureCache(cache_dir))
    (entry,) = record["entries"]
    return entry["metrics"]["top1"], record["feature_cache_hit"]


def test_relabelled_or_replaced_array_item_is_a_cache_miss(tmp_path):
    (xtr, ytr), (xte, yte) = _arrays(30, 0), _arrays(15, 1)
    train = ArrayDataset(xtr, ytr, transform=_to_tensor)
    assert _knn(train, ArrayDataset(xte, yte, transform=_to_tensor), tmp_path / "c",
                tmp_path / "e0") == (100.0, {"train": False, "test": False})
    assert _knn(train, ArrayDataset(xte, yte, transform=_to_tensor), tmp_path / "c",
                tmp_path / "e1") == (100.0, {"train": True, "test": True})
    relabelled = yte.copy()
    relabelled[7] = (relabelled[7] + 1) % 3  # one label in the middle
    replaced = xte.copy()
    replaced[8] = xte[9]  # one image in the middle, now of another class than its label
    for name, test in (("relabelled", ArrayDataset(xte, relabelled, transform=_to_tensor)),
                       ("replaced", ArrayDataset(replaced, yte, transform=_to_tensor))):
        fresh, _ = _knn(train, test, None, tmp_path / f"{name}-nocache")
        assert fresh == pytest.approx(100 * 14 / 15)
        assert _knn(train, test, tmp_path / "c", tmp_path / name) == (
            pytest.approx(fresh), {"train": True, "test": False})


def _folder(root: Path, split: str, n: int, seed: int) -> None:
    images, labels = _arrays(n, seed)
    for k, (image, label) in enumerate(zip(images, labels, strict=True)):
        (root / split / f"c{label}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(root / split / f"c{label}" / f"{k:03d}.png",
                                    compress_level=0)  # the size depends on the shape only


def test_replaced_or_moved_image_file_is_a_cache_miss(tmp_path):
    data = tmp_path / "data"
    _folder(data, "train", 30, 0)
    _folder(data, "test", 15, 1)

    def knn(out: str, cache: bool = True) -> tuple[float, dict]:
        ds = [build_dataset(str(data), s, _to_tensor) for s in ("train", "test")]
        return _knn(*ds, tmp_path / "c" if cache else None, tmp_path / out)

    assert knn("e0") == (100.0, {"train": False, "test": False})
    assert knn("e1") == (100.0, {"train": True, "test": True})
    victim = data / "test" / "c1" / "007.png"
    stamp = victim.stat()
    class0 = np.full((4, 4), 5, np.uint8)
    class0[0] = 205
    Image.fromarray(class0).save(victim, compress_level=0)
    os.utime(victim, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))  # and mtime, as cp -p keeps
    assert victim.stat().st_size == stamp.st_size
    fresh, _ = knn("replaced-nocache", cache=False)
    assert fresh == pytest.approx(100 * 14 / 15)
    assert knn("replaced") == (pytest.approx(fresh), {"train": True, "test": False})
    (data / "test" / "c1" / "007.png").rename(data / "test" / "c0" / "007.png")  # relabelled
    assert knn("moved") == (100.0, {"train": True, "test": False})


def test_fingerprint_covers_wrapped_and_tensor_datasets():
    x = torch.arange(40, dtype=torch.float32).reshape(10, 4)
    y = torch.arange(10) % 2

    def digest(ds):
        return dataset_fingerprint(ds, "d")["content"]

    base = digest(TensorDataset(x, y))
    assert digest(TensorDataset(x.clone(), y.clone())) == base
    x2 = x.clone()
    x2[5, 1] += 1
    assert digest(TensorDataset(x2, y)) != base
    assert digest(Subset(TensorDataset(x, y), [0, 1, 2])) != digest(
        Subset(TensorDataset(x, y), [0, 1, 3]))


def _make_unwritable(cache_dir: Path, monkeypatch) -> None:
    cache_dir.mkdir()
    cache_dir.chmod(stat.S_IRUSR | stat.S_IXUSR)
    if os.geteuid() == 0:  # root writes anyway: the write fails as it would for a user
        import e2mc.files

        original = e2mc.files.atomic_write

        def refuse(path, *args, **kwargs):
            if Path(path).parent == cache_dir:
                raise PermissionError(13, "Permission denied", str(path))
            return original(path, *args, **kwargs)

        monkeypatch.setattr(e2mc.files, "atomic_write", refuse)


def test_unwritable_cache_directory_warns_and_goes_on(tmp_path, monkeypatch, capsys):
    (xtr, ytr), (xte, yte) = _arrays(30, 0), _arrays(15, 1)
    yte[7] = (yte[7] + 1) % 3
    train = ArrayDataset(xtr, ytr, transform=_to_tensor)
    test = ArrayDataset(xte, yte, transform=_to_tensor)
    cache_dir = tmp_path / "ro"
    _make_unwritable(cache_dir, monkeypatch)
    try:
        result = _knn(train, test, cache_dir, tmp_path / "e")
    finally:
        cache_dir.chmod(stat.S_IRWXU)
    assert result == (pytest.approx(100 * 14 / 15), {"train": False, "test": False})
    assert (tmp_path / "e" / "results.json").is_file()
    err = capsys.readouterr().err.splitlines()
    warnings = [line for line in err if "cannot be written" in line]
    assert len(warnings) == 1 and str(cache_dir) in warnings[0]  # once, not per split
    assert warnings[0].startswith("warning: feature cache") and "without" in warnings[0]
    assert list(cache_dir.iterdir()) == []


def test_an_evaluation_hashes_each_data_set_once(tmp_path, monkeypatch):
    """The content identity results.json records and the feature cache's key are one hash of
    each data set, not two (an image folder's hash stats every file)."""
    import e2mc.data.identity as identity
    import e2mc.evaluation.features as features

    calls: list[int] = []
    real = identity.content_digest

    def counting(dataset):
        calls.append(len(dataset))
        return real(dataset)

    monkeypatch.setattr(identity, "content_digest", counting)
    monkeypatch.setattr(features, "content_digest", counting)
    (xtr, ytr), (xte, yte) = _arrays(30, 0), _arrays(15, 1)
    train = ArrayDataset(xtr, ytr, transform=_to_tensor)
    test = ArrayDataset(xte, yte, transform=_to_tensor)
    assert _knn(train, test, tmp_path / "c", tmp_path / "e") == (
        100.0, {"train": False, "test": False})
    assert sorted(calls) == [15, 30]  # once each, for results.json and the cache key alike
    record = json.loads((tmp_path / "e" / "results.json").read_text())
    key_content = {json.loads(str(np.load(p)["identity"]))["content"]
                   for p in (tmp_path / "c").glob("*.npz")}
    assert key_content == {record["train_data"]["content"], record["test_data"]["content"]}
