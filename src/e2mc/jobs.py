"""Jobs: every training run and every evaluation of ``e2mc search`` as one unit of work, run in
the search's own process (``--executor inline``, the default), in processes of their own on this
machine (``local``) or as SLURM jobs (``slurm``); the last two through submitit, imported only
when asked for (``pip install 'e2mc[cluster]'``).

A job is a picklable callable: :class:`TrainJob` trains one configuration in one run directory
with :func:`~e2mc.training.run.train_unless_done`, the function the inline search calls too (the
run is marked done exactly when it reached its configured end), and :class:`CallJob` runs one
evaluation. Under SLURM a training job has one task per GPU on each of its nodes, and each task
joins the process group from submitit's environment (``TorchDistributedEnvironment().export()``
sets ``MASTER_ADDR``, ``RANK``, ``WORLD_SIZE``, ...), then takes the same code path as under
``torchrun``.

The search stays the one that decides. :class:`JobRunner` submits what is not done, records
every job id in ``SEARCH/jobs.json`` (written atomically), waits with a progress display
(queued / running / done / failed, each job's log path), and the search then reads the results
back through the run directories and applies its rule. A job that fails stops the search with
its log tail (:class:`~e2mc.errors.RunFailure`, exit 1); nothing is selected on partial data.

**Resuming.** A run or evaluation that is done is never resubmitted. A recorded SLURM job that
is still pending or running is waited for (``submitit.SlurmJob(folder, job_id)`` re-created from
the jobs folder). A local job cannot be re-attached from another process (submitit's
``LocalJob`` follows its process through the ``Popen`` object of the process that started it),
so a recorded local job is waited for while its controller process is alive or a live process
holds its run directory's lock (``.e2mc.lock``); only after that, and only if its run is not
done, is it submitted again, and the run resumes from its checkpoint.

**Pre-emption and time limits.** SLURM sends submitit's signal (``--signal=USR2@300``) before
the time limit and ``SIGTERM`` on pre-emption. A training job turns submitit's signal into the
trainer's first pre-emption signal (``training.preempt_signals``), so both take the trainer's
path: finish the step, write ``checkpoint.pt``, ``scontrol requeue`` (``training.requeue``);
the job then exits (75) without a result, so the search sees it queued again, not finished, and
the requeued job resumes the run. ``checkpoint()`` makes every job a submitit checkpointable
callable (``submitit.helpers.Checkpointable``'s protocol) for a signal outside the trainer's
window (an evaluation, or ``training.preempt_signals`` empty): submitit requeues the job, which
starts again (a run from its last checkpoint). A local job that is pre-empted or killed ends
without finishing; the search stops (exit 75) and running it again resumes the run.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2mc.artifacts import live_writer, process_alive
from e2mc.errors import InputError, RunFailure

EXECUTORS = ("inline", "local", "slurm")
#: Seconds between submitit's signal and the time limit: the step in flight and the checkpoint
#: must fit (docs/training.md, pre-emption).
SIGNAL_DELAY_S = 300
#: ``--time`` of a SLURM job when none is given (minutes).
DEFAULT_SLURM_TIME_MIN = 240
#: A local job without ``--time`` runs as long as it takes (submitit needs a number).
_NO_LIMIT_MIN = 60 * 24 * 365
LOG_TAIL_LINES = 25
#: SLURM states of a job that waits for a node (the rest of the unfinished ones run).
_QUEUED_STATES = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING",
                  "SUSPENDED", "RESV_DEL_HOLD", "UNKNOWN"}


def import_submitit() -> Any:
    """submitit, or a one-line error saying how to install it."""
    try:
        import submitit
    except ImportError:
        raise InputError("--executor local and --executor slurm need submitit: "
                         "pip install 'e2mc[cluster]'") from None
    return submitit


class JobStopped(Exception):
    """A job ended without finishing its work (pre-empted without a requeue, killed), or the
    search was asked to stop while waiting: running the search again resumes it."""


# --------------------------------------------------------------------------- options
@dataclass(frozen=True)
class ExecutorOptions:
    """Where the jobs of a search run (``e2mc search --executor ...``)."""

    kind: str = "inline"
    partition: str | None = None
    nodes: int = 1
    gpus_per_node: int = 0
    cpus_per_task: int | None = None
    time_min: int | None = None
    account: str | None = None
    constraint: str | None = None
    #: ``--slurm KEY=VALUE``: submitit's ``slurm_additional_parameters`` (``#SBATCH --KEY=VALUE``)
    slurm: dict[str, Any] = field(default_factory=dict)
    max_parallel: int | None = None
    jobs_dir: str | None = None
    #: seconds between two looks at the jobs (default: 0.5 locally, 30 on SLURM)
    poll_s: float | None = None

    def check(self) -> None:
        """Refuse values out of range and options that the executor would ignore; import
        submitit for ``local`` and ``slurm``."""
        if self.kind not in EXECUTORS:
            raise InputError(f"--executor must be one of {', '.join(EXECUTORS)}, got "
                             f"{self.kind!r}")
        for name, value, low in (("--nodes", self.nodes, 1),
                                 ("--gpus-per-node", self.gpus_per_node, 0),
                                 ("--cpus-per-task", self.cpus_per_task, 1),
                                 ("--time", self.time_min, 1),
                                 ("--max-parallel", self.max_parallel, 1)):
            if value is not None and value < low:
                raise InputError(f"{name} must be at least {low}, got {value}")
        slurm_only = {"--partition": self.partition, "--account": self.account,
                      "--constraint": self.constraint, "--cpus-per-task": self.cpus_per_task,
                      "--slurm": self.slurm or None,
                      "--nodes": self.nodes if self.nodes != 1 else None}
        jobs_only = {"--gpus-per-node": self.gpus_per_node or None, "--time": self.time_min,
                     "--max-parallel": self.max_parallel, "--jobs-dir": self.jobs_dir}
        given = [k for k, v in slurm_only.items() if v is not None and self.kind != "slurm"]
        if given:
            raise InputError(f"{', '.join(given)} only apply to --executor slurm")
        given = [k for k, v in jobs_only.items() if v is not None and self.kind == "inline"]
        if given:
            raise InputError(f"{', '.join(given)} only apply to --executor local or slurm")
        if self.kind != "inline":
            import_submitit()

    @property
    def poll(self) -> float:
        if self.poll_s is not None:
            return self.poll_s
        return 30.0 if self.kind == "slurm" else 0.5


def parse_slurm_settings(items: Sequence[str]) -> dict[str, Any]:
    """``["mail-type=END", "exclusive"]`` -> ``{"mail-type": "END", "exclusive": True}`` (a key
    alone is a flag)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().lstrip("-")
        if not key or (sep and not value.strip()):
            raise InputError(f"--slurm {item!r} must look like KEY=VALUE (or KEY for a flag)")
        out[key] = value.strip() if sep else True
    return out


def slurm_parameters(options: ExecutorOptions, name: str, kind: str = "train"
                     ) -> dict[str, Any]:
    """The parameters of ``submitit.SlurmExecutor.update_parameters`` for the jobs of ``kind``
    (``train``: ``--nodes`` nodes with one task per GPU, for DDP; ``eval``: one task, at most
    one GPU)."""
    gpus = options.gpus_per_node
    train = kind == "train"
    params: dict[str, Any] = {
        "job_name": name,
        "time": options.time_min or DEFAULT_SLURM_TIME_MIN,
        "nodes": options.nodes if train else 1,
        "ntasks_per_node": max(1, gpus) if train else 1,
        "signal_delay_s": SIGNAL_DELAY_S,
        "additional_parameters": {"requeue": True, **options.slurm},
    }
    if gpus:
        params["gpus_per_node"] = gpus if train else 1
    for key in ("partition", "cpus_per_task", "account", "constraint"):
        if getattr(options, key) is not None:
            params[key] = getattr(options, key)
    if options.max_parallel is not None:
        params["array_parallelism"] = options.max_parallel
    return params


def make_executor(options: ExecutorOptions, folder: str | Path, name: str,
                  kind: str = "train") -> Any:
    """The submitit executor of ``options`` (``local`` or ``slurm``) with its parameters."""
    submitit = import_submitit()
    if options.kind == "slurm":
        executor = submitit.SlurmExecutor(folder=folder)
        executor.update_parameters(**slurm_parameters(options, name, kind))
        return executor
    gpus = options.gpus_per_node if kind == "train" else min(options.gpus_per_node, 1)
    executor = submitit.LocalExecutor(folder=folder)
    executor.update_parameters(timeout_min=options.time_min or _NO_LIMIT_MIN,
                               tasks_per_node=max(1, gpus), gpus_per_node=gpus,
                               signal_delay_s=SIGNAL_DELAY_S)
    return executor


# --------------------------------------------------------------------------- the jobs
def _outcome(finished: bool, step: int | None = None, stop_reason: str | None = None
             ) -> dict[str, Any]:
    """What a job returns (submitit pickles it for the search): how far it got, and where."""
    return {"finished": finished, "step": step, "stop_reason": stop_reason,
            "pid": os.getpid(), "host": socket.gethostname()}


def _in_submitit(executor: str | None = None) -> bool:
    name = os.environ.get("SUBMITIT_EXECUTOR", "")
    return bool(name) and (executor is None or name == executor)


def _join_process_group() -> None:
    """Under submitit with several tasks: export the process group's environment of this task
    (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``; one GPU per task),
    so that the trainer joins it as it does under ``torchrun``."""
    if not _in_submitit():
        return
    import submitit

    if submitit.JobEnvironment().num_tasks > 1:
        submitit.helpers.TorchDistributedEnvironment().export(overwrite=True)


@contextmanager
def _signals_to_trainer(preempt_signals: Sequence[str]) -> Iterator[None]:
    """Within a submitit job: submitit's signal (sent before the time limit) is raised again as
    the trainer's first pre-emption signal, and a signal during start-up is recorded for the
    trainer to act on (as ``e2mc continue`` does). Without pre-emption signals, submitit's own
    handling stays."""
    from e2mc.config import resolve_signals
    from e2mc.training.preemption import PreemptionHandler

    signals = resolve_signals(preempt_signals)
    if not signals or not _in_submitit():
        yield
        return
    import submitit

    ours = submitit.JobEnvironment._usr_sig()
    previous = None
    if ours not in signals:
        previous = signal.signal(ours, lambda *_: signal.raise_signal(signals[0]))
    try:
        with PreemptionHandler(signals):
            yield
    finally:
        if previous is not None:
            signal.signal(ours, previous)


class _Checkpointable:
    """submitit's checkpoint protocol (``submitit.helpers.Checkpointable``, without importing
    submitit here): on its signal submitit calls :meth:`checkpoint` and requeues the job with
    what it returns, the same job, which starts again from what is on disk."""

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(self, *args, **kwargs)


class TrainJob(_Checkpointable):
    """One training run as a job: :func:`~e2mc.training.run.train_unless_done` of ``cfg`` in
    ``run_dir``."""

    def __init__(self, cfg: Any, run_dir: str | Path) -> None:
        self.cfg, self.run_dir = cfg, str(run_dir)

    def __call__(self) -> dict[str, Any]:
        from e2mc.training.preemption import (
            PREEMPTED_EXIT_CODE,
            PreemptedAtStart,
            is_preemption,
            requeue_slurm_job,
        )
        from e2mc.training.run import train_unless_done

        _join_process_group()
        # the trainer (main process) runs `scontrol requeue` on a pre-emption under SLURM
        trainer_requeues = bool(self.cfg.training.requeue and _in_submitit("slurm")
                                and os.environ.get("SLURM_JOB_ID"))
        with _signals_to_trainer(self.cfg.training.preempt_signals):
            try:
                result = train_unless_done(self.cfg, self.run_dir)
            except PreemptedAtStart as stop:
                if not trainer_requeues:
                    return _outcome(False, None, str(stop))
                if int(os.environ.get("RANK", "0")) == 0:
                    requeue_slurm_job()
                raise SystemExit(PREEMPTED_EXIT_CODE) from None
        if trainer_requeues and not result.finished and is_preemption(result.stop_reason):
            # no result: submitit's watcher sees the job queued again, and the requeued job
            # resumes the run from the checkpoint just written
            print(f"{self.run_dir}: {result.stop_reason}; requeued", file=sys.stderr)
            raise SystemExit(PREEMPTED_EXIT_CODE)
        return _outcome(result.finished, result.step, result.stop_reason)


class CallJob(_Checkpointable):
    """A job calling ``fn(**kwargs)`` (an importable function: an evaluation); it finishes when
    the call returns."""

    def __init__(self, fn: Callable[..., Any], kwargs: dict[str, Any]) -> None:
        self.fn, self.kwargs = fn, kwargs

    def __call__(self) -> dict[str, Any]:
        self.fn(**self.kwargs)
        return _outcome(True)


def evaluation_work(key: str, call: dict[str, Any]) -> Work:
    """``evaluate_checkpoint(**call)`` (:mod:`e2mc.evaluation.workflow`) as a unit of work in
    ``call["out"]``: done when that directory holds the same evaluation (the same checkpoint
    bytes, data and options: ``is_evaluated``), which is remembered once true."""
    from e2mc.evaluation.workflow import evaluate_checkpoint, is_evaluated

    known = [False]

    def done() -> bool:
        if not known[0]:
            known[0] = is_evaluated(**call)
        return known[0]

    return Work(key, CallJob(evaluate_checkpoint, call), Path(call["out"]), done)


# --------------------------------------------------------------------------- running them
@dataclass
class Work:
    """One unit of a search: ``key`` (its directory relative to the search directory), the
    ``job`` that does it, its ``directory`` (whose lock the job holds) and ``is_done``."""

    key: str
    job: Callable[[], dict[str, Any]]
    directory: Path
    is_done: Callable[[], bool]


@dataclass
class _Tracked:
    work: Work
    job_id: str
    job: Any  # a submitit Job (for a local job of an earlier search: paths only)
    log: Path
    foreign_pid: int | None = None  # a local job started by an earlier search
    slot: int | None = None  # local: which GPU slot it holds


class JobRunner:
    """Submits, records, waits for and checks the jobs of a search (see the module text)."""

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
        if options.kind == "local" and not options.gpus_per_node:
            import torch

            if torch.cuda.is_available():
                log("note: --executor local without --gpus-per-node: the jobs see no GPU "
                    "(submitit hides them) and train on the CPU")

    # ------------------------------------------------------------ the record
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

    # ------------------------------------------------------------ attaching
    def _attach(self, work: Work, entry: dict[str, Any]) -> _Tracked | None:
        """The recorded job of ``work`` if it is still queued or running, else ``None``."""
        import submitit

        if entry.get("executor") != self.options.kind or not entry.get("job_id"):
            return None
        job_id, folder = str(entry["job_id"]), Path(entry.get("folder", self.folder))
        tasks = list(range(int(entry.get("tasks", 1))))
        if self.options.kind == "slurm":
            job = submitit.SlurmJob(folder, job_id, tasks=tasks)
            if job.done(force_check=True):
                return None
            return _Tracked(work, job_id, job, _task0(job).paths.stderr)
        job = submitit.LocalJob(folder, job_id)
        pid = int(job_id)
        if _task0(job).paths.result_pickle.exists():  # it ended (its process may linger)
            return None
        if not (_local_controller_alive(pid) or live_writer(work.directory) is not None):
            return None
        return _Tracked(work, job_id, job, job.paths.stderr, foreign_pid=pid)

    # ------------------------------------------------------------ states
    def _state(self, t: _Tracked) -> str:
        """``queued``, ``running`` or ``ended``."""
        if _task0(t.job).paths.result_pickle.exists():  # (a local job's process may linger)
            return "ended"
        if t.foreign_pid is not None:
            alive = (_local_controller_alive(t.foreign_pid)
                     or live_writer(t.work.directory) is not None)
            return "running" if alive else "ended"
        if t.job.done():
            return "ended"
        if self.options.kind == "slurm" and str(t.job.state).upper() in _QUEUED_STATES:
            return "queued"
        return "running"

    def _result(self, t: _Tracked) -> tuple[str, Any]:
        """``("success", outcome)``, ``("error", traceback)`` or ``("missing", None)``."""
        from submitit.core.utils import pickle_load

        path = _task0(t.job).paths.result_pickle
        waited = 0.0
        while not path.exists() and self.options.kind == "slurm" and waited < 30:
            time.sleep(1.0)  # a shared file system may show the result late
            waited += 1.0
        if not path.exists():
            return "missing", None
        return pickle_load(path)

    # ------------------------------------------------------------ the loop
    def run(self, works: Sequence[Work], kind: str = "train",
            should_stop: Callable[[], bool] = lambda: False) -> None:
        """Bring every one of ``works`` to done: skip the done ones, wait for recorded jobs
        still in flight, submit the rest (at most ``max_parallel`` at a time), and return when
        all are done. A failed job is :class:`RunFailure` (its log tail printed first); a job
        that ended without finishing, or a stop request, is :class:`JobStopped`."""
        self.folder.mkdir(parents=True, exist_ok=True)
        record = self.read_record()
        done = [w for w in works if w.is_done()]
        tracked: list[_Tracked] = []
        pending: list[Work] = []
        for work in (w for w in works if not w.is_done()):
            attached = self._attach(work, record.get(work.key, {}))
            if attached is None:
                pending.append(work)
            else:
                tracked.append(attached)
                self.log(f"  waiting for job {attached.job_id} (still running): {work.key} "
                         f"(log {attached.log})")
        total = len(works)
        progress = _Progress(total, len(done), self.log, shown=self.progress)
        executor = make_executor(self.options, self.folder, self.name, kind) if pending else None
        limit = self.options.max_parallel or (len(pending) + len(tracked))
        free_slots = list(range(limit))
        for t in tracked:
            if free_slots:
                t.slot = free_slots.pop(0)
        finished = len(done)
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
                states = {id(t): self._state(t) for t in tracked}
                running = sum(1 for t in tracked if states[id(t)] == "running")
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
                progress.show(queued, running, finished)
                if pending or tracked:
                    time.sleep(self.options.poll)
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
                                "state": "submitted", "earlier": earlier}
            self.log(f"  job {tracked.job_id}: {work.key} (log {tracked.log})")
            out.append(tracked)
        self._write_record(record)
        return out

    def _ended(self, t: _Tracked, record: dict[str, dict[str, Any]]) -> None:
        """Check a job that ended: done, or :class:`RunFailure` / :class:`JobStopped`."""
        status, value = self._result(t)
        key = t.work.key
        if status == "success" and isinstance(value, dict) and value.get("finished") \
                and t.work.is_done():
            self._note(record, key, state="done", pid=value.get("pid"), host=value.get("host"))
            self.log(f"  job {t.job_id} done: {key}")
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
        self._note(record, key, state="stopped")
        how = (f"stopped at step {value.get('step')} ({value.get('stop_reason')})"
               if status == "success" and isinstance(value, dict)
               else "ended without a result (killed, or pre-empted and not requeued)")
        raise JobStopped(f"job {t.job_id} ({key}) {how}; run the same command again to resume "
                         f"it from its checkpoint; log {t.log}")


def _task0(job: Any) -> Any:
    return job.task(0) if getattr(job, "num_tasks", 1) > 1 else job


def _tail(log: Path, job: Any, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of the job's error log (else of its output log)."""
    for path in (log, _task0(job).paths.stdout):
        try:
            text = Path(path).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if text.strip():
            return "\n".join(text.rstrip().splitlines()[-lines:])
    return ""


def _local_controller_alive(pid: int) -> bool:
    """Whether ``pid`` is a live submitit local job controller on this machine."""
    if not process_alive(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # no /proc: a live pid is all we know
    return b"submitit.local._local" in cmdline


class _Progress:
    """The jobs' progress: a bar on a terminal (:func:`e2mc.progress.progress_bar`), else a
    line whenever a count changes; nothing when not ``shown`` (``--quiet``)."""

    def __init__(self, total: int, done: int, log: Callable[[str], None],
                 shown: bool = True) -> None:
        from e2mc.progress import is_terminal, progress_bar

        self.total, self.log, self.last, self.shown = total, log, None, shown
        self.bar = None
        if shown and is_terminal():
            self.bar = progress_bar(total=total, initial=done, desc="jobs", unit="job")

    def show(self, queued: int, running: int, done: int, failed: int = 0) -> None:
        counts = (queued, running, done, failed)
        if counts == self.last or not self.shown:
            return
        self.last = counts
        if self.bar is not None:
            self.bar.n = done
            self.bar.set_postfix_str(f"{queued} queued, {running} running, {failed} failed")
            return
        self.log(f"jobs: {queued} queued, {running} running, {done} done, {failed} failed "
                 f"(of {self.total})")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
