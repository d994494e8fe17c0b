"""The Fashion-MNIST subset shipped inside the package, and its license notice."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from e2mc.data import FASHION_MNIST_CLASSES, builtin_fashion_mnist, builtin_fashion_mnist_path


def test_shipped_subset_shapes_counts_and_stats() -> None:
    path = builtin_fashion_mnist_path()
    assert path.is_file() and path.stat().st_size < 6_000_000
    for split, n, per_class, n_source in (
        ("train", 10_000, 1000, 60_000),
        ("test", 2000, 200, 10_000),
    ):
        ds = builtin_fashion_mnist(split)
        assert len(ds) == n and ds.images.shape == (n, 28, 28) and ds.images.dtype == np.uint8
        np.testing.assert_array_equal(np.bincount(ds.labels, minlength=10), [per_class] * 10)
        assert ds.classes == list(FASHION_MNIST_CLASSES)
        # pixel statistics of real Fashion-MNIST (train mean 0.2860, std 0.3530 over 60k images)
        pixels = ds.images / 255.0
        assert abs(pixels.mean() - 0.286) < 0.01 and abs(pixels.std() - 0.353) < 0.01
        with np.load(path) as npz:
            source = npz[f"source_index_{split}"]
        assert source.shape == (n,) and np.all(np.diff(source) > 0)
        assert source[0] >= 0 and source[-1] < n_source
        image, label = ds[0]
        assert image.size == (28, 28) and image.mode == "L" and 0 <= label < 10


def test_license_notice_shipped() -> None:
    notice = Path(builtin_fashion_mnist_path()).with_name("FASHION_MNIST_NOTICE.txt")
    text = notice.read_text(encoding="utf-8")
    assert "The MIT License (MIT) Copyright © 2017 Zalando SE" in text
    assert "Permission is hereby granted, free of charge" in text
    assert "THE SOFTWARE IS PROVIDED “AS IS”" in text
    assert "make_fashion_mnist_subset.py" in text and "8d4fb7e6c68d591d4c3dfef9ec88bf0d" in text
