"""Labels are the data's, not the split's (issue 22): one class list for every split of an image
folder, symlinked directories walked once, 16-bit and float images scaled to 8 bits (not clipped)
in both input pipelines."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from e2mc.data import (
    build_dataset,
    build_views,
    default_normalization,
    eval_transform,
    image_folder,
)
from e2mc.data.fast_views import FastViews
from e2mc.evaluation.knn import knn_classify

COLOURS = {"ant": (255, 0, 0), "bee": (0, 255, 0), "cat": (0, 0, 255), "dog": (255, 255, 0)}


def _write(folder: Path, name: str, n: int, colour: tuple[int, int, int]) -> None:
    (folder / name).mkdir(parents=True, exist_ok=True)
    for k in range(n):
        Image.new("RGB", (4, 4), colour).save(folder / name / f"{k}.png")


def _mean_colour_knn(train, test) -> float:
    """kNN (k=1) on the mean colour of each image: 100% when the labels agree across splits."""
    def feats(ds):
        return (np.stack([np.asarray(ds[i][0], np.float32).mean((0, 1)) + 1.0
                          for i in range(len(ds))]), ds.labels)

    (x, y), (q, qy) = feats(train), feats(test)
    return knn_classify(x, y, q, qy, ks=(1,), weightings=("uniform",))[0].top1


@pytest.mark.parametrize("split", ["test", "val"])
def test_split_lacking_a_class_keeps_train_class_indices(tmp_path, split):
    for name, colour in COLOURS.items():
        _write(tmp_path / "train", name, 2, colour)
        if name != "bee":  # the evaluation split lacks one class of train/
            _write(tmp_path / split, name, 3, colour)
    train = build_dataset(str(tmp_path), "train")
    test = build_dataset(str(tmp_path), split)
    assert train.class_to_idx == {"ant": 0, "bee": 1, "cat": 2, "dog": 3}
    assert test.classes == train.classes and test.class_to_idx == train.class_to_idx
    names = [Path(p).parent.name for p, _ in test.samples]
    assert list(test.labels) == [train.class_to_idx[c] for c in names]
    assert list(test.labels) == [0, 0, 0, 2, 2, 2, 3, 3, 3]
    assert _mean_colour_knn(train, test) == 100.0  # per-split numbering gave 33.33


def test_class_only_in_test_split_is_an_error_naming_it(tmp_path):
    for name in ("ant", "bee"):
        _write(tmp_path / "train", name, 1, COLOURS[name])
    for name in ("ant", "cat", "dog"):
        _write(tmp_path / "test", name, 1, COLOURS[name])
    with pytest.raises(ValueError, match=r"not in .*train.*: cat, dog"):
        build_dataset(str(tmp_path), "test")


def test_symlinked_directories_are_walked_once(tmp_path):
    root = tmp_path / "imgs"
    _write(root, "ant", 5, COLOURS["ant"])
    _write(tmp_path / "elsewhere", "more", 3, COLOURS["bee"])
    _write(root, "bee", 2, COLOURS["bee"])
    os.symlink(root / "ant", root / "ant" / "loop")          # a loop onto its own class folder
    os.symlink(root, root / "bee" / "up")                     # a loop through the root
    os.symlink(tmp_path / "elsewhere" / "more", root / "bee" / "more")  # a plain linked folder
    os.symlink(root / "ant" / "0.png", root / "bee" / "alias.png")       # a linked file
    ds = image_folder(root)
    per_class = {c: int((ds.labels == i).sum()) for c, i in ds.class_to_idx.items()}
    # torchvision's os.walk(followlinks=True) multiplied these into hundreds of images
    assert per_class == {"ant": 5, "bee": 2 + 3 + 1}
    assert len(ds) == 11 and len({p for p, _ in ds.samples}) == 11


# 16-bit values, and round(v / 257) (clipping gave 255 for every value >= 255)
U16 = np.array([[0, 255, 256, 1000], [32768, 40000, 65280, 65535]], dtype=np.uint16)
U16_TO_8 = np.array([[0, 1, 1, 4], [128, 156, 254, 255]], dtype=np.uint8)


@pytest.mark.parametrize(("array", "mode", "expected"), [
    (U16, "I;16", U16_TO_8),
    (U16.astype(np.int32), "I", U16_TO_8),                      # 16-bit data read as "I"
    (np.array([[-100, 0, 100000]], np.int32), "I", [[0, 0, 255]]),  # beyond 16 bits: min-max
    (np.array([[0.0, 0.5, 0.2, 1.0]], np.float32), "F", [[0, 128, 51, 255]]),  # [0, 1]: x 255
    (np.array([[-1.0, 1.0, 3.0]], np.float32), "F", [[0, 128, 255]]),  # other ranges: min-max
])
def test_to_8bit_scales_high_bit_depth(array, mode, expected):
    from e2mc.data.image_folder import to_8bit

    img = Image.fromarray(array)
    assert img.mode == mode
    out = to_8bit(img)
    assert out.mode == "L"
    np.testing.assert_array_equal(np.asarray(out), np.asarray(expected, np.uint8))
    rgb = Image.new("RGB", (2, 2), (1, 2, 3))
    assert to_8bit(rgb) is rgb


def test_to_8bit_refuses_non_finite_floats():
    from e2mc.data.image_folder import to_8bit

    with pytest.raises(ValueError, match="non-finite"):
        to_8bit(Image.fromarray(np.array([[0.0, np.nan]], np.float32)))


def test_16bit_png_through_the_image_folder_loader(tmp_path):
    (tmp_path / "a").mkdir()
    Image.fromarray(U16).save(tmp_path / "a" / "x.png")
    assert Image.open(tmp_path / "a" / "x.png").mode == "I;16"
    image, label = image_folder(tmp_path)[0]
    assert image.mode == "L" and label == 0
    np.testing.assert_array_equal(np.asarray(image), U16_TO_8)


def test_16bit_pil_image_through_the_eval_transform():
    x = eval_transform(4, 1)(Image.fromarray(np.vstack([U16, U16])))  # 4x4, no resize
    (mean,), (std,) = default_normalization(1)
    expected = (np.vstack([U16_TO_8, U16_TO_8]) / 255.0 - mean) / std
    np.testing.assert_allclose(x[0].numpy(), expected, atol=1e-6)


@pytest.mark.parametrize("channels", [1, 3])
def test_16bit_png_through_the_fast_pipeline(tmp_path, channels):
    path = tmp_path / "x.png"
    Image.fromarray(np.full((16, 16), 40000, np.uint16)).save(path)
    fast = FastViews(build_views("vicreg", 8, channels), mode="device", draft=False)
    crops, _ = fast(path)
    for crop in crops:
        assert crop.shape == (channels, 8, 8)
        assert crop.unique().tolist() == [156]  # round(40000 / 257); clipping gave 255


def test_eval_refuses_a_test_set_whose_classes_differ(tmp_path, capsys):
    """--test-data from another image folder: its labels number its own classes, so probes
    trained on --data would be scored against other classes; refused (exit 2, one line)."""
    from e2mc.cli import main
    from e2mc.demo import BASE_CHECKPOINT as ckpt

    for root, names in (("a", ["ant", "bee"]), ("b", ["ant", "cat"])):
        for split in ("train", "test"):
            for name in names:
                _write(tmp_path / root / split, name, 2, COLOURS[name])
    code = main(["eval", str(ckpt), "--data", str(tmp_path / "a"), "--test-data",
                 str(tmp_path / "b"), "--protocol", "knn", "--image-size", "8", "--no-cache",
                 "--out", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "has other classes than --data" in err and "cat" in err
    assert not (tmp_path / "out" / "results.json").exists()
