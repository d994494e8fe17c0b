"""The one path from a checkpoint to an evaluation directory
(:func:`e2mc.evaluation.workflow.evaluate_checkpoint`) and the one "train unless done"
(:func:`e2mc.training.run.run_training` with ``done_marker``): what they reuse, and what they
refuse to."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tests.helpers import TINY_RUN, tiny_base

from e2mc.artifacts import EvalDir, RunDir
from e2mc.config import load_config
from e2mc.evaluation.runner import EvalOptions
from e2mc.evaluation.workflow import EvalData, evaluate_checkpoint
from e2mc.training.run import run_training

OPTIONS = EvalOptions(protocols=("knn",), fractions=(1.0,), seeds=(0,), knn_k=(5,),
                      knn_weightings=("weighted",), progress=False)


def _predictions(out: Path) -> list[str]:
    """The prediction files results.json names (new ones for every evaluation written)."""
    return [e["predictions"] for e in json.loads(EvalDir(out).results.read_text())["entries"]]


def test_reuse_reads_back_only_the_same_checkpoint_data_and_options(tmp_path: Path) -> None:
    checkpoint, data = tiny_base(tmp_path)
    out = tmp_path / "eval"
    first = evaluate_checkpoint(checkpoint, out, EvalData(str(data)), OPTIONS, reuse=True)
    written = _predictions(out)
    again = evaluate_checkpoint(checkpoint, out, EvalData(str(data)), OPTIONS, reuse=True)
    assert again.values("knn k=5") == first.values("knn k=5")
    assert _predictions(out) == written  # read back: nothing written
    # other options, other data, or other checkpoint bytes under the same name: evaluated anew
    other = evaluate_checkpoint(checkpoint, out, EvalData(str(data)),
                                EvalOptions(**{**OPTIONS.__dict__, "knn_k": (3,)}), reuse=True)
    assert other.columns() == ["knn k=3"]
    limited = evaluate_checkpoint(checkpoint, out, EvalData(str(data), test_limit=10), OPTIONS,
                                  reuse=True)
    assert limited.info["data"].endswith("train:None|test:10")
    assert len(limited.predictions(limited.column("knn k=5")[0])[0]) == 10
    stamp, written = limited.info["stamp"], _predictions(out)
    import torch

    state = torch.load(checkpoint, weights_only=False)
    first_key = next(iter(state["model"]))
    state["model"][first_key] = state["model"][first_key] + 1.0
    torch.save(state, checkpoint)
    changed = evaluate_checkpoint(checkpoint, out, EvalData(str(data), test_limit=10), OPTIONS,
                                  reuse=True)
    assert changed.info["stamp"]["checkpoint_sha256"] != stamp["checkpoint_sha256"]
    assert _predictions(out) != written


def test_without_reuse_the_directory_is_evaluated_anew(tmp_path: Path) -> None:
    checkpoint, data = tiny_base(tmp_path)
    out = tmp_path / "eval"
    first = evaluate_checkpoint(checkpoint, out, EvalData(str(data)), OPTIONS)
    written = _predictions(out)
    second = evaluate_checkpoint(checkpoint, out, EvalData(str(data)), OPTIONS)
    assert _predictions(out) != written
    assert second.values("knn k=5") == first.values("knn k=5")


def test_a_done_marker_skips_a_done_run_and_refuses_another_config(tmp_path: Path) -> None:
    checkpoint, data = tiny_base(tmp_path)
    cfg = load_config("fmnist-vicreg-continued", [*TINY_RUN, f"init.checkpoint={checkpoint}",
                                          f"data.dataset={data}", "training.max_steps=2"])
    run = tmp_path / "run"
    trained = run_training(cfg, run, done_marker=True)
    assert (trained.trained, trained.finished, trained.step) == (True, True, 2)
    assert RunDir(run).is_done()
    before = RunDir(run).checkpoint.read_bytes()
    again = run_training(cfg, run, done_marker=True)
    assert (again.trained, again.finished, again.step) == (False, True, 2)
    assert RunDir(run).checkpoint.read_bytes() == before
    other = load_config("fmnist-vicreg-continued", [*TINY_RUN, f"init.checkpoint={checkpoint}",
                                            f"data.dataset={data}", "training.max_steps=2",
                                            "optim.base_lr=0.5"])
    with pytest.raises(ValueError, match="optim.base_lr"):
        run_training(other, run, done_marker=True)
    # a copy whose done marker is removed resumes at its end and is marked done again
    shutil.copytree(run, tmp_path / "copy")
    RunDir(tmp_path / "copy").done.unlink()
    resumed = run_training(cfg, tmp_path / "copy", done_marker=True)
    assert (resumed.finished, resumed.step) == (True, 2)
    assert RunDir(tmp_path / "copy").is_done()
