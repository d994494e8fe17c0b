"""Each new method through the real CLI on the shipped Fashion-MNIST subset: 3 steps of
``e2mc continue`` with E2MC from a checkpoint of the method, and for the methods with an EMA
teacher a run stopped and resumed, and for every method a run killed with SIGKILL and resumed,
that ends bit-identical to an uninterrupted one (teacher, DINO's centre and the optimizer state
included)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

import e2mc
from e2mc.artifacts import RunDir
from helpers import assert_same_training_state, killed_and_resumed, training_records

SRC = str(Path(e2mc.__file__).resolve().parents[1])
ENV = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""),
       "OMP_NUM_THREADS": "1"}

SMALL = {"barlowtwins": "{projector: 32-32}",
         "simclr": "{hidden_dim: 32, dim: 16}",
         "byol": "{hidden_dim: 32, dim: 16}",
         "mocov3": "{dim: 16, mlp_dim: 32}",
         "dino": "{out_dim: 40, hidden_dim: 32, bottleneck_dim: 16}"}
HPARAMS = {"barlowtwins": {"projector": "32-32"}, "simclr": {"hidden_dim": 32, "dim": 16},
           "byol": {"hidden_dim": 32, "dim": 16}, "mocov3": {"dim": 16, "mlp_dim": 32},
           "dino": {"out_dim": 40, "hidden_dim": 32, "bottleneck_dim": 16}}
TINY = ["--set", "data.limit=24", "--set", "training.batch_size=8", "--set",
        "data.num_workers=0", "--set", "training.progress=false", "--set",
        "training.log_every=1", "--set", "training.device=cpu", "--set",
        "training.keep_epoch_checkpoints=false", "--set", "training.cpu_threads=1"]


def _cli(*args: str) -> int:
    from e2mc.cli import main

    return main(list(args))


def _base(tmp_path: Path, name: str) -> Path:
    from e2mc.checkpoints import save_checkpoint
    from e2mc.config import load_config
    from e2mc.methods import build_method

    cfg = load_config(f"fmnist-{name}-continued")
    torch.manual_seed(1)
    model = build_method(name, backbone=cfg.model.backbone, in_channels=1, **HPARAMS[name])
    path = tmp_path / f"{name}_base.pt"
    save_checkpoint(path, model, epoch=3)
    return path


@pytest.mark.slow  # a few seconds per method
@pytest.mark.parametrize("name", list(SMALL))
def test_three_steps_of_continue_with_e2mc(tmp_path: Path, name: str) -> None:
    base, run = _base(tmp_path, name), tmp_path / "run"
    rc = _cli("continue", "--config", f"fmnist-{name}-e2mc", "--out", str(run),
              "--from", str(base), "--epochs", "1", *TINY, "--set", f"method.params={SMALL[name]}")
    assert rc == 0
    metrics = RunDir(run).read_metrics()
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert all(np.isfinite(m["loss"]) and "addon/entropy" in m for m in metrics)
    for m in metrics:
        assert m["loss"] == pytest.approx(m["base/loss"] + m["addon/loss"], rel=1e-5, abs=1e-6)
    ckpt = torch.load(run / "checkpoint.pt", weights_only=True)
    assert (ckpt["method"], ckpt["epoch"], ckpt["step"]) == (name, 4, 3)
    start = torch.load(base, weights_only=True)["model"]
    changed = {k for k, v in ckpt["model"].items()
               if v.is_floating_point() and not torch.equal(v, start[k])}
    assert any(k.startswith("backbone.") for k in changed)
    if "teacher_initialized" in start:  # the teacher was set from the student and followed it
        assert bool(ckpt["model"]["teacher_initialized"])
        assert any(k.startswith("teacher.backbone.") for k in changed)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["byol", "mocov3", "dino"])
def test_stopped_and_resumed_run_is_bit_identical(tmp_path: Path, name: str) -> None:
    base = _base(tmp_path, name)
    args = ["continue", "--config", f"fmnist-{name}-e2mc", "--from", str(base),
            "--epochs", "2", *TINY, "--set", f"method.params={SMALL[name]}"]
    assert _cli(*args, "--out", str(tmp_path / "whole")) == 0
    parted = tmp_path / "parted"
    assert _cli(*args, "--out", str(parted), "--set", "training.max_steps=4") == 0
    assert torch.load(parted / "checkpoint.pt", weights_only=True)["step"] == 4
    assert _cli(*args, "--out", str(parted)) == 0
    a = torch.load(tmp_path / "whole" / "checkpoint.pt", weights_only=True)
    b = torch.load(parted / "checkpoint.pt", weights_only=True)
    assert (a["step"], b["step"]) == (6, 6)
    assert any(k.startswith("teacher.") for k in a["model"])
    assert_same_training_state(a, b)
    assert [m["loss"] for m in training_records(tmp_path / "whole")] == \
        [m["loss"] for m in training_records(parted)]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SMALL))
def test_killed_and_resumed_is_bit_identical(tmp_path: Path, name: str) -> None:
    """kill -9 in the middle of a run of each method (a checkpoint every step), then the same
    command: every weight (the EMA teacher's and DINO's centre included) and the optimizer state
    end as in an uninterrupted run, and each step is logged once."""
    base = _base(tmp_path, name)
    args = ["continue", "--config", f"fmnist-{name}-e2mc", "--from", str(base),
            "--epochs", "2", *TINY, "--set", f"method.params={SMALL[name]}",
            "--set", "training.checkpoint_every_steps=1"]
    a, b, killed = killed_and_resumed(args, tmp_path, ENV)
    if name in ("byol", "mocov3", "dino"):
        assert any(key.startswith("teacher.") for key in a["model"])
    assert_same_training_state(a, b)
    assert [m["step"] for m in training_records(killed)] == list(range(1, 7))
