"""A process beyond its pid (e2mc.processes): a lock or a recorded job names its process by pid,
start time, boot id and host, so that nothing waits for a process that is gone: a lock left by a
crash, a lock whose pid now belongs to another process (pid reuse), a lock naming another host's
process, and a local job whose controller's pid was given to another process."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from e2mc import artifacts, processes
from e2mc.artifacts import LOCK, live_writer, writer_lock
from e2mc.processes import process_identity, process_start, same_process

LINUX = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")


@pytest.fixture
def other() -> subprocess.Popen:
    """A live process that is not this one (its pid is what a recycled pid would be), once it
    runs its own code: just after ``exec`` (when ``Popen`` returns) its ``/proc/PID/cmdline``
    can still read empty, which made the controller test fail about once in four loaded runs."""
    proc = subprocess.Popen([sys.executable, "-c",
                             "import time; print('ready', flush=True); time.sleep(3600)",
                             "submitit.local._local"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    yield proc
    proc.kill()
    proc.wait()
    proc.stdout.close()


@LINUX
def test_an_identity_tells_a_process_from_a_later_one_with_its_pid(
        other: subprocess.Popen) -> None:
    me = process_identity()
    assert me["pid"] == os.getpid() and me["host"] == socket.gethostname()
    assert me["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    # field 22 of /proc/PID/stat, read independently (the name may hold spaces and parentheses)
    fields = Path(f"/proc/{os.getpid()}/stat").read_text().rsplit(")", 1)[1].split()
    assert me["start_ticks"] == int(fields[19]) > 0
    assert same_process(me)
    theirs = process_identity(other.pid)
    assert same_process(theirs) and theirs["start_ticks"] >= me["start_ticks"]
    # the same pid, alive, but started at another time or in another boot: not that process
    assert not same_process({**theirs, "start_ticks": theirs["start_ticks"] - 1})
    assert not same_process({**theirs, "boot_id": "0" * 8 + theirs["boot_id"][8:]})
    assert not same_process({**theirs, "host": "elsewhere"})  # not seen from here
    other.kill()
    other.wait()
    assert not same_process(theirs) and process_start(other.pid) is None


def _stale_lock(root: Path, **record: object) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / LOCK).write_text(json.dumps({"started": "2026-01-01 00:00:00",
                                         "command": ["e2mc"], **record}))
    return root / LOCK


@LINUX
def test_a_lock_nobody_holds_is_not_a_live_writer_whatever_it_names(
        tmp_path: Path, other: subprocess.Popen, capsys: pytest.CaptureFixture) -> None:
    """The kernel says whether the lock is held (F_GETLK): a lock file left by a crash that
    names a live pid (reused) or another host's process is no writer, and the next writer takes
    it over with a note."""
    reused = {**process_identity(other.pid), "start_ticks": 1}
    for name, record in {"reused": reused,
                         "elsewhere": {**process_identity(), "host": "gpu-node-7"}}.items():
        _stale_lock(tmp_path / name, **record)
        assert live_writer(tmp_path / name) is None, name
        with writer_lock(tmp_path / name):
            assert live_writer(tmp_path / name)["pid"] == os.getpid()
        err = capsys.readouterr().err
        assert f"note: {tmp_path / name / LOCK} was left by a process that is gone " \
               f"(pid {record['pid']} on {record['host']}" in err
    # a lock held by a live process of its own (another process of this host): a live writer
    ready = tmp_path / "ready"
    code = ("import sys, time; from pathlib import Path; from e2mc.artifacts import writer_lock\n"
            "with writer_lock(sys.argv[1]):\n Path(sys.argv[2]).touch(); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "held"), str(ready)],
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        record = live_writer(tmp_path / "held")
        assert record is not None and record["pid"] == holder.pid
        assert record["start_ticks"] == process_start(holder.pid)
    finally:
        holder.kill()
        holder.wait()
    assert live_writer(tmp_path / "held") is None  # killed: the kernel released its lock


@LINUX
def test_without_a_lock_query_the_identity_decides(
        tmp_path: Path, other: subprocess.Popen, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the file system cannot say who holds a lock: a live process with the recorded
    start time is a writer; the same pid with another start time, a dead pid or another host's
    process is not waited for."""
    monkeypatch.setattr(artifacts.locks, "lock_held", lambda path: None)
    alive = process_identity(other.pid)
    cases = {"alive": (alive, True), "reused": ({**alive, "start_ticks": 1}, False),
             "elsewhere": ({**alive, "host": "gpu-node-7"}, False)}
    for name, (record, waited_for) in cases.items():
        _stale_lock(tmp_path / name, **record)
        assert (live_writer(tmp_path / name) is not None) is waited_for, name
    other.kill()
    other.wait()
    assert live_writer(tmp_path / "alive") is None  # gone


@LINUX
def test_a_local_job_whose_controller_pid_was_reused_is_not_waited_for(
        tmp_path: Path, other: subprocess.Popen) -> None:
    """``--executor local``: jobs.json names a job's controller (a submitit local controller,
    by its command line) with its start time; a live process with that pid but another start
    time is not it, and the job is submitted anew instead of being waited for forever."""
    pytest.importorskip("submitit")
    from e2mc.jobs import ExecutorOptions, JobRunner, Work

    files = SimpleNamespace(root=tmp_path, jobs_json=tmp_path / "jobs.json",
                            jobs_dir=tmp_path / "jobs")
    runner = JobRunner(ExecutorOptions(kind="local"), files, log=lambda m: None,
                       progress=False)
    work = Work("run", lambda: {}, tmp_path / "run", lambda: False)
    entry = {"executor": "local", "job_id": str(other.pid), "folder": str(tmp_path / "jobs"),
             "controller": process_identity(other.pid)}
    assert runner._attach(work, entry) is not None  # its controller runs: waited for
    entry["controller"] = {**entry["controller"], "start_ticks": 1}
    assert runner._attach(work, entry) is None  # the pid of another process
    entry["controller"] = {**process_identity(other.pid), "host": "gpu-node-7"}
    assert runner._attach(work, entry) is None  # another host's: its lock would tell
    assert processes.lock_held(tmp_path / "nothing") is None


def test_available_cores_is_the_affinity_not_the_machine(monkeypatch) -> None:
    """A SLURM job or a container may run on fewer cores than the machine has: the demo's side
    by side training and the extraction's workers count the process's own."""
    import os

    from e2mc.processes import available_cores

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert available_cores() == 1
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    assert available_cores() == 64
