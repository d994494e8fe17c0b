"""Running jobs: :class:`JobRunner` submits the works of a search or an evaluation set that are
not done, records every job in ``jobs.json``, waits for them (SLURM's states from
:mod:`e2mc.jobs.slurm_state`, a local job through its controller process or its directory's lock)
and checks how each ended (docs/search.md)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2mc.artifacts import live_writer
from e2mc.errors import InputError, RunFailure
from e2mc.jobs.options import ExecutorOptions, make_executor
from e2mc.jobs.slurm_state import ENDED_STATES, NO_ANSWER, QUEUED_STATES, SlurmStates
from e2mc.jobs.work import Work
from e2mc.processes import process_alive, process_identity, same_process

#: Seconds between two lines saying that SLURM does not answer / what runs.
OUTAGE_SAY_S = 180
HEARTBEAT_S = 60


class JobStopped(Exception):
    """A job ended unfinished, or the search was asked to stop: running it again resumes."""


@dataclass
class _Tracked:
    work: Work
    job_id: str
    job: Any  # a submitit Job (for a local job of an earlier search: paths only)
    log: Path
    foreign: dict[str, Any] | None = None  # an earlier search's local job: its controller
    slot: int | None = None  # local: which GPU slot it holds
    cancelled: bool = False  # requeued by SLURM after its work was done, and cancelled
    started: float = 0.0  # when this search first saw it running (time.monotonic())


class JobRunner:
    """Submits, records, waits for and checks the jobs of a search or an evaluation set."""

    def __init__(self, options: ExecutorOptions, files: Any,
                 log: Callable[[str], None] = lambda m: print(m, file=sys.stderr),
                 progress: bool = True) -> None:
        """``files``: the directory the jobs work for, with its ``root``, ``jobs_json`` and
        ``jobs_dir`` (:class:`~e2mc.artifacts.SearchDir`, :class:`~e2mc.artifacts.EvalSetDir`)."""
        options.check()
        if options.kind == "inline":
            raise ValueError("JobRunner is for --executor local or slurm")
        self.options, self.log, self.progress = options, log, progress
        self.files = files
        self.folder = Path(options.jobs_dir or self.files.jobs_dir).absolute()
        self.name = f"e2mc-{self.files.root.resolve().name}"
        self.slurm = SlurmStates(log)
        self._slurm_state: dict[str, str | None] = {}  # the last look, by job id
        self._outage: list[float] | None = None  # SLURM silent: [since, last said] (monotonic)
        if options.kind == "local" and not options.gpus_per_node:
            import torch

            if torch.cuda.is_available():
                log("note: --executor local without --gpus-per-node: the jobs see no GPU "
                    "(submitit hides them) and train on the CPU")

    def read_record(self) -> dict[str, dict[str, Any]]:
        """``jobs.json``: ``{key: {executor, job_id, folder, tasks, log, state, ...}}``."""
        path = self.files.jobs_json
        if not path.is_file():
            return {}
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise InputError(f"{path}: not valid JSON ({err}); delete it (running jobs are "
                             "then not waited for)") from err
        return record if isinstance(record, dict) else {}

    def _write_record(self, record: dict[str, dict[str, Any]]) -> None:
        from e2mc.files import atomic_write_text

        atomic_write_text(self.files.jobs_json, json.dumps(record, indent=2, sort_keys=True))

    def _note(self, record: dict[str, Any], key: str, **fields: Any) -> None:
        record.setdefault(key, {}).update(fields)
        self._write_record(record)

    def _note_states(self, record: dict[str, Any], states: dict[str, str]) -> None:
        """Record each job's state (``queued``, ``running``, ``unknown``: SLURM does not answer)
        and this search as its ``owner``, the one waiting for it; written when one changed."""
        owner = process_identity()
        changed = False
        for key, state in states.items():
            entry = record.setdefault(key, {})
            if entry.get("state") != state or entry.get("owner") != owner:
                entry.update(state=state, owner=owner)
                changed = True
        if changed:
            self._write_record(record)

    def _attach(self, work: Work, entry: dict[str, Any]) -> _Tracked | None:
        """The recorded job of ``work`` if it is still queued or running, else ``None``."""
        import submitit

        if entry.get("executor") != self.options.kind or not entry.get("job_id"):
            return None
        job_id, folder = str(entry["job_id"]), Path(entry.get("folder", self.folder))
        tasks = list(range(int(entry.get("tasks", 1))))
        if self.options.kind == "slurm":  # (SLURM says when it ended: a requeue after the
            job = submitit.SlurmJob(folder, job_id, tasks=tasks)  # result is waited for)
            self._look_up([job_id])
            t = _Tracked(work, job_id, job, _task0(job).paths.stderr)
            return None if self._state(t) == "ended" else t
        job = submitit.LocalJob(folder, job_id)
        if _task0(job).paths.result_pickle.exists():  # it ended (its process may linger)
            return None
        controller = entry.get("controller")  # (none recorded: its directory's lock decides)
        t = _Tracked(work, job_id, job, job.paths.stderr,
                     foreign=controller if isinstance(controller, dict) else {})
        return None if self._state(t) == "ended" else t

    def _look_up(self, job_ids: Sequence[str]) -> None:
        """Ask SLURM once for the states of ``job_ids``. While it does not answer, say so every
        :data:`OUTAGE_SAY_S` s; after ``--slurm-outage`` minutes, :class:`RunFailure`."""
        if self.options.kind != "slurm":
            return
        self._slurm_state = self.slurm.states(job_ids)
        now, why = time.monotonic(), self.slurm.why
        if why is None:
            if self._outage is not None:
                self.log(f"SLURM answers again after {now - self._outage[0]:.0f} s")
            self._outage = None
            return
        since, said = self._outage = self._outage or [now, -float("inf")]
        limit = self.options.slurm_outage_min
        if now - since > 60 * limit:
            raise RunFailure(f"SLURM has not answered for {(now - since) / 60:.0f} min ({why}); "
                             f"the jobs are recorded in {self.files.jobs_json}: run the same "
                             "command again to wait for them (--slurm-outage MINUTES)")
        if now - said >= OUTAGE_SAY_S:
            self._outage[1] = now
            self.log(f"SLURM does not answer ({why}) for {now - since:.0f} s: the jobs' states "
                     f"are unknown; waiting for it (up to {limit:g} min, --slurm-outage)")

    def _state(self, t: _Tracked) -> str:
        """``queued``, ``running``, ``unknown`` (SLURM does not answer) or ``ended`` (only when
        SLURM says so). A job SLURM requeued after its work was done is cancelled, then waited
        for."""
        if self.options.kind == "slurm":
            state = self._slurm_state.get(t.job_id)
            if state == NO_ANSWER:
                return "unknown"
            if state is None or state in ENDED_STATES:
                return "ended"
            if state not in QUEUED_STATES:
                return "running"
            if not t.cancelled and Path(t.log).exists() and t.work.is_done():  # it ran before
                t.cancelled = True
                self.log(f"  job {t.job_id}: SLURM requeued it after its work was done "
                         f"({t.work.key}); cancelling it: {self.slurm.cancel(t.job_id)}")
            return "queued"
        if _task0(t.job).paths.result_pickle.exists():  # (a local job's process may linger)
            return "ended"
        if t.foreign is not None:
            alive = (_local_controller_alive(t.foreign)
                     or live_writer(t.work.directory) is not None)
            return "running" if alive else "ended"
        return "ended" if t.job.done() else "running"

    def _result(self, t: _Tracked) -> tuple[str, Any]:
        """``("success", outcome)``, ``("error", traceback)`` or ``("missing", None)``."""
        from submitit.core.utils import pickle_load

        path = _task0(t.job).paths.result_pickle
        waited = 0.0
        while not path.exists() and self._slurm_state.get(t.job_id) == "COMPLETED" \
                and waited < 30 and not t.work.is_done():
            time.sleep(1.0)  # a shared file system may show the result late
            waited += 1.0
        if not path.exists():
            return "missing", None
        return pickle_load(path)

    def run(self, works: Sequence[Work], kind: str = "train",
            should_stop: Callable[[], bool] = lambda: False) -> None:
        """Bring every one of ``works`` to done: wait for recorded jobs in flight, submit the rest
        (``max_parallel`` at a time). A failed job is :class:`RunFailure` (its log tail printed
        first); one that ended unfinished, or a stop request, :class:`JobStopped`."""
        self.folder.mkdir(parents=True, exist_ok=True)
        record = self.read_record()
        done = 0
        tracked: list[_Tracked] = []
        pending: list[Work] = []
        for work in works:  # a done work's job is waited for too while in flight (requeued)
            entry = record.get(work.key, {})
            finished = work.is_done()
            in_flight = entry.get("state") not in (None, "done", "failed", "stopped")
            attached = self._attach(work, entry) if in_flight or not finished else None
            if attached is not None:
                tracked.append(attached)
                self.log(f"  waiting for job {attached.job_id} (still {self._state(attached)}): "
                         f"{work.key} (log {attached.log})")
            elif finished:
                done += 1
                if in_flight:  # its job ended while no search watched
                    self._note(record, work.key, state="done")
            else:
                pending.append(work)
        progress = _Progress(len(works), done, self.log, shown=self.progress)
        executor = make_executor(self.options, self.folder, self.name, kind) if pending else None
        limit = self.options.parallel(len(pending) + len(tracked))
        free_slots = list(range(limit))
        for t in tracked[:limit]:
            t.slot = free_slots.pop(0)
        finished = done
        try:
            if pending and self.options.kind == "slurm":  # one array, max_parallel at a time
                tracked += self._submit(executor, pending, record, kind)
                pending = []
            while pending or tracked:
                if should_stop():
                    raise JobStopped("a pre-emption signal came; the jobs in flight "
                                     f"go on (recorded in {self.files.jobs_json}) and the next "
                                     "run of the same command waits for them")
                while pending and free_slots and len(tracked) < limit:
                    slot = free_slots.pop(0)
                    if self.options.gpus_per_node:
                        g = self.options.gpus_per_node if kind == "train" else 1
                        executor.update_parameters(
                            visible_gpus=tuple(range(slot * g, (slot + 1) * g)))
                    (new,) = self._submit(executor, [pending.pop(0)], record, kind)
                    new.slot = slot
                    tracked.append(new)
                self._look_up([t.job_id for t in tracked])
                states = {id(t): self._state(t) for t in tracked}
                self._note_states(record, {t.work.key: states[id(t)] for t in tracked
                                           if states[id(t)] != "ended"})
                running = [t for t in tracked if states[id(t)] in ("running", "unknown")]
                for t in running:
                    t.started = t.started or time.monotonic()
                queued = len(pending) + sum(1 for t in tracked if states[id(t)] == "queued")
                for t in [t for t in tracked if states[id(t)] == "ended"]:
                    tracked.remove(t)
                    if t.slot is not None:
                        free_slots.append(t.slot)
                    try:
                        self._ended(t, record)
                    except (RunFailure, JobStopped):
                        progress.show(queued, running, finished, failed=1)
                        raise
                    finished += 1
                progress.show(queued, [t for t in running if t in tracked], finished)
                if pending or tracked:
                    _sleep(self.options.poll, should_stop)
        finally:
            progress.close()
            if tracked:
                self.log(f"{len(tracked)} job(s) in flight: "
                         + ", ".join(f"{t.job_id} ({t.work.key})" for t in tracked)
                         + f"; recorded in {self.files.jobs_json}: the next run of the same "
                         "command waits for those still running")

    def _submit(self, executor: Any, works: list[Work], record: dict[str, dict[str, Any]],
                kind: str) -> list[_Tracked]:
        import submitit

        with submitit.helpers.clean_env():  # no SLURM_* of a job the search itself runs in
            if len(works) == 1:
                jobs = [executor.submit(works[0].job)]
            else:
                with executor.batch():
                    jobs = [executor.submit(w.job) for w in works]
        out = []
        for work, job in zip(works, jobs, strict=True):
            entry = record.get(work.key, {})
            earlier = [*entry.get("earlier", []), entry["job_id"]] if entry.get("job_id") \
                else entry.get("earlier", [])
            tracked = _Tracked(work, str(job.job_id), job, _task0(job).paths.stderr)
            record[work.key] = {"executor": self.options.kind, "job_id": tracked.job_id,
                                "kind": kind, "folder": str(self.folder),
                                "tasks": job.num_tasks, "log": str(tracked.log),
                                "submitted": time.strftime("%Y-%m-%d %H:%M:%S"),
                                "state": "submitted", "earlier": earlier,
                                "owner": process_identity()}
            if self.options.kind == "local":  # its controller process, beyond the pid
                record[work.key]["controller"] = process_identity(int(tracked.job_id))
            self.log(f"  job {tracked.job_id}: {work.key} (log {tracked.log})")
            out.append(tracked)
        self._write_record(record)
        return out

    def _ended(self, t: _Tracked, record: dict[str, dict[str, Any]]) -> None:
        """Check a job that ended: done, or :class:`RunFailure` / :class:`JobStopped`."""
        status, value = self._result(t)
        key = t.work.key
        if t.work.is_done():  # (its work is the truth: a job requeued after it, then cancelled)
            value = value if status == "success" and isinstance(value, dict) else {}
            warned = _warnings(t.log)  # (they went to its log only: said here, and kept)
            self._note(record, key, state="done", pid=value.get("pid"), host=value.get("host"),
                       warnings=warned)
            self.log("\n".join([f"  job {t.job_id} done: {key}",
                                 *(f"  {key}: {w}" for w in warned)]))
            return
        tail = _tail(t.log, t.job)
        if tail:
            print(f"--- last lines of {t.log} ---\n{tail}\n---", file=sys.stderr)
        if status == "error":
            self._note(record, key, state="failed")
            last = next((ln.strip() for ln in reversed(str(value).splitlines()) if ln.strip()),
                        "an error")
            raise RunFailure(f"job {t.job_id} ({key}) failed: {last}; log {t.log}")
        if status == "success" and isinstance(value, dict) and value.get("finished"):
            self._note(record, key, state="failed")
            raise RunFailure(f"job {t.job_id} ({key}) returned but {t.work.directory} is not "
                             f"done; log {t.log}")
        if self.options.kind == "slurm":  # SLURM ended it: cancelled, failed, timed out, gone
            state = self._slurm_state.get(t.job_id) or "no longer known to SLURM"
            self._note(record, key, state="failed", slurm_state=state)
            raise RunFailure(f"job {t.job_id} ({key}) ended without a result ({state}); run "
                             "the same command again to submit it anew (a run resumes from its "
                             f"checkpoint); log {t.log}")
        self._note(record, key, state="stopped")
        how = (f"stopped at step {value.get('step')} ({value.get('stop_reason')})"
               if status == "success" and isinstance(value, dict)
               else "ended without a result (killed, or pre-empted and not requeued)")
        raise JobStopped(f"job {t.job_id} ({key}) {how}; run the same command again to resume "
                         f"it from its checkpoint; log {t.log}")


def _sleep(seconds: float, should_stop: Callable[[], bool]) -> None:
    """Wait ``seconds`` between two looks at the jobs, less when a stop is asked for."""
    end = time.monotonic() + seconds
    while not should_stop() and (left := end - time.monotonic()) > 0:
        time.sleep(min(0.5, left))


def _task0(job: Any) -> Any:
    return job.task(0) if getattr(job, "num_tasks", 1) > 1 else job


def _tail(log: Path, job: Any, lines: int = 25) -> str:
    """The last ``lines`` lines of the job's error log (else of its output log)."""
    for path in (log, _task0(job).paths.stdout):
        text = _read(path)
        if text.strip():
            return "\n".join(text.rstrip().splitlines()[-lines:])
    return ""


def _warnings(log: Path) -> list[str]:
    """The distinct ``warning:`` lines of a job's log, in order."""
    return list(dict.fromkeys(ln.strip() for ln in _read(log).splitlines()
                              if ln.startswith("warning:")))


def _read(path: str | Path) -> str:
    """A log's text ("" when it cannot be read)."""
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _local_controller_alive(identity: dict[str, Any]) -> bool:
    """Whether ``identity`` is a live submitit local job controller on this machine: the same
    process (pid, start time, boot: not a later one given the same pid) running submitit."""
    if not same_process(identity):
        return False
    try:
        cmdline = Path(f"/proc/{int(identity['pid'])}/cmdline").read_bytes()
    except OSError:
        return process_alive(int(identity["pid"]))  # no /proc: a live pid is all we know
    return b"submitit.local._local" in cmdline


class _Progress:
    """The jobs' progress: a bar on a terminal, else a line when a count changes (if ``shown``)."""

    def __init__(self, total: int, done: int, log: Callable[[str], None],
                 shown: bool = True) -> None:
        from e2mc.progress import is_terminal, progress_bar

        self.total, self.log, self.last, self.shown = total, log, None, shown
        self.said = time.monotonic()
        self.bar = None
        if shown and is_terminal():
            self.bar = progress_bar(total=total, initial=done, desc="jobs", unit="job")

    def show(self, queued: int, running: list[_Tracked], done: int, failed: int = 0) -> None:
        """The bar at every look (its clock moves while a job runs), else a line when a count
        changed and every :data:`HEARTBEAT_S` s; each says what runs, for how long."""
        counts = (queued, len(running), done, failed)
        now = time.monotonic()
        what = ", ".join(f"{t.work.key} {(now - t.started) / 60:.0f} min" for t in running)
        runs = f"{queued} queued, {len(running)} running{f' ({what})' if what else ''}"
        if self.bar is not None:
            self.bar.n = done
            self.bar.set_postfix_str(f"{runs}, {failed} failed")
            return
        if not self.shown or (counts == self.last and now - self.said < HEARTBEAT_S):
            return
        self.last, self.said = counts, now
        self.log(f"jobs: {runs}, {done} done, {failed} failed (of {self.total})")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
