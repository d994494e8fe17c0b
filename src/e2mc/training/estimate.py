"""The run's estimate of its remaining time: once the first steps are timed, one ``estimate:``
line on stderr and a ``time/estimated_remaining_s`` record. The first ``warmup`` steps (workers
starting, cuDNN, compile) are left out; monitor evaluations and checkpoints are not counted."""

from __future__ import annotations

import sys
import time
from typing import Any

from e2mc.training.callbacks import Callback, TrainerView


def duration(seconds: float) -> str:
    """``45 s``, ``12.5 min``, ``3.2 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


class RunEstimate(Callback):
    """Prints the estimate once per invocation (main process) and logs it."""

    name = "estimate"

    def __init__(self, warmup: int = 5, min_steps: int = 10, min_seconds: float = 5.0,
                 stream: Any = None) -> None:
        self.warmup, self.min_steps, self.min_seconds = warmup, min_steps, min_seconds
        self.stream = stream
        self._start: tuple[int, float] | None = None
        self._done = False

    def on_fit_start(self, trainer: TrainerView, step: int) -> None:
        self._start, self._done = None, False
        self._first = step

    def on_step_end(self, trainer: TrainerView, step: int, run_epoch: int,
                    terms: Any) -> str | None:
        if self._done or step - self._first < self.warmup:
            return None
        now = time.perf_counter()
        if self._start is None:
            self._start = (step, now)
            return None
        steps, seconds = step - self._start[0], now - self._start[1]
        if steps < self.min_steps or seconds < self.min_seconds:
            return None
        self._done = True
        per_step = seconds / steps
        left = max(trainer.total_steps - step, 0)
        remaining = left * per_step
        images = trainer.cfg.training.batch_size / per_step
        if trainer.runtime.is_main:
            print(f"estimate: {per_step:.3g} s per step ({images:,.0f} images/s over steps "
                  f"{self._start[0] + 1}-{step}); {left} step(s) left: about "
                  f"{duration(remaining)} more of training (validation evaluations and "
                  "checkpoints come on top)", file=self.stream or sys.stderr, flush=True)
        trainer.log(step, {"time/seconds_per_step": per_step,
                           "time/estimated_remaining_s": remaining})
        return None
