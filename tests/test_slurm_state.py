"""SLURM job states (e2mc.jobs.slurm_state) without a cluster: sacct where accounting exists,
else squeue and scontrol (fake commands on PATH answering as Slurm 22.05 does), said once; a job
no source knows any more is ``None`` (the runner takes it, without a result, for failed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from e2mc.jobs.slurm_state import SlurmStates, parse_scontrol, parse_table


def test_parse_the_answers_of_sacct_squeue_and_scontrol() -> None:
    table = "6_0|COMPLETED\n6_[1-3,5%2]|PENDING\n7|CANCELLED by 0\n7.batch|CANCELLED\n8|RUNNING\n"
    assert parse_table(table) == {"6_0": "COMPLETED", "6_1": "PENDING", "6_2": "PENDING",
                                  "6_3": "PENDING", "6_5": "PENDING", "7": "CANCELLED",
                                  "8": "RUNNING"}
    shown = ("JobId=13 JobName=e ArrayJobId=12 ArrayTaskId=0 JobState=CANCELLED Reason=None\n"
             "JobId=12 JobName=e ArrayJobId=12 ArrayTaskId=1-2%1 JobState=PENDING\n"
             "JobId=20 JobName=f JobState=TIMEOUT Reason=TimeLimit\n")
    assert parse_scontrol(shown) == {"12_0": "CANCELLED", "12_1": "PENDING", "12_2": "PENDING",
                                     "20": "TIMEOUT"}


def _fake(bin_dir: Path, name: str, script: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)


def test_without_accounting_states_come_from_squeue_then_scontrol(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = tmp_path / "calls"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = f'echo "$0 $*" >> {calls}\n'
    _fake(bin_dir, "sacct", log + "echo 'Slurm accounting storage is disabled' >&2; exit 1\n")
    _fake(bin_dir, "squeue", log + "echo '6_1|RUNNING'; echo '6_2|PENDING'\n")
    _fake(bin_dir, "scontrol", log + 'case "$4" in 6) echo "JobId=9 ArrayJobId=6 '
          'ArrayTaskId=0 JobState=CANCELLED";; *) echo "slurm_load_jobs error: Invalid job id '
          'specified" >&2; exit 1;; esac\n')
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    notes: list[str] = []
    states = SlurmStates(notes.append)
    for _ in range(3):  # three looks: sacct asked once, the note said once
        assert states.states(["6_0", "6_1", "6_2", "7"]) == {
            "6_0": "CANCELLED", "6_1": "RUNNING", "6_2": "PENDING", "7": None}
    assert notes == ["note: sacct: Slurm accounting storage is disabled; job states come from "
                     "squeue and scontrol"]
    lines = calls.read_text().splitlines()
    assert sum(ln.split()[0].endswith("sacct") for ln in lines) == 1
    # with accounting: sacct alone
    _fake(bin_dir, "sacct", log + "echo '6_0|COMPLETED'; echo '6_[1-2]|PENDING'\n")
    calls.unlink()
    accounted = SlurmStates(notes.append)
    assert accounted.states(["6_0", "6_2", "7"]) == {"6_0": "COMPLETED", "6_2": "PENDING",
                                                     "7": None}
    assert [ln.split()[0].rsplit("/", 1)[1] for ln in calls.read_text().splitlines()] == \
        ["sacct"] and accounted.accounting is True and len(notes) == 1
