"""Run directories, the comparison table, and both commands through the real entry point."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import e2mc
from e2mc.artifacts import EvalDir
from e2mc.evaluation.results import compare_evaluations, comparison_markdown, mean_se
from e2mc.evaluation.runner import EvalOptions, run_evaluation

SRC = str(Path(e2mc.__file__).resolve().parents[1])


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "e2mc", *args], capture_output=True, text=True,
                          env=env, timeout=300)


def data(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 3
    return TensorDataset(torch.randn(n, 4, generator=g) + 2 * nn.functional.one_hot(y, 4)[:, :4],
                         y)


def tiny_run(tmp_path: Path, name: str, model_seed: int, noise: float) -> Path:
    torch.manual_seed(model_seed)
    backbone = nn.Sequential(nn.Linear(4, 6), nn.Dropout(0.5))
    with torch.no_grad():
        backbone[0].weight.add_(noise * torch.randn_like(backbone[0].weight))
    opts = EvalOptions(protocols=("linear", "knn", "svm"), fractions=(0.5, 1.0), seeds=(0, 1),
                       linear_overrides={"epochs": 3, "batch_size": 32}, knn_k=(5,),
                       svm_costs=(0.1, 1.0), progress=False)
    run_evaluation(backbone, 6, data(60, 0), data(45, 1), tmp_path / name, opts,
                   data_id="toy", extra_record={"checkpoint": name})
    return tmp_path / name


def test_run_directory_contents(tmp_path):
    run = tiny_run(tmp_path, "a", 0, 0.0)
    record = json.loads((run / "results.json").read_text())
    cols = {e["column"] for e in record["entries"]}
    assert cols == {"linear 50%", "linear 100%", "knn k=5", "knn k=5 uniform", "svm"}
    assert record["seeds"] == [0, 1] and record["reported_epoch"] == "last"
    assert record["settings"]["linear"]["50%"]["epochs"] == 3
    lin = [e for e in record["entries"] if e["column"] == "linear 50%"]
    assert [e["seed"] for e in lin] == [0, 1] and lin[0]["primary"] == "top1_last"
    for e in lin:
        with np.load(run / e["predictions"]) as f:
            acc = 100 * np.mean(f["predictions"] == f["labels"])
        assert acc == pytest.approx(e["metrics"]["top1_last"])
    summary = record["summary"]["linear 50%"]["top1_last"]
    mean, se = mean_se([e["metrics"]["top1_last"] for e in lin])
    assert summary == {"mean": pytest.approx(mean), "se": pytest.approx(se), "n": 2}


def test_compare_marks_and_rejects_mismatched_test_sets(tmp_path):
    a = tiny_run(tmp_path, "a", 0, 0.0)
    b = tiny_run(tmp_path, "b", 1, 3.0)
    comp = compare_evaluations([str(a), str(b)], n_resamples=200)
    assert comp.runs == ["a", "b"] and "linear 50%" in comp.columns
    assert comp.cells["a"]["linear 50%"][2] == ""  # the reference is never marked
    tests = [t for t in comp.tests if t["column"] == "linear 50%"]
    assert [t["seed"] for t in tests] == [0, 1]
    for t in tests:
        assert 0 < t["mcnemar_p"] <= 1 and 0 < t["permutation_p"] <= 1
    # The cell's mark is its verdict's: one permutation test on each image's difference
    # averaged over the two matched seeds (the reference formula), doubled at p < 0.01.
    from e2mc.evaluation.pairing import matched_correctness
    from e2mc.evaluation.significance import pooled_permutation_test

    verdicts = {v.column: v for v in comp.verdicts}
    assert set(verdicts) == {t["column"] for t in comp.tests}  # one per tested column
    v50 = verdicts["linear 50%"]
    diff, p = pooled_permutation_test(matched_correctness(a, b, "linear 50%"), 200, 0)
    assert v50.seeds == 2 and v50.run == "b" and v50.p == p and 0 < p <= 1
    assert v50.difference == pytest.approx(100 * diff)
    assert v50.difference == pytest.approx(np.mean([t["difference"] for t in tests]))
    times = 2 if p < 0.01 else 1 if p < 0.05 else 0
    assert comp.cells["b"]["linear 50%"][2] == ("▲" if diff > 0 else "▼") * times
    assert any(m for run in comp.cells.values() for (_, _, m) in run.values())  # b is worse
    text = comparison_markdown(comp)
    assert f"- b, linear 50%: {v50.word} a" in text and f"p {p:.2g};" in text
    # Runs on different test labels cannot be paired.
    record = json.loads((b / "results.json").read_text())
    entry = record["entries"][0]
    with np.load(b / entry["predictions"]) as f:
        np.savez(b / entry["predictions"], predictions=f["predictions"],
                 labels=(f["labels"] + 1) % 3)
    EvalDir(b).write(record)  # results.json describes the edited file (its digest)
    with pytest.raises(ValueError, match="different test sets"):
        compare_evaluations([str(a), str(b)], n_resamples=50)


@pytest.mark.slow  # integration: a few seconds on 2 cores
def test_compare_command_writes_markdown_and_csv(tmp_path):
    a = tiny_run(tmp_path, "a", 0, 0.0)
    b = tiny_run(tmp_path, "b", 1, 3.0)
    out = tmp_path / "cmp"  # a directory: cmp/comparison.md, .csv, ...
    proc = cli("compare", str(a), str(b), "--names", "base,e2mc", "--out", str(out),
               "--resamples", "200")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-2].startswith("e2mc against base: ")  # the answer
    assert "| base |" not in proc.stdout  # the table: in the files
    md = (out / "comparison.md").read_text().splitlines()
    assert md[0].startswith("Verdict against base")  # the verdicts first, then the table
    assert "| run | linear 50% | linear 100% | knn k=5 | knn k=5 uniform | svm |" in md
    assert "| run | column | seed |" not in proc.stdout  # per-seed tests: in the files only
    assert any(line.startswith("| run | column | seed |") for line in md)
    rows = list(csv.DictReader((out / "comparison.csv").open()))
    assert {r["run"] for r in rows} == {"base", "e2mc"} and len(rows) == 10
    comp = compare_evaluations([str(a), str(b)], names=["base", "e2mc"], n_resamples=200)
    assert [(r["marker"], r["verdict"], r["p"]) for r in rows if r["run"] == "e2mc"] == [
        (v.mark, v.direction, f"{v.p:.4g}") for v in comp.verdicts]  # each cell's verdict
    tests = list(csv.DictReader((out / "comparison_tests.csv").open()))
    assert len(tests) == 2 + 2 + 2 + 1  # two seeds x two linear columns, 2 kNN, SVM
    bad = cli("compare", str(tmp_path / "missing"))
    assert bad.returncode == 2 and "no results.json" in bad.stderr


@pytest.mark.slow  # integration: a few seconds on 2 cores
def test_eval_command_end_to_end(tmp_path):
    pytest.importorskip("e2mc.checkpoints")
    from e2mc.models import build_backbone

    torch.manual_seed(0)
    backbone, _ = build_backbone("resnet18", small_images=True, in_channels=1)
    ckpt = tmp_path / "backbone.pt"
    torch.save(backbone.state_dict(), ckpt)
    rng = np.random.default_rng(0)
    y_tr, y_te = np.arange(30) % 3, np.arange(15) % 3
    images = {"x_train": rng.integers(0, 60, (30, 12, 12)) + 60 * y_tr[:, None, None],
              "x_test": rng.integers(0, 60, (15, 12, 12)) + 60 * y_te[:, None, None]}
    npz = tmp_path / "toy.npz"
    np.savez(npz, x_train=images["x_train"].astype(np.uint8), y_train=y_tr,
             x_test=images["x_test"].astype(np.uint8), y_test=y_te)
    common = [str(ckpt), "--data", str(npz), "--arch", "resnet18", "--small-images",
              "--in-channels", "1", "--image-size", "12", "--device", "cpu", "--quiet",
              "--cache", str(tmp_path / "cache"), "--knn-k", "3"]
    out = tmp_path / "run"
    proc = cli("eval", *common, "--protocol", "linear,knn", "--fractions", "0.5,1",
               "--seeds", "0,1", "--epochs", "2", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    record = json.loads((out / "results.json").read_text())
    assert record["feature_cache_hit"] == {"train": False, "test": False}
    assert record["num_train"] == 30 and record["feature_dim"] == 512
    assert {e["column"] for e in record["entries"]} == {"linear 50%", "linear 100%", "knn k=3",
                                                       "knn k=3 uniform"}
    assert record["command"][-1] == str(out) and record["checkpoint"] == str(ckpt)
    assert len(list((out / "predictions").glob("*.npz"))) == 6
    # Same checkpoint and data again: the cached features are reused.
    again = cli("eval", *common, "--protocol", "knn", "--seeds", "0", "--out", str(out) + "2")
    assert again.returncode == 0, again.stderr
    rec2 = json.loads((Path(str(out) + "2") / "results.json").read_text())
    assert rec2["feature_cache_hit"] == {"train": True, "test": True}
    bad = cli("eval", *common, "--protocol", "linear,nope", "--out", str(out) + "3")
    assert bad.returncode == 2 and "unknown protocol" in bad.stderr
