"""Pre-emption: signal parsing, the handler, SLURM requeue, a signal during a checkpoint write,
and a real run signalled mid-epoch (workers included) that exits 75 and resumes bit-identically."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import e2mc
from e2mc.checkpoints.io import atomic_save
from e2mc.config import resolve_signals
from e2mc.training.preemption import (
    PREEMPTED_EXIT_CODE,
    PreemptionHandler,
    is_preemption,
    requeue_slurm_job,
)
from helpers import training_records

SRC = str(Path(e2mc.__file__).resolve().parents[1])
ENV = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""),
       "OMP_NUM_THREADS": "1"}


def test_resolve_signals() -> None:
    assert resolve_signals(["SIGTERM", "SIGUSR1"]) == (signal.SIGTERM, signal.SIGUSR1)
    assert resolve_signals(["usr2", " term", "SIGTERM"]) == (signal.SIGUSR2, signal.SIGTERM)
    assert resolve_signals([str(int(signal.SIGUSR1))]) == (signal.SIGUSR1,)
    assert resolve_signals([]) == () and resolve_signals(["none"]) == ()
    assert resolve_signals(None) == ()
    with pytest.raises(ValueError, match="unknown signal 'SIGFOO'"):
        resolve_signals(["SIGFOO"])
    with pytest.raises(ValueError, match="SIGKILL cannot be caught"):
        resolve_signals(["SIGKILL"])


def test_handler_records_the_signal_and_restores_the_previous_handlers() -> None:
    before = signal.getsignal(signal.SIGUSR1)
    with PreemptionHandler(["SIGUSR1"]) as handler:
        assert not handler.requested and not handler.should_stop()
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.01)
        assert handler.received == signal.SIGUSR1 and handler.should_stop()
    assert signal.getsignal(signal.SIGUSR1) == before
    assert is_preemption("pre-empted by SIGUSR1 after step 3") and not is_preemption(None)
    assert not is_preemption("training.max_steps=4")


def test_requeue_only_under_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = tmp_path / "calls.txt"
    fake = tmp_path / "bin" / "scontrol"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    assert requeue_slurm_job({}) is False and not calls.exists()
    assert requeue_slurm_job({"SLURM_JOB_ID": "4242"}) is True
    assert calls.read_text().split() == ["requeue", "4242"]
    calls.unlink()  # a task of an array: its own id, not the array's (which would requeue all)
    assert requeue_slurm_job({"SLURM_JOB_ID": "13", "SLURM_ARRAY_JOB_ID": "12",
                              "SLURM_ARRAY_TASK_ID": "0"}) is True
    assert calls.read_text().split() == ["requeue", "12_0"]
    fake.write_text("#!/bin/sh\necho 'Invalid job id' >&2\nexit 1\n")
    assert requeue_slurm_job({"SLURM_JOB_ID": "1"}) is False


class _SignalMidWrite:
    """A file-like payload whose pickling sends a signal to this process half-way."""

    def __init__(self, sig: signal.Signals) -> None:
        self.sig = sig

    def __reduce__(self):
        os.kill(os.getpid(), self.sig)
        time.sleep(0.01)  # the handler runs here, in the middle of torch.save
        return (dict, ())


def test_signal_during_a_checkpoint_write_is_deferred(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.pt"
    atomic_save({"step": 1, "w": torch.ones(1000)}, path)
    with PreemptionHandler(["SIGTERM"]) as handler:
        atomic_save({"step": 2, "w": torch.zeros(1000), "x": _SignalMidWrite(signal.SIGTERM)},
                    path)
        assert handler.received == signal.SIGTERM
    assert torch.load(path, weights_only=False)["step"] == 2  # the write was finished


def test_kill_during_a_checkpoint_write_keeps_the_previous_one(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.pt"
    atomic_save({"step": 1, "w": torch.arange(10)}, path)
    script = (
        "import time, torch\n"
        "from e2mc.files import atomic_write\n"
        "def slow(f):\n"
        "    f.write(b'x' * 1000); f.flush(); print('writing', flush=True); time.sleep(60)\n"
        f"atomic_write({str(path)!r}, slow)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], env=ENV, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "writing"
    proc.send_signal(signal.SIGTERM)  # no handler in that process: SIGTERM kills it
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGTERM
    ckpt = torch.load(path, weights_only=True)
    assert ckpt["step"] == 1 and torch.equal(ckpt["w"], torch.arange(10))


# ----------------------------------------------------------------------------- a real run
ARGS = ["--config", "fmnist-vicreg-pretrain", "--epochs", "3",
        "--set", "model.backbone=cnn5_small", "--set", "model.small_images=false",
        "--set", "model.in_channels=1", "--set", "data.image_size=32",
        "--set", "data.channels=1", "--set", "training.batch_size=8",
        "--set", "training.log_every=1", "--set", "training.progress=false",
        "--set", "training.precision=fp32", "--set", "data.num_workers=2",
        "--set", "training.device=cpu", "--set", "training.keep_epoch_checkpoints=false",
        "--set", "method.params={projector: 32-32}"]


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("data") / "images.npz"
    np.savez(path, x_train=rng.integers(0, 256, (32, 32, 32), dtype=np.uint8),
             y_train=rng.integers(0, 10, 32))
    return path


@pytest.fixture(scope="module")
def whole(images: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted run."""
    from e2mc.cli import main

    run = tmp_path_factory.mktemp("whole") / "run"
    assert main(["pretrain", *ARGS, "--data", str(images), "--out", str(run)]) == 0
    return run


@pytest.mark.slow  # two short runs (one a subprocess): about 20 s on an idle 2-core machine
@pytest.mark.parametrize("sig, preempt_signals, seed", [
    (signal.SIGUSR1, ["--set", "training.preempt_signals=SIGUSR1"], 0),
    (signal.SIGHUP, [], 31),  # a closed terminal, with the default signals, at a random step
])
def test_signal_mid_epoch_checkpoints_exits_75_and_resumes_exactly(
        tmp_path: Path, images: Path, whole: Path, sig: signal.Signals,
        preempt_signals: list[str], seed: int) -> None:
    import random

    from e2mc.cli import main

    args = ["pretrain", *ARGS, "--data", str(images)]
    after = random.Random(seed).randint(1, 8) if seed else 2  # steps before the signal
    run = tmp_path / "preempted"
    env = {k: v for k, v in ENV.items() if k != "SLURM_JOB_ID"}
    proc = subprocess.Popen([sys.executable, "-m", "e2mc", *args, "--out", str(run),
                             *preempt_signals],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        if (run / "metrics.jsonl").exists() and len(training_records(run)) >= after:
            break
        time.sleep(0.02)
    os.killpg(proc.pid, sig)  # as SLURM (or a closing terminal) does: loader workers too
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == PREEMPTED_EXIT_CODE, err
    assert f"pre-empted by {sig.name}" in err and "Traceback" not in err
    ckpt = torch.load(run / "checkpoint.pt", weights_only=True)
    assert after <= ckpt["step"] < 12, "stopped at a step boundary before the end"
    assert len(training_records(run)) == ckpt["step"]
    assert main([*args, "--out", str(run)]) == 0  # the same command resumes
    a = torch.load(whole / "checkpoint.pt", weights_only=True)
    b = torch.load(run / "checkpoint.pt", weights_only=True)
    assert (a["step"], b["step"]) == (12, 12)
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
    losses = [[m["loss"] for m in training_records(r)] for r in (whole, run)]
    assert losses[0] == losses[1]


def test_only_a_time_limit_signal_requeues() -> None:
    """The signal table (SIGNAL_TABLE): SIGUSR1 / submitit's SIGUSR2 (time limit ahead)
    requeue after the checkpoint; SIGTERM (scancel, or SLURM's own requeue) and SIGHUP (a
    closed terminal) checkpoint and stop without one; SIGHUP is a pre-emption signal by
    default."""
    from e2mc.config import RunConfig
    from e2mc.training.preemption import DEFAULT_SIGNALS, SIGNAL_TABLE, wants_requeue

    assert [wants_requeue(s) for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM,
                                       signal.SIGHUP)] == [True, True, False, False]
    assert "SIGHUP" in DEFAULT_SIGNALS and signal.SIGHUP in resolve_signals(
        RunConfig().training.preempt_signals)
    assert [row[0] for row in SIGNAL_TABLE] == ["SIGUSR2", "SIGUSR1", "SIGTERM", "SIGHUP"]
