"""Runs that say how far they got and have one writer (issue 22): the run-directory lock,
``training.max_steps`` on re-runs, the keep-best metric on resume, a too-small validation
split."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from e2mc.artifacts import RunDir, writer_lock
from e2mc.cli import main
from helpers import TINY_RUN, child_processes

CHILDREN = child_processes()


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "d.npz"
    rng = np.random.default_rng(0)
    np.savez(path, x_train=rng.integers(0, 256, (40, 16, 16), dtype=np.uint8),
             y_train=np.arange(40) % 4)
    return path


def _pretrain(data: Path, run_dir: Path, *sets: str) -> int:
    """4 steps per epoch (32 training images of 40, batch 8, with the validation split)."""
    args = [a for item in [*TINY_RUN, "data.val_split=0.2", "monitor.probe_epochs=2",
                           "monitor.knn_k=3", *sets] for a in ("--set", item)]
    return main(["pretrain", "--config", "fmnist-vicreg-pretrain", "--data", str(data),
                 "--out", str(run_dir), *args])


def _step(run_dir: Path) -> int:
    return int(torch.load(RunDir(run_dir).checkpoint, weights_only=True)["step"])


def _hold_lock(root: Path, ready: Path, release: Path) -> None:
    with writer_lock(root):
        ready.touch()
        while not release.exists():
            time.sleep(0.01)


@pytest.mark.skipif(CHILDREN is None, reason="needs the forkserver start method (POSIX)")
def test_a_second_writer_is_refused_and_a_dead_ones_lock_taken_over(
        data: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    assert _pretrain(data, run, "training.max_steps=2") == 0
    before = (RunDir(run).checkpoint.read_bytes(), RunDir(run).metrics.read_text())
    capsys.readouterr()
    ready, release = tmp_path / "ready", tmp_path / "release"
    holder = CHILDREN.Process(target=_hold_lock, args=(run, ready, release))
    holder.start()
    while not ready.exists():
        assert holder.is_alive()
        time.sleep(0.01)
    try:
        assert _pretrain(data, run, "training.max_steps=4") == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "error:" in err
        assert f"being written by another process (pid {holder.pid} on" in err
        # nothing of the run was touched: checkpoint and metrics as the first writer left them
        assert (RunDir(run).checkpoint.read_bytes(), RunDir(run).metrics.read_text()) == before
    finally:
        release.touch()
        holder.join(10)
    # a writer killed while holding the lock: its lock file stays, the next run takes it over
    ready.unlink()
    release.unlink()
    holder = CHILDREN.Process(target=_hold_lock, args=(run, ready, release))
    holder.start()
    while not ready.exists():
        assert holder.is_alive()
        time.sleep(0.01)
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(10)
    assert (run / ".e2mc.lock").exists()
    assert _pretrain(data, run, "training.max_steps=4") == 0
    err = capsys.readouterr().err
    assert f"was left by a process that is gone (pid {holder.pid} on" in err
    assert _step(run) == 4 and not (run / ".e2mc.lock").exists()


def test_max_steps_means_the_same_step_on_every_rerun(data: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    for _ in range(3):  # stopped mid-epoch (step 3 of 4), then run again twice
        assert _pretrain(data, run, "training.max_steps=3") == 0
        assert _step(run) == 3
    steps = [r["step"] for r in RunDir(run).read_metrics() if "loss" in r]
    assert steps == [1, 2, 3]
    assert "no step to take" in capsys.readouterr().err
    # resuming with a max_steps below the checkpoint's step trains nothing either
    assert _pretrain(data, run, "training.max_steps=2") == 0
    assert _step(run) == 3
    assert "stopped (training.max_steps=2): epoch 0/1, step 3" in capsys.readouterr().err


def test_the_keep_best_metric_cannot_change_within_a_run(data: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    assert _pretrain(data, run, "training.max_steps=2", "monitor.keep_best=val/knn") == 0
    capsys.readouterr()
    assert _pretrain(data, run, "monitor.keep_best=val/rankme") == 2
    assert "monitor.keep_best: 'val/knn' -> 'val/rankme'" in capsys.readouterr().err
    main_args = ["training.max_steps=4", "monitor.keep_best=val/rankme"]
    # not even with --override-config: best.pt and its value were chosen by val/knn
    args = [a for item in [*TINY_RUN, "data.val_split=0.2", "monitor.probe_epochs=2",
                           "monitor.knn_k=3", *main_args] for a in ("--set", item)]
    assert main(["pretrain", "--config", "fmnist-vicreg-pretrain", "--data", str(data),
                 "--out", str(run), "--override-config", *args]) == 2
    assert _step(run) == 2


def test_a_validation_split_too_small_for_the_monitor_is_refused(
        data: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # 4 held-out images of 4 classes: one per class, so the probe halves cannot both hold one
    assert _pretrain(data, tmp_path / "run", "data.val_split=4") == 2
    err = capsys.readouterr().err
    assert "needs two images of every class" in err and err.count("\n") == 1
    assert _pretrain(data, tmp_path / "run8", "data.val_split=8", "training.max_steps=1") == 0
    assert "one image is 25 points of accuracy" in capsys.readouterr().err
