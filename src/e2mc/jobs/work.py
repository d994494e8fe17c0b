"""The jobs: :class:`TrainJob` (one training run) and :class:`CallJob` (one evaluation), picklable
callables that submitit runs in a process of their own or as a SLURM job, and :class:`Work`, one
unit of a search or an evaluation set."""

from __future__ import annotations

import os
import signal
import socket
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def _outcome(finished: bool, step: int | None = None, stop_reason: str | None = None
             ) -> dict[str, Any]:
    """What a job returns (submitit pickles it for the search): how far it got, and where."""
    return {"finished": finished, "step": step, "stop_reason": stop_reason,
            "pid": os.getpid(), "host": socket.gethostname()}


def _in_submitit(executor: str | None = None) -> bool:
    name = os.environ.get("SUBMITIT_EXECUTOR", "")
    return bool(name) and (executor is None or name == executor)


def _join_process_group() -> None:
    """With several submitit tasks: export the process group's environment (as torchrun)."""
    if not _in_submitit():
        return
    import submitit

    if submitit.JobEnvironment().num_tasks > 1:
        submitit.helpers.TorchDistributedEnvironment().export(overwrite=True)


@contextmanager
def _signals_to_trainer(preempt_signals: Sequence[str]) -> Iterator[None]:
    """Within a submitit job: submitit's ``USR2`` (the time limit ahead) is noted as such and
    raised again as the trainer's first pre-emption signal, so that its stop checkpoints, then
    requeues; a signal during start-up is recorded for the trainer. submitit's own handler would
    requeue at once and race the checkpoint, so it is not put back. Without pre-emption signals,
    submitit's own handling stays."""
    from e2mc.config import resolve_signals
    from e2mc.training.preemption import REQUEUE_SIGNALS, PreemptionHandler, note_time_limit

    signals = resolve_signals(preempt_signals)
    if not signals or not _in_submitit():
        yield
        return
    import submitit

    ours = submitit.JobEnvironment._usr_sig()

    # raised on as the run's own time-limit signal where it has one (named in the stop reason)
    raised = next((s for s in signals if s in REQUEUE_SIGNALS), signals[0])

    def time_limit(signum: int, frame: Any) -> None:
        note_time_limit()
        os.write(2, f"submitit's {signal.Signals(signum).name}: the time limit is ahead; "
                    f"stopping after the step in flight ({raised.name})\n".encode())
        signal.raise_signal(raised)

    if ours not in signals:
        signal.signal(ours, time_limit)
    try:
        with PreemptionHandler(signals):
            yield
    finally:
        signal.signal(ours, signal.SIG_IGN)


class _Checkpointable:
    """submitit's checkpoint protocol (without importing submitit here): on its signal the
    same job is requeued and starts again from what is on disk."""

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(self, *args, **kwargs)


class TrainJob(_Checkpointable):
    """One training run as a job: ``run_training(cfg, run_dir, done_marker=True)``."""

    def __init__(self, cfg: Any, run_dir: str | Path) -> None:
        self.cfg, self.run_dir = cfg, str(run_dir)

    def __call__(self) -> dict[str, Any]:
        from e2mc.training.preemption import (
            PREEMPTED_EXIT_CODE,
            PreemptedAtStart,
            is_preemption,
            requeue_slurm_job,
            wants_requeue,
        )
        from e2mc.training.run import run_training

        _join_process_group()
        under_slurm = _in_submitit("slurm") and bool(os.environ.get("SLURM_JOB_ID"))
        with _signals_to_trainer(self.cfg.training.preempt_signals):
            try:
                result = run_training(self.cfg, self.run_dir, done_marker=True)
            except PreemptedAtStart as stop:
                if not under_slurm:
                    return _outcome(False, None, str(stop))
                print(f"{self.run_dir}: {stop}", file=sys.stderr)
                if self.cfg.training.requeue and int(os.environ.get("RANK", "0")) == 0 \
                        and wants_requeue(stop.signal):
                    requeue_slurm_job()
                raise SystemExit(PREEMPTED_EXIT_CODE) from None
        if under_slurm and not result.finished and is_preemption(result.stop_reason):
            # no result: requeued (by the trainer after its checkpoint, or by SLURM) or cancelled
            print(f"{self.run_dir}: {result.stop_reason}; checkpoint at step {result.step}",
                  file=sys.stderr)
            raise SystemExit(PREEMPTED_EXIT_CODE)
        return _outcome(result.finished, result.step, result.stop_reason)


class CallJob(_Checkpointable):
    """A job calling ``fn(**kwargs)`` (an importable function: an evaluation)."""

    def __init__(self, fn: Callable[..., Any], kwargs: dict[str, Any]) -> None:
        self.fn, self.kwargs = fn, kwargs

    def __call__(self) -> dict[str, Any]:
        self.fn(**self.kwargs)
        return _outcome(True)


def evaluation_work(key: str, call: dict[str, Any]) -> Work:
    """``evaluate_checkpoint(**call)`` as a unit of work in ``call["out"]``, done when that
    directory holds the same evaluation (``is_evaluated``, remembered once true)."""
    from e2mc.evaluation.workflow import evaluate_checkpoint, is_evaluated

    known = [False]

    def done() -> bool:
        if not known[0]:
            known[0] = is_evaluated(**call)
        return known[0]

    return Work(key, CallJob(evaluate_checkpoint, call), Path(call["out"]), done)


@dataclass
class Work:
    """One unit of a search: ``key`` (its directory relative to the search directory), the
    ``job`` that does it, its ``directory`` (whose lock the job holds) and ``is_done``."""

    key: str
    job: Callable[[], dict[str, Any]]
    directory: Path
    is_done: Callable[[], bool]
