"""Shared by several test modules: a free loopback port for the 2-process gloo tests (one band
per pytest-xdist worker), and the overrides of a tiny training run (the package's five-layer
``cnn5_small`` on 16 px single-channel images: a step in about 10 ms on one core)."""

from __future__ import annotations

import os
import random
import socket

#: A continued or pretraining run in seconds on a CPU (``--set`` / ``load_config`` overrides).
TINY_RUN = ["model.backbone=cnn5_small", "model.in_channels=1", "data.image_size=16",
            "data.channels=1", "training.batch_size=8", "training.epochs=1",
            "training.log_every=1", "training.progress=false", "data.num_workers=0",
            "training.device=cpu", "training.cpu_threads=1",
            "training.keep_epoch_checkpoints=false", "method.params={projector: 32-32}"]


def free_port() -> int:
    """A free loopback port for a gloo rendezvous (rank 0 binds it a moment later). Below the
    kernel's ephemeral range (32768 up on Linux), so no socket another test opens in the
    meantime gets it, and in a band of 1500 ports per pytest-xdist worker (of 8), so that two
    workers never pick the same one."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    low = 20000 + (index % 8) * 1500
    for port in random.Random().sample(range(low, low + 1500), 1500):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port in {low}..{low + 1499}")


def tiny_base(root, n_test: int = 20):
    """``(checkpoint, data)`` in ``root``: 40 training and ``n_test`` test images of 16 px in
    four classes (``.npz``), and a fresh VICReg model of the :data:`TINY_RUN` architecture
    saved as a project checkpoint (seed 0), the start of tiny continued runs and searches."""
    import numpy as np
    import torch

    from e2mc.checkpoints import save_checkpoint
    from e2mc.methods import build_method

    rng = np.random.default_rng(0)
    data = root / "d.npz"
    np.savez(data, x_train=rng.integers(0, 256, (40, 16, 16), dtype=np.uint8),
             y_train=np.arange(40) % 4,
             x_test=rng.integers(0, 256, (n_test, 16, 16), dtype=np.uint8),
             y_test=np.arange(n_test) % 4)
    torch.manual_seed(0)
    ckpt = root / "base.pt"
    save_checkpoint(ckpt, build_method("vicreg", backbone="cnn5_small", in_channels=1,
                                       projector="32-32"))
    return ckpt, data


def other_weights(checkpoint, dest):
    """A copy of the project checkpoint ``checkpoint`` at ``dest`` with other weights: its
    first weight tensor negated (a scale would not do: the BatchNorm after a convolution
    undoes it). Returns ``dest``."""
    import torch

    state = torch.load(checkpoint, weights_only=False)
    key = next(k for k in state["model"] if k.endswith("weight"))
    state["model"][key] = -state["model"][key]
    dest.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, dest)
    return dest


def recorded_test_data(labels) -> dict:
    """The ``test_data`` identity an evaluation of test images with these ``labels`` records
    (:func:`e2mc.data.identity.data_identity`), for hand-written evaluation directories."""
    import numpy as np

    from e2mc.data.identity import data_identity

    class _Arrays:
        def __init__(self, labels) -> None:
            self.labels = np.asarray(labels, dtype=np.int64)
            self.images = np.zeros((len(self.labels), 1), dtype=np.uint8)

        def __len__(self) -> int:
            return len(self.labels)

    return data_identity(_Arrays(labels))


def recorded_data(labels) -> dict:
    """``test_data`` (:func:`recorded_test_data`) and ``train_data``, the same training data in
    every hand-written evaluation directory: what ``e2mc compare`` checks the rows share."""
    return {"test_data": recorded_test_data(labels), "train_data": recorded_test_data([0, 1])}


def training_records(run_dir) -> list[dict]:
    """The training records of a run's ``metrics.jsonl``, one per logged step (the records
    with a ``loss``; the validation monitor's and the collapse monitor's are left out)."""
    from e2mc.artifacts import RunDir

    return [m for m in RunDir(run_dir).read_metrics() if "loss" in m]


#: The child of :func:`kill_mid_run`: ``e2mc`` with ``MetricsLogger.log`` wrapped so that the
#: process SIGKILLs itself once it has logged ``records`` training steps (no race with a clock
#: that a loaded machine loses).
_KILL_AFTER_RECORDS = """
import os, signal, sys
from e2mc.training.logging import MetricsLogger
records, log = int(sys.argv[1]), MetricsLogger.log
def log_then_die(self, step, metrics):
    log(self, step, metrics)
    if "loss" in metrics and self._file is not None:
        self.logged = getattr(self, "logged", 0) + 1
        if self.logged >= records:
            os.kill(os.getpid(), signal.SIGKILL)
MetricsLogger.log = log_then_die
from e2mc.cli import main
sys.exit(main(sys.argv[2:]))
"""


def kill_mid_run(args: list[str], run_dir, env: dict, records: int = 2) -> None:
    """Run ``e2mc ARGS --out RUN_DIR`` in a child that SIGKILLs itself right after it logged
    its ``records``-th training step, as a machine that dies mid-run would."""
    import signal
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _KILL_AFTER_RECORDS, str(records), *args,
                           "--out", str(run_dir)], env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, timeout=1800)
    assert proc.returncode == -signal.SIGKILL, f"the run was not killed (exit {proc.returncode})"


def assert_same_training_state(a: dict, b: dict) -> None:
    """Two checkpoints hold the same model (every tensor, the same keys) and the same optimizer
    state (every tensor equal, every other entry equal): what an exact resume must give."""
    import torch

    assert a["model"].keys() == b["model"].keys()
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
    for sa, sb in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values(),
                      strict=True):
        assert sa.keys() == sb.keys()
        for k, v in sa.items():
            assert torch.equal(v, sb[k]) if isinstance(v, torch.Tensor) else v == sb[k], k


def killed_and_resumed(args: list[str], root, env: dict) -> tuple[dict, dict, object]:
    """``args`` (an ``e2mc continue`` of 6 steps with a checkpoint every step) run whole into
    ``root/whole``, and killed mid-run into ``root/killed`` (:func:`kill_mid_run`) then run
    again by the same command; returns both final checkpoints and the killed run's directory."""
    from pathlib import Path

    import torch

    from e2mc.cli import main

    whole, killed = Path(root) / "whole", Path(root) / "killed"
    assert main([*args, "--out", str(whole)]) == 0
    kill_mid_run(args, killed, env)
    assert 2 <= len(training_records(killed)) < 6, "the run should have been killed mid-way"
    assert main([*args, "--out", str(killed)]) == 0
    a = torch.load(whole / "checkpoint.pt", weights_only=True)
    b = torch.load(killed / "checkpoint.pt", weights_only=True)
    assert (a["step"], b["step"]) == (6, 6)
    return a, b, killed


def fake_slurm_commands(monkeypatch, folder) -> None:
    """``sbatch`` and ``srun`` on PATH that do nothing, for tests of the job scripts submitit
    would submit (made here, never submitted), on machines with or without SLURM."""
    import os
    from pathlib import Path

    bin_dir = Path(folder) / "fake-slurm-bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in ("sbatch", "srun"):
        (bin_dir / name).write_text("#!/bin/sh\nexit 1\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")


#: Modules the processes of :func:`child_processes` start with (imported once, in the server):
#: what a training run, a search and an evaluation import (scipy.stats and matplotlib are
#: seconds of a child's start otherwise).
CHILD_PRELOAD = ["torch", "numpy", "e2mc.cli", "e2mc.training.trainer", "e2mc.training.run",
                 "e2mc.commands.search", "e2mc.search", "e2mc.evaluation", "e2mc.diagnostics"]


def child_processes():
    """The multiprocessing context of the processes tests start: ``forkserver``, with torch and
    e2mc imported in the server. A child forked from the test process after a backward pass
    cannot run autograd on a machine with a GPU (torch: "Unable to handle autograd's threading
    in combination with fork-based multiprocessing"); the server never runs one, and a child
    forked from it starts in milliseconds. The target must be a module-level function (it is
    pickled by name). None where the platform has no forkserver."""
    import multiprocessing

    if "forkserver" not in multiprocessing.get_all_start_methods():
        return None
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(CHILD_PRELOAD)
    return ctx


def one_column_eval_dir(root, correct: int, n: int = 200, classes: int = 2,
                        seeds: tuple[int, ...] = (0, 1), column: str = "linear 10%",
                        fraction: float = 0.1, info: dict | None = None,
                        config: dict | None = None):
    """An evaluation directory written by hand: one linear column, ``correct`` of ``n`` test
    images (labels ``i % classes``) right at every label seed; ``info``: more top-level fields
    of results.json, ``config``: the probes' chosen settings."""
    import numpy as np

    from e2mc.artifacts import EvalDir
    from e2mc.evaluation.results import save_predictions

    labels = np.arange(n) % classes
    entries = []
    for seed in seeds:
        preds = labels.copy()
        preds[correct:] = (preds[correct:] + 1) % classes
        rel = save_predictions(root, f"linear_{fraction:g}_seed{seed}", preds, labels)
        entries.append({"protocol": "linear", "column": column, "primary": "top1",
                        "metrics": {"top1": 100 * correct / n}, "fraction": fraction,
                        "seed": seed, "predictions": rel,
                        **({"config": config} if config else {})})
    EvalDir(root).write({"entries": entries, **recorded_data(labels), **(info or {})})
    return root


def distinct_tensors(model):
    """Every tensor of ``model`` random (positive running variances, counts of batches
    nonzero), a teacher's other than its student's, so that a test sees where each lands."""
    import torch

    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for k, v in model.state_dict().items():
            if v.is_floating_point():
                r = torch.randn(v.shape, generator=g)
                v.copy_(r.abs() + 0.5 if k.endswith("running_var") else r)
            elif k.endswith("num_batches_tracked"):
                v.fill_(int(torch.randint(1, 100, (), generator=g)))
    return model
