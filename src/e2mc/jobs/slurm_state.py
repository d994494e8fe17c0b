"""The state of SLURM jobs: from ``sacct`` where accounting exists, else ``squeue`` and
``scontrol show job`` (submitit's watcher asks ``sacct`` only, so without accounting it never
learns that a job ended). :meth:`SlurmStates.states` maps each job id (``123``, ``123_4``) to
its state; to ``None`` when SLURM answered and no source knows the job any more (the runner
takes it, without a result, for failed); to :data:`NO_ANSWER` when SLURM did not answer, which
is no end: the runner waits (``--slurm-outage``)."""

from __future__ import annotations

import getpass
import re
import subprocess
import sys
from collections.abc import Callable, Iterable

#: States of a job that waits for a node (the unfinished others run).
QUEUED_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING",
                           "SUSPENDED", "RESV_DEL_HOLD", "SPECIAL_EXIT", "STOPPED"})
#: States of a job that ended (a requeued job is PENDING again, not one of these).
ENDED_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL",
                          "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED", "REVOKED"})
#: The state of a job while SLURM does not answer (:attr:`SlurmStates.why` says why).
NO_ANSWER = "NO_ANSWER"
_TIMEOUT_S = 60


def _run(command: list[str]) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None


def _expand(job_id: str) -> list[str]:
    """``6_[1-3,5%2]`` -> ``6_1 6_2 6_3 6_5``; ``6_0`` and ``7`` as they are."""
    match = re.fullmatch(r"(\d+)_\[([\d,\-]+)(?:%\d+)?\]", job_id)
    if match is None:
        return [job_id]
    out = []
    for part in match.group(2).split(","):
        low, _, high = part.partition("-")
        out += [f"{match.group(1)}_{i}" for i in range(int(low), int(high or low) + 1)]
    return out


def parse_table(text: str) -> dict[str, str]:
    """``ID|STATE`` lines (``sacct -P``, ``squeue -o %i|%T``) -> ``{id: STATE}`` (the first word:
    ``CANCELLED by 0`` -> ``CANCELLED``; array ranges expanded)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        job_id, sep, state = line.strip().partition("|")
        if not sep or not job_id or "." in job_id:  # (a step: 12.batch, 12.0)
            continue
        for one in _expand(job_id):
            out[one] = state.split()[0].rstrip("+") if state.split() else "UNKNOWN"
    return out


def parse_scontrol(text: str) -> dict[str, str]:
    """``scontrol show job -o`` lines -> ``{id: STATE}`` (array tasks as ``ARRAY_TASK``)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        state = fields.get("JobState")
        if not state:
            continue
        if fields.get("ArrayJobId") and fields.get("ArrayTaskId"):
            ids = _expand(f"{fields['ArrayJobId']}_[{fields['ArrayTaskId']}]")
        else:
            ids = [fields.get("JobId", "")]
        for one in ids:
            if one:
                out[one] = state
    return out


class SlurmStates:
    """Asks SLURM for the states of jobs; remembers whether ``sacct`` answers."""

    def __init__(self, log: Callable[[str], None] = lambda m: print(m, file=sys.stderr)) -> None:
        self.log = log
        self.accounting: bool | None = None  # unknown until sacct was asked once
        #: why SLURM did not answer at the last look (``None``: it answered)
        self.why: str | None = None

    def states(self, job_ids: Iterable[str]) -> dict[str, str | None]:
        """``{job_id: STATE, None (unknown to SLURM) or NO_ANSWER}`` for every id of
        ``job_ids``: what ``sacct`` does not know is asked of ``squeue``, then of ``scontrol``."""
        wanted = list(dict.fromkeys(str(j) for j in job_ids))
        self.why = None
        known: dict[str, str] = {}
        if wanted and self.accounting is not False:
            known = self._sacct(_bases(wanted))
        for source in (self._squeue, self._scontrol):
            missing = [j for j in wanted if j not in known]
            if missing and self.why is None:
                known.update(source(_bases(missing)))
        return {j: known.get(j, NO_ANSWER if self.why else None) for j in wanted}

    def cancel(self, job_id: str) -> str:
        """``scancel JOB_ID``; what it answered, in words."""
        done = _run(["scancel", job_id])
        return "cancelled" if done is not None and done.returncode == 0 else \
            f"scancel: {_why(done, 'scancel')}"

    def _sacct(self, bases: list[str]) -> dict[str, str]:
        done = _run(["sacct", "-n", "-P", "-X", "-o", "JobID,State", "-j", ",".join(bases)])
        if done is None or done.returncode != 0 or "disabled" in (done.stdout + done.stderr):
            if self.accounting is None:
                self.log(f"note: sacct: {_why(done, 'sacct')}; job states come from squeue and "
                         "scontrol")
            self.accounting = False
            return {}
        self.accounting = True
        return parse_table(done.stdout)

    def _answered(self, done: subprocess.CompletedProcess[str] | None, name: str) -> bool:
        """Whether SLURM answered (an unknown job id is an answer); else :attr:`why` says why."""
        if done is not None and (done.returncode == 0 or "Invalid job id" in done.stderr):
            return True
        self.why = f"{name}: {_why(done, name)}"
        return False

    def _squeue(self, bases: list[str]) -> dict[str, str]:
        done = _run(["squeue", "-h", "-r", "-o", "%i|%T", "-u", getpass.getuser(),
                     "-j", ",".join(bases)])
        # (all ids unknown: "Invalid job id specified", exit 1: none of them is queued)
        return parse_table(done.stdout) if self._answered(done, "squeue") and done else {}

    def _scontrol(self, bases: list[str]) -> dict[str, str]:
        out: dict[str, str] = {}
        for base in bases:
            done = _run(["scontrol", "show", "job", "-o", base])
            if not self._answered(done, "scontrol"):
                break
            if done is not None and done.returncode == 0:
                out.update(parse_scontrol(done.stdout))
        return out


def _bases(job_ids: list[str]) -> list[str]:
    return sorted({j.split("_", 1)[0] for j in job_ids}, key=int)  # an array task's job


def _why(done: subprocess.CompletedProcess[str] | None, name: str) -> str:
    """The first line a command that failed printed (``no answer`` without one)."""
    if done is None:
        return f"{name} did not run or timed out"
    return ((done.stderr or done.stdout).strip().splitlines() or ["no answer"])[0]
