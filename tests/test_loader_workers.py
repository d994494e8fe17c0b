"""A training process killed with SIGKILL (the OOM killer, ``scancel --signal=KILL``) leaves no
process behind, whatever the program's start method: its loader workers see it gone and stop.
torch's workers watch their parent's pid; under ``forkserver`` (Python 3.14's default on Linux)
the parent is the server, so before :func:`e2mc.processes.loader_start_method` the workers of a
killed run waited forever, each with its memory (the suite's own kill tests left 23 of them,
14 GB, in one run)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from e2mc.processes import loader_start_method
from helpers import TINY_RUN

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(),
                                reason="reads the process table from /proc (Linux)")

#: A program that chose its start method, then runs ``e2mc pretrain``.
PROGRAM = ("import multiprocessing, sys\n"
           "multiprocessing.set_start_method(sys.argv[1])\n"
           "from e2mc.cli import main\n"
           "sys.exit(main(sys.argv[2:]))\n")


def _session(sid: int) -> set[int]:
    """The living processes of session ``sid`` (zombies aside)."""
    out = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:  # gone meanwhile
            continue
        fields = stat.rsplit(")", 1)[1].split()  # state ppid pgrp session ...
        if int(fields[3]) == sid and fields[0] not in "ZX":
            out.add(int(entry))
    return out


def _wait(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


@pytest.mark.parametrize("method", sorted(set(multiprocessing.get_all_start_methods())
                                          & {"fork", "forkserver", "spawn"}))
@pytest.mark.slow
def test_a_killed_run_leaves_no_loader_worker_behind(method: str, tmp_path: Path) -> None:
    data = tmp_path / "d.npz"
    rng = np.random.default_rng(0)
    np.savez(data, x_train=rng.integers(0, 256, (64, 16, 16), dtype=np.uint8),
             y_train=np.arange(64) % 4)
    run = tmp_path / "run"
    sets = [*TINY_RUN, "data.num_workers=2", "training.epochs=1000"]
    args = ["pretrain", "--config", "fmnist-vicreg-pretrain", "--data", str(data),
            "--out", str(run), *[a for s in sets for a in ("--set", s)]]
    trainer = subprocess.Popen([sys.executable, "-c", PROGRAM, method, *args],
                               start_new_session=True, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
    try:
        # training has begun: the workers exist (persistent) once a step is logged
        assert _wait(lambda: (run / "metrics.jsonl").exists()
                     and '"loss"' in (run / "metrics.jsonl").read_text()
                     or trainer.poll() is not None, 120)
        assert trainer.poll() is None, trainer.stderr.read().decode()  # type: ignore[union-attr]
        others = _session(trainer.pid) - {trainer.pid}
        assert len(others) >= 2  # the two loader workers (and under forkserver, the server)
        trainer.kill()
        trainer.wait()
        # torch's workers look at their parent every 5 s (MP_STATUS_CHECK_INTERVAL); a
        # spawned worker busy with its batch on a loaded machine takes longer (a leak: never)
        left = _session(trainer.pid)
        assert _wait(lambda: not _session(trainer.pid), 120), \
            f"{method}: processes left after the trainer was killed: {sorted(left)}"
    finally:
        for pid in _session(trainer.pid):
            os.kill(pid, signal.SIGKILL)
        if trainer.poll() is None:
            trainer.kill()


#: A loader made with e2mc's options whose process is killed while its spawned workers still
#: start (0.3 s: they are importing torch).
RACE = ("import multiprocessing, os, sys, time\n"
        "import torch\n"
        "from torch.utils.data import DataLoader, TensorDataset\n"
        "from e2mc.processes import loader_options\n"
        "if __name__ == '__main__':\n"
        "    multiprocessing.set_start_method('spawn')\n"
        "    loader = DataLoader(TensorDataset(torch.zeros(64, 3)), batch_size=4, num_workers=2,\n"
        "                        persistent_workers=True, **loader_options(2))\n"
        "    iterator = iter(loader)\n"
        "    time.sleep(0.3)\n"
        "    os.kill(os.getpid(), 9)\n")


@pytest.mark.skipif("spawn" not in multiprocessing.get_all_start_methods(), reason="no spawn")
def test_workers_that_start_after_their_trainer_died_end(tmp_path: Path) -> None:
    """torch's watchdog takes the parent pid a worker finds when it starts: a spawned worker
    that starts after the trainer was killed took init for its trainer and waited forever
    (2 workers and the resource tracker, still there after a minute, before
    ``processes.exit_if_orphaned``)."""
    script = tmp_path / "race.py"
    script.write_text(RACE)
    trainer = subprocess.Popen([sys.executable, str(script)], start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        trainer.wait(60)
        assert trainer.returncode == -signal.SIGKILL
        assert _wait(lambda: not _session(trainer.pid), 60), sorted(_session(trainer.pid))
    finally:
        for pid in _session(trainer.pid):
            os.kill(pid, signal.SIGKILL)


def test_the_start_method_of_loader_workers() -> None:
    """Without workers: none; under the default of this program (not forkserver): the default;
    the forkserver default: fork on Linux, spawn elsewhere (a program that is not this one)."""
    assert loader_start_method(0) is None
    if multiprocessing.get_start_method() != "forkserver":
        assert loader_start_method(2) is None
    code = ("import multiprocessing; multiprocessing.set_start_method('forkserver');"
            "from e2mc.processes import loader_start_method as f; print(f(0), f(2))")
    # asking leaves the program free to choose its start method afterwards
    free = ("import multiprocessing; from e2mc.processes import loader_start_method as f; "
            "f(2); multiprocessing.set_start_method('spawn'); print('free')")
    assert subprocess.run([sys.executable, "-c", free], capture_output=True, text=True,
                          check=True).stdout.split() == ["free"]
    if "forkserver" in multiprocessing.get_all_start_methods():
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True).stdout.split()
        assert out == ["None", "fork" if sys.platform.startswith("linux") else "spawn"]
