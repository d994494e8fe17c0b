"""Datasets: IDX reading, arrays, npz, image folders (corrupt files), build_dataset."""

from __future__ import annotations

import gzip
import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from e2mc.data import (
    FASHION_MNIST_CLASSES,
    MNIST_CLASSES,
    ArrayDataset,
    build_dataset,
    fashion_mnist,
    image_folder,
    load_idx,
    mnist,
    npz_dataset,
    save_idx,
)
from e2mc.errors import CorruptImageError


def idx_bytes(array: np.ndarray) -> bytes:
    """Reference IDX encoding written from the format spec (independent of save_idx)."""
    code = {np.uint8: 0x08, np.int32: 0x0C}[array.dtype.type]
    header = bytes([0, 0, code, array.ndim])
    header += b"".join(int(s).to_bytes(4, "big") for s in array.shape)
    return header + array.astype(array.dtype.newbyteorder(">")).tobytes()


@pytest.fixture
def images() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, size=(12, 5, 4), dtype=np.uint8)


@pytest.mark.parametrize("compression", ["none", "gzip9", "gzip1", "multimember"])
def test_load_idx_matches_reference_encoding(tmp_path: Path, images, compression) -> None:
    payload = idx_bytes(images)
    if compression == "gzip9":
        payload = gzip.compress(payload, compresslevel=9)
    elif compression == "gzip1":
        payload = gzip.compress(payload, compresslevel=1)
    elif compression == "multimember":  # e.g. a re-gzipped file: two concatenated gzip members
        payload = gzip.compress(payload[:30]) + gzip.compress(payload[30:])
    path = tmp_path / "x-idx3-ubyte"
    path.write_bytes(payload)
    out = load_idx(path)
    assert out.dtype == np.uint8 and out.shape == (12, 5, 4)
    np.testing.assert_array_equal(out, images)


@pytest.mark.parametrize("name", ["a.idx", "a.idx.gz"])
def test_save_load_round_trip(tmp_path: Path, name: str) -> None:
    labels = np.arange(-5, 5, dtype=np.int32)
    save_idx(labels, tmp_path / name)
    raw = (tmp_path / name).read_bytes()
    assert raw.startswith(b"\x1f\x8b") == name.endswith(".gz")
    out = load_idx(tmp_path / name)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, labels)


def test_load_idx_errors(tmp_path: Path, images) -> None:
    bad = tmp_path / "bad-magic"
    bad.write_bytes(b"\x12\x34\x08\x03" + idx_bytes(images)[4:])
    with pytest.raises(ValueError, match="bad-magic.*magic number 12340803"):
        load_idx(bad)
    truncated = tmp_path / "short.gz"
    truncated.write_bytes(gzip.compress(idx_bytes(images)[:-7]))
    with pytest.raises(ValueError, match=r"short\.gz.*truncated.*needs 240 data bytes, found 233"):
        load_idx(truncated)
    broken_gzip = tmp_path / "cut.gz"
    broken_gzip.write_bytes(gzip.compress(idx_bytes(images))[:-20])
    with pytest.raises(ValueError, match="cut.gz.*gzip"):
        load_idx(broken_gzip)
    with pytest.raises(FileNotFoundError):
        load_idx(tmp_path / "missing")


def write_idx_folder(folder: Path, gz: bool, n_train: int = 20, n_test: int = 10) -> None:
    folder.mkdir(parents=True)
    rng = np.random.default_rng(1)
    suffix = ".gz" if gz else ""
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        save_idx(rng.integers(0, 256, (n, 28, 28), dtype=np.uint8),
                 folder / f"{prefix}-images-idx3-ubyte{suffix}")  # fmt: skip
        save_idx(np.arange(n, dtype=np.uint8) % 10, folder / f"{prefix}-labels-idx1-ubyte{suffix}")


def test_fashion_mnist_raw_and_torchvision_layouts(tmp_path: Path) -> None:
    write_idx_folder(tmp_path / "plain", gz=True)
    write_idx_folder(tmp_path / "tv" / "FashionMNIST" / "raw", gz=False)
    for root in (tmp_path / "plain", tmp_path / "tv"):
        train = fashion_mnist(root, "train")
        test = fashion_mnist(root, "test")
        assert len(train) == 20 and len(test) == 10
        assert train.classes == list(FASHION_MNIST_CLASSES)
        image, label = train[13]
        assert isinstance(image, Image.Image) and image.size == (28, 28) and image.mode == "L"
        assert label == 3 and isinstance(label, int)
        np.testing.assert_array_equal(train.targets, np.arange(20) % 10)
    with pytest.raises(ValueError, match="split"):
        fashion_mnist(tmp_path / "plain", "val")
    with pytest.raises(ValueError, match="no IDX files"):
        mnist(tmp_path / "tv")  # only FashionMNIST/raw there


def test_array_dataset(images) -> None:
    rgb = np.random.default_rng(2).integers(0, 256, (3, 6, 6, 3), dtype=np.uint8)
    ds = ArrayDataset(rgb, np.array([2, 0, 1]), transform=lambda im: np.asarray(im))
    x, y = ds[0]
    np.testing.assert_array_equal(x, rgb[0])
    assert y == 2 and ds.labels.dtype == np.int64 and ds.classes is None
    unlabeled = ArrayDataset(images, None)
    assert unlabeled[0][1] == -1 and unlabeled[0][0].mode == "L"
    with pytest.raises(ValueError, match="uint8"):
        ArrayDataset(images.astype(np.float32), None)
    with pytest.raises(ValueError, match="shape"):
        ArrayDataset(images, np.zeros(3, dtype=np.int64))
    with pytest.raises(ValueError, match="out of range"):
        ArrayDataset(images, np.full(12, 4), classes=["a", "b"])


def test_npz_dataset(tmp_path: Path, images) -> None:
    path = tmp_path / "d.npz"
    np.savez(path, x_train=images, y_train=np.arange(12) % 3, x_test=images[:2],
             y_test=np.array([1, 0]), classes=np.array(["a", "b", "c"]))  # fmt: skip
    ds = npz_dataset(path, "test")
    assert len(ds) == 2 and ds.classes == ["a", "b", "c"] and ds[0][1] == 1
    assert len(build_dataset(str(path), "train")) == 12
    with pytest.raises(ValueError, match=r"x_val.*splits available: \['test', 'train'\]"):
        npz_dataset(path, "val")


def make_png(path: Path, value: int, mode: str = "RGB") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, (8, 8), color=value if mode == "L" else (value, 0, 0)).save(path)


@pytest.fixture
def folder_with_corrupt(tmp_path: Path) -> Path:
    root = tmp_path / "imgs" / "train"
    for cls in ("cat", "dog"):
        for i in range(3):
            make_png(root / cls / f"{cls}{i}.png", 40 * i)
    (root / "cat" / "garbage.png").write_bytes(b"this is not an image")
    good_jpeg = root / "dog" / "whole.jpg"
    Image.new("RGB", (64, 64), (10, 200, 30)).save(good_jpeg, quality=90)
    (root / "dog" / "truncated.jpg").write_bytes(good_jpeg.read_bytes()[:300])
    make_png(tmp_path / "imgs" / "val" / "cat" / "v.png", 1)
    make_png(tmp_path / "imgs" / "val" / "dog" / "w.png", 2)
    return tmp_path / "imgs"


def test_corrupt_image_error_names_file(folder_with_corrupt: Path) -> None:
    ds = image_folder(folder_with_corrupt / "train")
    assert len(ds) == 9 and ds.num_skipped == 0
    names = [Path(p).name for p, _ in ds.samples]
    for bad in ("garbage.png", "truncated.jpg"):
        with pytest.raises(CorruptImageError, match=bad):
            ds[names.index(bad)]
    image, label = ds[names.index("whole.jpg")]
    assert image.mode == "RGB" and label == 1


def test_skip_corrupt_counts_and_warns(folder_with_corrupt: Path) -> None:
    with pytest.warns(UserWarning, match="skipped 2 corrupt"):
        ds = build_dataset(str(folder_with_corrupt), "train", skip_corrupt=True)
    assert ds.num_skipped == 2
    assert sorted(Path(p).name for p in ds.skipped_files) == ["garbage.png", "truncated.jpg"]
    assert len(ds) == 7 and ds.classes == ["cat", "dog"]
    np.testing.assert_array_equal(ds.labels, [0, 0, 0, 1, 1, 1, 1])
    for i in range(len(ds)):  # every remaining file loads
        ds[i]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        clean = build_dataset(str(folder_with_corrupt), "test", skip_corrupt=True)  # val/ used
    assert clean.num_skipped == 0 and len(clean) == 2


def test_build_dataset_specs(tmp_path: Path) -> None:
    write_idx_folder(tmp_path / "fashion-mnist", gz=True)
    write_idx_folder(tmp_path / "data" / "MNIST" / "raw", gz=True)
    write_idx_folder(tmp_path / "unnamed", gz=False)
    assert build_dataset(str(tmp_path / "fashion-mnist"), "test").classes == list(
        FASHION_MNIST_CLASSES
    )
    assert build_dataset(str(tmp_path / "data"), "train").classes == list(MNIST_CLASSES)
    assert build_dataset(str(tmp_path / "unnamed"), "train").classes is None
    assert len(build_dataset("builtin", "test")) == 2000
    with pytest.raises(ValueError, match="unknown built-in"):
        build_dataset("builtin:cifar10", "train")
    (tmp_path / "empty").mkdir()
    for spec in (str(tmp_path / "empty"), str(tmp_path / "nothing.npz"), "imagenet"):
        with pytest.raises(ValueError, match="looked for.*IDX|looked for.*idx"):
            build_dataset(spec, "train")
