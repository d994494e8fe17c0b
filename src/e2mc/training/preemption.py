"""Pre-emption: stop at a step boundary on a signal, checkpoint, exit with a distinct code (75).

What each signal means is :data:`SIGNAL_TABLE` (also in docs/cli.md); only a time-limit signal
requeues the SLURM job. The handler only records the signal (a checkpoint being written is
finished normally); the trainer polls :meth:`PreemptionHandler.should_stop` after every step.
A signal during start-up is taken over by the handler installed later and stops the run before
its first step (:class:`PreemptedAtStart`). DataLoader workers ignore the signals: SLURM signals
every process, and a killed worker would abort the step being finished.
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

PREEMPTED_EXIT_CODE = 75  # sysexits.h EX_TEMPFAIL: a temporary failure, run again to resume
DEFAULT_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGHUP")

#: The pre-emption signals: (signal, who sends it, what the trainer does); docs/cli.md has it.
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
    """Record that the time limit is ahead (submitit's signal): the run's stop then requeues."""
    _TIME_LIMIT_AHEAD[0] = True


def wants_requeue(received: signal.Signals | None) -> bool:
    """Whether a stop for ``received`` requeues the SLURM job: a time-limit signal, or any
    after :func:`note_time_limit`."""
    return _TIME_LIMIT_AHEAD[0] or received in REQUEUE_SIGNALS


class PreemptionHandler:
    """Records the first of ``signals`` received while installed (a context manager; main
    thread only; the previous handlers are restored on exit)."""

    def __init__(self, signals: Sequence[str] | None = DEFAULT_SIGNALS) -> None:
        self.signals = resolve_signals(signals)
        self.received: signal.Signals | None = None
        self._previous: dict[signal.Signals, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signal.Signals(signum)

    def install(self) -> PreemptionHandler:
        """Handle the signals; one an earlier installed handler recorded counts here too."""
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
        """Handle ``signals`` from now on: one no longer handled gets its previous handler
        back, and if it was the one recorded, it is raised again for that handler."""
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
        """Restore the previous handlers, handing a signal recorded here on to an enclosing
        :class:`PreemptionHandler` (it may have come too late for this one to act on)."""
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


class WorkerInit:
    """A picklable ``worker_init_fn``: the worker ignores the signals (then calls ``inner``)."""

    def __init__(self, signals: Sequence[str] | None, inner: Any = None) -> None:
        self.signals, self.inner = signals, inner

    def __call__(self, worker_id: int) -> None:
        for sig in resolve_signals(self.signals):
            signal.signal(sig, signal.SIG_IGN)
        if self.inner is not None:
            self.inner(worker_id)


def requeue_slurm_job(environ: dict[str, str] | None = None) -> bool:
    """``scontrol requeue`` this SLURM job (or array task); returns whether it succeeded (a
    failure is reported on stderr, not raised: the checkpoint is written)."""
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
    """A pre-emption signal arrived before the first step: nothing to save, exit 75."""

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
    """Installs the handler for the run, makes the loader's workers ignore the signals, stops
    the run after a step once any process got one, and requeues the SLURM job on the way out."""

    name = "preemption"

    def __init__(self, signals: Sequence[str] | None = DEFAULT_SIGNALS,
                 requeue: bool = True) -> None:
        self.handler = PreemptionHandler(signals)
        self.requeue = requeue

    def on_fit_start(self, trainer: Any, step: int) -> None:
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
            requeue_slurm_job()
