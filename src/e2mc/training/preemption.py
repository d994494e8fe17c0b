"""Pre-emption: stop at a step boundary on a signal, checkpoint, exit with a distinct code.

Clusters pre-empt jobs with a signal (SLURM: ``SIGTERM`` on ``scancel`` or on pre-emption,
``SIGUSR1`` or another one ahead of the time limit with ``#SBATCH --signal=B:USR1@120``, submitit's
``USR2``) and kill them some time later; a closed terminal sends ``SIGHUP``. What each signal means
is :data:`SIGNAL_TABLE` (the same table is in docs/cli.md): every one of them stops the run at a
step boundary with a checkpoint, and only a time-limit signal requeues the SLURM job
(:data:`REQUEUE_SIGNALS`); a ``SIGTERM`` comes from ``scancel`` (which must end the job) or from a
pre-emption that SLURM requeues itself, so the trainer does not requeue on it.
:class:`PreemptionHandler` only records the signal (nothing is done inside the handler, so a
checkpoint being written when it arrives is finished normally; checkpoints are written to a
temporary file and renamed, so even a kill during a write leaves the previous one intact). The
trainer polls :meth:`PreemptionHandler.should_stop` after every optimizer step, all processes agree
on the answer, and it then writes ``checkpoint.pt`` and stops. ``e2mc continue`` / ``e2mc
pretrain`` then exit with :data:`PREEMPTED_EXIT_CODE` (75, ``EX_TEMPFAIL``: "try again"), after
asking SLURM to requeue the job when the signal was a time-limit signal, ``SLURM_JOB_ID`` is set
and requeueing is on. Running the same command again resumes exactly.

DataLoader workers ignore the pre-emption signals (:func:`ignore_in_worker`): SLURM signals every
process of the job, and a worker killed by it would abort the step the trainer is finishing.

A signal during start-up (reading the configuration, loading the checkpoint and the data) is
recorded too: ``e2mc continue`` / ``pretrain`` install a handler first thing, a handler installed
later takes over what an earlier one recorded, and :class:`PreemptionCallback` then stops the run
before its first step with :class:`PreemptedAtStart` (exit code 75; nothing was trained, so
nothing is lost, and the next run starts or resumes as if this one had not been).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

from e2mc.config import resolve_signals
from e2mc.errors import E2MCError
from e2mc.training.callbacks import Callback

__all__ = [
    "DEFAULT_SIGNALS",
    "PREEMPTED_EXIT_CODE",
    "REQUEUE_SIGNALS",
    "SIGNAL_TABLE",
    "PREEMPTED_REASON",
    "PreemptedAtStart",
    "PreemptionCallback",
    "PreemptionHandler",
    "WorkerInit",
    "is_preemption",
    "ignore_in_worker",
    "note_time_limit",
    "requeue_slurm_job",
    "wants_requeue",
]

PREEMPTED_EXIT_CODE = 75  # sysexits.h EX_TEMPFAIL: a temporary failure, run again to resume
DEFAULT_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGHUP")

#: The pre-emption signals: (signal, who sends it, what the trainer does). Every one stops the run
#: after the step in flight with ``checkpoint.pt`` and exit code 75; docs/cli.md has this table.
SIGNAL_TABLE = (
    ("SIGUSR2", "submitit's --signal (USR2@delay before the time limit of a search's job)",
     "finish the step, checkpoint, requeue the job once (the trainer alone: submitit's own "
     "handler is replaced for the job's life), exit 75"),
    ("SIGUSR1", "#SBATCH --signal=B:USR1@T (time limit ahead) of a script of your own",
     "finish the step, checkpoint, requeue the job once, exit 75"),
    ("SIGTERM", "scancel, or a pre-emption that SLURM requeues itself (PreemptMode=REQUEUE)",
     "finish the step, checkpoint, exit 75; no requeue of our own (scancel ends the job)"),
    ("SIGHUP", "the terminal closed (a dropped ssh session)", "as SIGTERM"),
)
#: The signals that mean "the time limit is ahead": only these requeue the SLURM job.
REQUEUE_SIGNALS = frozenset({signal.SIGUSR1, signal.SIGUSR2})
_TIME_LIMIT_AHEAD = [False]  # set by note_time_limit (submitit's signal, raised on as another)


def note_time_limit() -> None:
    """Record that the time limit is ahead (submitit's signal arrived, and was raised again as
    one of the run's pre-emption signals): the run's stop then requeues the job."""
    _TIME_LIMIT_AHEAD[0] = True


def wants_requeue(received: signal.Signals | None) -> bool:
    """Whether a stop for ``received`` should requeue the SLURM job: a time-limit signal
    (:data:`REQUEUE_SIGNALS`), or any signal after :func:`note_time_limit`; never a plain
    ``SIGTERM`` / ``SIGHUP`` (:data:`SIGNAL_TABLE`)."""
    return _TIME_LIMIT_AHEAD[0] or received in REQUEUE_SIGNALS


class PreemptionHandler:
    """Records the first of ``signals`` received while installed (a context manager).

    ``should_stop()`` is true on every process once any process got a signal (an all-reduce when
    ``torch.distributed`` is initialised). Handlers are installed only in the main thread and the
    previous ones are restored on exit.
    """

    def __init__(self, signals: Sequence[str] | None = DEFAULT_SIGNALS) -> None:
        self.signals = resolve_signals(signals)
        self.received: signal.Signals | None = None
        self._previous: dict[signal.Signals, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signal.Signals(signum)

    def install(self) -> PreemptionHandler:
        """Handle the signals (main thread only); a signal that an installed
        :class:`PreemptionHandler` recorded before counts as received by this one too."""
        import threading

        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                if sig not in self._previous:
                    self._previous[sig] = signal.signal(sig, self._handle)
                    self._adopt(self._previous[sig])
        return self

    def _adopt(self, previous: Any) -> None:
        earlier = getattr(previous, "__self__", None)
        if self.received is None and isinstance(earlier, PreemptionHandler) \
                and earlier.received in self.signals:
            self.received = earlier.received

    def retarget(self, signals: Sequence[str] | None) -> None:
        """Handle ``signals`` from now on (once the configuration names them): a signal no
        longer handled gets its previous handler back, and if it was the one recorded, it is
        raised again for that handler (the process ends as it would have without this one)."""
        new = resolve_signals(signals)
        installed = bool(self._previous)
        for sig in [s for s in self._previous if s not in new]:
            signal.signal(sig, self._previous.pop(sig))
        dropped = self.received if self.received is not None and self.received not in new \
            else None
        self.signals = new
        if dropped is not None:
            self.received = None
            signal.raise_signal(dropped)
        if installed:
            self.install()

    def uninstall(self) -> None:
        """Restore the previous handlers; a signal recorded here is handed on to an enclosing
        :class:`PreemptionHandler` (e.g. the search's, when a run's last step got it), so it
        is not lost when it came too late for this one to act on."""
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
            earlier = getattr(previous, "__self__", None)
            if sig == self.received and isinstance(earlier, PreemptionHandler) \
                    and earlier.received is None:
                earlier.received = sig
        self._previous.clear()

    def __enter__(self) -> PreemptionHandler:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    @property
    def requested(self) -> bool:
        """Whether this process received a pre-emption signal."""
        return self.received is not None

    def should_stop(self, device: torch.device | None = None) -> bool:
        """Whether any process received a signal (collective under ``torch.distributed``)."""
        if not (dist.is_available() and dist.is_initialized()):
            return self.requested
        flag = torch.tensor([int(self.requested)], dtype=torch.int32,
                            device=device or torch.device("cpu"))
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


def ignore_in_worker(signals: Sequence[str] | None = DEFAULT_SIGNALS) -> None:
    """In a DataLoader worker: ignore the pre-emption signals (the main process decides)."""
    for sig in resolve_signals(signals):
        signal.signal(sig, signal.SIG_IGN)


class WorkerInit:
    """A picklable ``worker_init_fn`` calling :func:`ignore_in_worker` (then ``inner``)."""

    def __init__(self, signals: Sequence[str] | None, inner: Any = None) -> None:
        self.signals, self.inner = signals, inner

    def __call__(self, worker_id: int) -> None:
        ignore_in_worker(self.signals)
        if self.inner is not None:
            self.inner(worker_id)


def requeue_slurm_job(environ: dict[str, str] | None = None) -> bool:
    """``scontrol requeue $SLURM_JOB_ID`` (``ARRAY_TASK`` for a task of a job array) when
    ``SLURM_JOB_ID`` is set; returns whether it ran
    and succeeded (a failure is reported on stderr, not raised: the checkpoint is written)."""
    env = os.environ if environ is None else environ
    job = env.get("SLURM_JOB_ID")
    if not job:
        return False
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        # a task of an array: its own id is ARRAY_TASK (the array's id would requeue them all)
        job = f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    try:
        done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True,
                              timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        print(f"warning: could not requeue SLURM job {job}: {err}", file=sys.stderr)
        return False
    if done.returncode != 0:
        print(f"warning: scontrol requeue {job} failed: {done.stderr.strip()}", file=sys.stderr)
        return False
    print(f"requeued SLURM job {job}", file=sys.stderr)
    return True


PREEMPTED_REASON = "pre-empted by "


class PreemptedAtStart(E2MCError):
    """A pre-emption signal arrived before the first step of this invocation: the run stops
    without a step (nothing to save) and the command exits with :data:`PREEMPTED_EXIT_CODE`."""

    exit_code = PREEMPTED_EXIT_CODE

    def __init__(self, received: signal.Signals | str) -> None:
        #: the signal, when this process received it (else the text "another process")
        self.signal = received if isinstance(received, signal.Signals) else None
        name = received.name if isinstance(received, signal.Signals) else received
        super().__init__(f"{PREEMPTED_REASON}{name} before the first step")


def is_preemption(stop_reason: str | None) -> bool:
    """Whether a run's ``stop_reason`` says it stopped for a pre-emption signal."""
    return bool(stop_reason) and stop_reason.startswith(PREEMPTED_REASON)


class PreemptionCallback(Callback):
    """The trainer side: installs the handler for the run, makes the DataLoader workers ignore the
    signals, and after each step stops the run (the trainer then writes ``checkpoint.pt``) once
    any process got one. On the way out the main process requeues the SLURM job when
    ``requeue`` is on and ``SLURM_JOB_ID`` is set."""

    name = "preemption"

    def __init__(self, signals: Sequence[str] | None = DEFAULT_SIGNALS,
                 requeue: bool = True) -> None:
        self.handler = PreemptionHandler(signals)
        self.requeue = requeue
        self.requeued = False

    def on_fit_start(self, trainer: Any, step: int) -> None:
        """Install the handler (taking over a signal recorded during start-up) and stop before
        the first step, on every process, when any process got one."""
        self.handler.install()
        if self.handler.signals and self.handler.should_stop(self._device(trainer)):
            received = self.handler.received or "another process"
            self.handler.uninstall()
            raise PreemptedAtStart(received)
        loader = getattr(trainer, "loader", None)
        if loader is not None and loader.num_workers > 0:
            loader.worker_init_fn = WorkerInit(self.handler.signals, loader.worker_init_fn)

    @staticmethod
    def _device(trainer: Any) -> torch.device | None:
        return trainer.runtime.device if dist.is_available() and dist.is_initialized() else None

    def on_step_end(self, trainer: Any, step: int, run_epoch: int, terms: Any) -> str | None:
        if not self.handler.signals:
            return None
        if self.handler.should_stop(self._device(trainer)):
            name = self.handler.received.name if self.handler.received else "another process"
            return f"{PREEMPTED_REASON}{name} after step {step}"
        return None

    def on_fit_end(self, trainer: Any, result: Any) -> None:
        self.handler.uninstall()
        if is_preemption(getattr(result, "stop_reason", None)) and self.requeue \
                and trainer.runtime.is_main and wants_requeue(self.handler.received):
            self.requeued = requeue_slurm_job()
