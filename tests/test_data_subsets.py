"""Label-fraction subsets and SimCLR-style file lists."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from e2mc.data import (
    ArrayDataset,
    LabeledSubset,
    image_folder,
    label_fraction_indices,
    read_file_list,
    subset_from_file_list,
    subset_parts,
)

# class sizes 100, 50, 7, 1 (class 3 has one sample), shuffled order
LABELS = np.random.default_rng(0).permutation(np.repeat([0, 1, 2, 3], [100, 50, 7, 1]))


@pytest.mark.parametrize(
    ("fraction", "expected"),
    [
        (1.0, [100, 50, 7, 1]),
        (0.1, [10, 5, 1, 1]),  # 0.7 rounds to 1; 0.1 -> at least 1
        (0.05, [5, 3, 1, 1]),  # 2.5 rounds half up to 3, 0.35 -> at least 1
        (0.01, [1, 1, 1, 1]),
        (0.5, [50, 25, 4, 1]),  # 3.5 -> 4, 0.5 -> 1
    ],
)
def test_per_class_counts(fraction: float, expected: list[int]) -> None:
    idx = label_fraction_indices(LABELS, fraction, seed=3)
    assert idx.dtype == np.int64
    assert np.all(np.diff(idx) > 0), "sorted and unique"
    np.testing.assert_array_equal(np.bincount(LABELS[idx], minlength=4), expected)


def test_deterministic_per_seed_and_different_across_seeds() -> None:
    a = label_fraction_indices(LABELS, 0.1, seed=0)
    np.testing.assert_array_equal(a, label_fraction_indices(LABELS.tolist(), 0.1, seed=0))
    others = [label_fraction_indices(LABELS, 0.1, seed=s) for s in (1, 2, 3)]
    assert all(not np.array_equal(a, b) for b in others)


def test_seeds_cover_the_class_evenly() -> None:
    # Over many seeds, each of class 0's 100 samples is drawn about 10% of the time: a biased
    # sampler (e.g. always the first members) would fail this.
    hits = np.zeros(len(LABELS))
    for seed in range(200):
        hits[label_fraction_indices(LABELS, 0.1, seed)] += 1
    freq = hits[LABELS == 0] / 200
    assert abs(freq.mean() - 0.1) < 1e-12 and freq.min() > 0.02 and freq.max() < 0.22


@pytest.mark.parametrize("bad", [0, 0.0, -0.1, 1.01, float("nan"), float("inf"), "0.1", True])
def test_fraction_validated(bad) -> None:
    with pytest.raises(ValueError, match="fraction"):
        label_fraction_indices(LABELS, bad, seed=0)


def test_a_label_fraction_subset_keeps_labels() -> None:
    images = np.zeros((len(LABELS), 4, 4), dtype=np.uint8)
    ds = ArrayDataset(images, LABELS, classes=["a", "b", "c", "d"])
    sub = LabeledSubset(ds, label_fraction_indices(LABELS, 0.1, seed=5))
    assert len(sub) == 17 and sub.classes == ["a", "b", "c", "d"]
    np.testing.assert_array_equal(sub.targets, LABELS[label_fraction_indices(LABELS, 0.1, 5)])
    assert all(sub[i][1] == sub.labels[i] for i in range(len(sub)))


def test_read_file_list(tmp_path: Path) -> None:
    path = tmp_path / "1percent.txt"
    path.write_text("n01_1.JPEG\n  n02_7.JPEG  \n\nn01_3.JPEG\n")
    assert read_file_list(path) == ["n01_1.JPEG", "n02_7.JPEG", "n01_3.JPEG"]
    path.write_text("a.JPEG\nb.JPEG\na.JPEG\n")
    with pytest.raises(ValueError, match=r"repeated.*\['a.JPEG'\]"):
        read_file_list(path)
    path.write_text("\n\n")
    with pytest.raises(ValueError, match="empty"):
        read_file_list(path)


def test_subset_from_file_list(tmp_path: Path) -> None:
    for cls, names in {"n01": ["n01_1", "n01_2", "n01_3"], "n02": ["n02_7", "n02_8"]}.items():
        (tmp_path / cls).mkdir()
        for name in names:
            Image.new("RGB", (4, 4)).save(tmp_path / cls / f"{name}.png")
    ds = image_folder(tmp_path)
    sub = subset_from_file_list(ds, ["n02_8.png", "n01/n01_2.png"])
    assert [Path(ds.samples[i][0]).name for i in sub.indices] == ["n01_2.png", "n02_8.png"]
    np.testing.assert_array_equal(sub.labels, [0, 1])
    assert sub[1][1] == 1
    with pytest.raises(ValueError, match=r"2 of 3 listed file\(s\) not found.*n03_1.png.*x.png"):
        subset_from_file_list(ds, ["n01_1.png", "n03_1.png", "x.png"])
    with pytest.raises(ValueError, match="samples"):
        subset_from_file_list(ArrayDataset(np.zeros((2, 3, 3), np.uint8), None), ["a"])


def test_one_subset_type_folds_subsets_of_subsets_and_is_seen_through() -> None:
    """Issue 48: a subset of a subset is one subset of the first parent (its indices composed),
    labels follow when the parent has them (None when not), and ``subset_parts`` sees through
    it, and through torch's ``Subset`` a caller made."""
    from torch.utils.data import Subset

    images = np.arange(len(LABELS) * 4, dtype=np.uint8).reshape(len(LABELS), 2, 2)
    ds = ArrayDataset(images, LABELS)
    inner = LabeledSubset(ds, range(10, 60))
    outer = LabeledSubset(inner, [0, 5, 49])
    assert outer.dataset is ds and outer.indices.tolist() == [10, 15, 59]
    assert outer.labels.tolist() == LABELS[[10, 15, 59]].tolist()
    assert np.array_equal(outer[2][0], ds[59][0])
    assert subset_parts(outer)[0] is ds and subset_parts(outer)[1].tolist() == [10, 15, 59]
    assert subset_parts(ds) == (ds, None)
    assert subset_parts(Subset(ds, [3, 1]))[1].tolist() == [3, 1]
    unlabelled = LabeledSubset(list(range(8)), [7, 2])
    assert unlabelled.labels is None and unlabelled.targets is None and unlabelled[0] == 7
    with pytest.raises(ValueError, match="out of range"):
        LabeledSubset(inner, [50])
