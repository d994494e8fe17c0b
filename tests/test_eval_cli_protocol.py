"""``e2mc eval`` with a learning-rate grid chosen on validation and SimCLR-style subset files;
the SVM's cost chosen on training data only."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from e2mc.cli import main
from e2mc.demo import BASE_CHECKPOINT
from e2mc.evaluation.svm import svm_transfer


def image_folder(root: Path, per_class: dict[str, int], seed: int) -> None:
    rng = np.random.default_rng(seed)
    for split, n in per_class.items():
        for c in range(3):
            d = root / split / f"class{c}"
            d.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                img = rng.integers(0, 60, (28, 28)) + 60 * c
                Image.fromarray(img.astype(np.uint8)).save(d / f"{split}_{c}_{i}.png")


def test_eval_lr_grid_and_subset_file(tmp_path, capsys):
    data = tmp_path / "folder"
    image_folder(data, {"train": 10, "test": 4}, seed=0)
    listed = [f"train_{c}_{i}.png" for c in range(3) for i in (1, 4, 7, 8)]
    (tmp_path / "half.txt").write_text("\n".join(listed) + "\n")
    out = tmp_path / "run"
    code = main(["eval", str(BASE_CHECKPOINT), "--data", str(data), "--in-channels", "1",
                 "--image-size", "28", "--device", "cpu", "--quiet", "--no-cache",
                 "--protocol", "linear,knn", "--fractions", "0.5,1", "--seeds", "0,1",
                 "--epochs", "2", "--knn-k", "3", "--subset-file", f"0.5={tmp_path / 'half.txt'}",
                 "--lr-grid", "x0.1,x1,x10", "--wd-grid", "1:0,0.01", "--val-fraction", "0.25",
                 "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "chosen on validation" in printed
    record = json.loads((out / "results.json").read_text())
    half = [e for e in record["entries"] if e["column"] == "linear 50%"]
    full = [e for e in record["entries"] if e["column"] == "linear 100%"]
    assert [e["seed"] for e in half] == [0, 1] and len(full) == 2
    preset_lr = record["settings"]["linear"]["50%"]["lr"]
    assert record["settings"]["linear"]["50%"]["lr_grid"] == pytest.approx(
        [0.1 * preset_lr, preset_lr, 10 * preset_lr])
    assert record["settings"]["linear"]["50%"]["subset"]["size"] == 12
    # the file, not the label seed, decides the subset: one identity at both seeds
    assert len({e["subset"].pop("sha256") for e in half}) == 1
    for e in half:
        assert e["subset"] == {"kind": "file", "size": 12}
        sel = e["selection"]
        assert len(sel["grid"]) == 3 and sel["train_size"] + sel["validation_size"] == 12
        assert e["config"]["lr"] == sel["chosen"]["lr"]
        assert f"seed {e['seed']}: lr {e['config']['lr']:g}" in printed
    for e in full:
        assert e["subset"]["kind"] == "stratified" and len(e["selection"]["grid"]) == 6
    assert {e["column"] for e in record["entries"]} >= {"knn k=3", "knn k=3 uniform"}
    assert set(record["timings_s"]) == {"features", "linear", "knn"}


def test_eval_rejects_bad_grid_and_subset_arguments(tmp_path, capsys):
    common = ["eval", str(BASE_CHECKPOINT), "--data", "builtin", "--in-channels", "1",
              "--image-size", "28", "--device", "cpu", "--quiet", "--no-cache",
              "--out", str(tmp_path / "r")]
    assert main([*common, "--fractions", "0.1", "--lr-grid", "0.5:0.1,1"]) == 2
    assert "not in --fractions" in capsys.readouterr().err
    assert main([*common, "--fractions", "0.1", "--lr-grid=-1,1"]) == 2
    assert "must be > 0" in capsys.readouterr().err
    (tmp_path / "list.txt").write_text("a.png\n")
    assert main([*common, "--fractions", "0.1", "--subset-file",
                 f"0.1={tmp_path / 'list.txt'}"]) == 2
    assert "file lists need an image-folder" in capsys.readouterr().err


def test_svm_cost_is_chosen_on_training_data_only(monkeypatch):
    from sklearn.model_selection import GridSearchCV

    rng = np.random.default_rng(0)
    x = rng.normal(size=(90, 5)).astype(np.float32)
    y = (x[:, 0] + 0.8 * rng.normal(size=90) > 0).astype(int) + (x[:, 1] > 0.5)
    tr, te = slice(0, 60), slice(60, 90)
    seen = []
    fit = GridSearchCV.fit

    def spy(self, features, target, **kw):
        seen.append(len(features))
        return fit(self, features, target, **kw)

    monkeypatch.setattr(GridSearchCV, "fit", spy)
    costs = (1e-3, 0.1, 10.0)
    a = svm_transfer(x[tr], y[tr], x[te], y[te], costs=costs, folds=3)
    b = svm_transfer(x[tr], y[tr], x[te], rng.permutation(y[te]), costs=costs, folds=3)
    assert set(seen) == {60}  # every cross-validated search saw the 60 training rows only
    assert a.costs == b.costs and np.array_equal(a.scores, b.scores)
    assert a.accuracy != b.accuracy  # the test labels only enter the reported numbers
