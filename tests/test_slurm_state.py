"""SLURM job states (e2mc.jobs.slurm_state) without a cluster: sacct where accounting exists,
then squeue and scontrol (fake commands on PATH answering as Slurm 22.05 does), said once; a job
no source knows any more is ``None`` (the runner takes it, without a result, for failed), a
controller that does not answer is ``NO_ANSWER``: the runner (with a fake state reader) waits it
out up to ``--slurm-outage``, and cancels a job requeued after its work was done."""

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
    # with accounting: sacct, and for the job it does not know (7: accounting may lag behind
    # the controller), squeue and scontrol
    _fake(bin_dir, "sacct", log + "echo '6_0|COMPLETED'; echo '6_[1-2]|PENDING'\n")
    calls.unlink()
    accounted = SlurmStates(notes.append)
    assert accounted.states(["6_0", "6_2", "7"]) == {"6_0": "COMPLETED", "6_2": "PENDING",
                                                     "7": None}
    assert [ln.split()[0].rsplit("/", 1)[1] for ln in calls.read_text().splitlines()] == \
        ["sacct", "squeue", "scontrol"] and accounted.accounting is True and len(notes) == 1


_DOWN = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"


def test_a_controller_that_does_not_answer_is_no_answer_not_an_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """squeue and scontrol failing (the controller stopped) give NO_ANSWER and say why; only
    an answering SLURM that does not know a job gives None."""
    from e2mc.jobs.slurm_state import NO_ANSWER

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake(bin_dir, "sacct", "echo 'Slurm accounting storage is disabled' >&2; exit 1\n")
    _fake(bin_dir, "squeue", f"echo '{_DOWN}' >&2; exit 1\n")
    _fake(bin_dir, "scontrol", f"echo '{_DOWN}' >&2; exit 1\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    states = SlurmStates(lambda m: None)
    assert states.states(["20_0", "20_1"]) == {"20_0": NO_ANSWER, "20_1": NO_ANSWER}
    assert states.why == f"squeue: {_DOWN}"
    _fake(bin_dir, "squeue", "echo 'slurm_load_jobs error: Invalid job id specified' >&2; "
          "exit 1\n")
    _fake(bin_dir, "scontrol", "echo 'slurm_load_jobs error: Invalid job id specified' >&2; "
          "exit 1\n")
    assert states.states(["20_0"]) == {"20_0": None} and states.why is None


class _FakeSlurm:
    """A state reader playing a script of states (one per look; the last repeats)."""

    def __init__(self, *script: object) -> None:
        self.script, self.why, self.cancelled = list(script), None, []

    def states(self, job_ids):
        from e2mc.jobs.slurm_state import NO_ANSWER

        step = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        state = step() if callable(step) else step
        self.why = f"squeue: {_DOWN}" if state == NO_ANSWER else None
        return {j: state for j in job_ids}

    def cancel(self, job_id: str) -> str:
        self.cancelled.append(job_id)
        return "cancelled"


def _runner(tmp_path: Path, fake: _FakeSlurm, done: list[bool], outage_min: float = 30.0):
    """A JobRunner on SLURM re-attaching to job 20_0 of an earlier search (recorded in
    jobs.json, its log written: it ran), whose work is done once ``done[0]``."""
    import json
    from types import SimpleNamespace

    pytest.importorskip("submitit")
    from e2mc.jobs import ExecutorOptions, JobRunner, Work

    files = SimpleNamespace(root=tmp_path, jobs_json=tmp_path / "jobs.json",
                            jobs_dir=tmp_path / "jobs")
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "20_0_0_log.err").write_text("warning: tiny split\n")
    files.jobs_json.write_text(json.dumps({"trials/a/run": {
        "executor": "slurm", "job_id": "20_0", "folder": str(tmp_path / "jobs"), "tasks": 1,
        "state": "submitted", "owner": {"pid": 1, "host": "elsewhere"}}}))
    lines: list[str] = []
    options = ExecutorOptions(kind="slurm", poll_s=0.1, slurm_outage_min=outage_min)
    runner = JobRunner(options, files, lines.append, progress=False)
    runner.slurm = fake
    work = Work("trials/a/run", lambda: {}, tmp_path / "run", lambda: done[0])
    return runner, work, lines


def test_an_outage_is_waited_out_and_only_slurms_end_ends_a_job(tmp_path: Path) -> None:
    """The controller answers, then not for three looks, then again: the search waits (one
    line saying so, one when it answers again), takes the job over in jobs.json (owner: this
    process) and ends when SLURM reports the job COMPLETED."""
    import json

    from e2mc.jobs.slurm_state import NO_ANSWER
    from e2mc.processes import process_identity

    done = [False]

    def completed() -> str:
        done[0] = True
        return "COMPLETED"

    fake = _FakeSlurm("RUNNING", "RUNNING", NO_ANSWER, NO_ANSWER, NO_ANSWER, "RUNNING",
                      completed)
    runner, work, lines = _runner(tmp_path, fake, done)
    seen: list[dict] = []
    fake.script.insert(3, lambda: seen.append(runner.read_record()["trials/a/run"])
                       or NO_ANSWER)
    runner.run([work])
    assert [ln for ln in lines if "SLURM" in ln] == [
        f"SLURM does not answer (squeue: {_DOWN}) for 0 s: the jobs' states are unknown; "
        "waiting for it (up to 30 min, --slurm-outage)",
        lines[[i for i, ln in enumerate(lines) if "answers again" in ln][0]]]
    assert seen[0]["state"] == "unknown" and seen[0]["owner"] == process_identity()
    entry = json.loads((tmp_path / "jobs.json").read_text())["trials/a/run"]
    assert entry["state"] == "done" and entry["owner"] == process_identity()
    assert fake.cancelled == []


def test_an_outage_longer_than_the_limit_stops_with_exit_1(tmp_path: Path) -> None:
    from e2mc.errors import RunFailure
    from e2mc.jobs.slurm_state import NO_ANSWER

    runner, work, lines = _runner(tmp_path, _FakeSlurm("RUNNING", NO_ANSWER), [False],
                                  outage_min=0.0)
    with pytest.raises(RunFailure, match=r"SLURM has not answered for 0 min \(squeue: "
                                         r".*--slurm-outage MINUTES\)"):
        runner.run([work])
    assert "1 job(s) in flight: 20_0 (trials/a/run)" in lines[-1]


def test_a_job_requeued_after_its_work_was_done_is_cancelled_then_waited_for(
        tmp_path: Path) -> None:
    """SLURM requeued the job (PENDING again) after its run was done: the search cancels it
    and ends when SLURM reports it CANCELLED, the work counted done; a job SLURM answers it
    does not know, without its work done, is a failure."""
    from e2mc.errors import RunFailure

    fake = _FakeSlurm("RUNNING", "PENDING", "PENDING", "CANCELLED")
    runner, work, lines = _runner(tmp_path, fake, [True])
    runner.run([work])
    assert fake.cancelled == ["20_0"]
    assert any("requeued it after its work was done" in ln for ln in lines)
    assert runner.read_record()["trials/a/run"]["state"] == "done"
    gone = tmp_path / "gone"
    gone.mkdir()
    runner, work, _ = _runner(gone, _FakeSlurm("RUNNING", None), [False])
    with pytest.raises(RunFailure, match="ended without a result \\(no longer known to SLURM"):
        runner.run([work])
