"""Keep-best: the model of the step with the best validation metric so far, step 0 (the model the
run started from) included, written atomically as ``best.pt``; optional early stop.

A run with ``--keep-best`` therefore never hands back a model that is worse on the validation
split than the one it was given: when no step beats the starting model, ``best.pt`` *is* the
starting model and the run says so.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from e2mc.training.trainer import Trainer, TrainResult


def print_trajectory(history: list[dict[str, float]], metric: str, file: Any = None) -> None:
    """``step -> value`` of ``metric`` on one line (to ``file``, default stderr)."""
    file = sys.stderr if file is None else file
    points = ", ".join(f"{int(h['step'])}: {h[metric]:.2f}" for h in history if metric in h)
    print(f"{metric} by step: {points}", file=file)


class BestTracker:
    """The pure rule: a value is an improvement when it exceeds the best so far by more than
    ``min_delta`` (the first value always is); after ``patience`` evaluations in a row without
    one, :meth:`update` asks to stop."""

    def __init__(self, patience: int | None = None, min_delta: float = 0.0) -> None:
        self.patience, self.min_delta = patience, min_delta
        self.best_value: float | None = None
        self.best_step: int | None = None
        self.best_epoch: int | None = None
        self.stale = 0

    def update(self, step: int, value: float, run_epoch: int = 0) -> tuple[bool, bool]:
        """``(improved, stop)`` after the value of ``step``."""
        if value != value:  # NaN never improves
            improved = False
        else:
            improved = self.best_value is None or value > self.best_value + self.min_delta
        if improved:
            self.best_value, self.best_step, self.best_epoch = value, step, run_epoch
            self.stale = 0
        else:
            self.stale += 1
        return improved, self.patience is not None and self.stale >= self.patience

    def state_dict(self) -> dict[str, Any]:
        return {"best_value": self.best_value, "best_step": self.best_step,
                "best_epoch": self.best_epoch, "stale": self.stale}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best_value = state.get("best_value")
        self.best_step = state.get("best_step")
        self.best_epoch = state.get("best_epoch")
        self.stale = int(state.get("stale", 0))


class KeepBest:
    """Writes ``best.pt`` (the run directory's :attr:`~e2mc.artifacts.RunDir.best`) whenever
    ``metric`` improves; used by :class:`~e2mc.training.monitor.ValidationMonitor`, which saves
    this object's state with its own."""

    def __init__(self, metric: str, patience: int | None = None, min_delta: float = 0.0) -> None:
        self.metric = metric
        self.tracker = BestTracker(patience, min_delta)

    def update(self, trainer: Trainer, step: int, run_epoch: int,
               values: dict[str, float]) -> str | None:
        improved, stop = self.tracker.update(step, values[self.metric], run_epoch)
        if improved:
            trainer.save_model(trainer.run.best, run_epoch, step)
        if stop:
            return (f"early stop: {self.metric} has not improved for {self.tracker.stale} "
                    f"evaluation(s) (best {self.tracker.best_value:.2f} at step "
                    f"{self.tracker.best_step})")
        return None

    def report(self, trainer: Trainer, result: TrainResult, file: Any = None) -> None:
        """Print the chosen step and the metric's trajectory (main process; to ``file``,
        default stderr)."""
        file = sys.stderr if file is None else file
        if not trainer.runtime.is_main or self.tracker.best_step is None:
            return
        monitor = next((cb for cb in trainer.callbacks if cb.name == "monitor"), None)
        if monitor is not None:
            print_trajectory(monitor.history, self.metric, file)
        t = self.tracker
        if t.best_step == 0:
            print(f"keep-best: no step beat the starting model on {self.metric} "
                  f"({t.best_value:.2f}); {trainer.run.best} is the starting model.", file=file)
        else:
            print(f"keep-best: step {t.best_step} (epoch {t.best_epoch}) has the best "
                  f"{self.metric}, {t.best_value:.2f}; saved as {trainer.run.best}.", file=file)
        run, data = trainer.run.root, trainer.cfg.data
        print(f"the run's answer is {trainer.run.best}; commands given {run} use it (--last: "
              f"the last step). Evaluate it: e2mc eval {run} --data {data.dataset} "
              f"--image-size {data.image_size} --out {run}-eval; export it: e2mc "
              f"export-backbone {run} {run}-backbone.pt", file=file)

    def state_dict(self) -> dict[str, Any]:
        return self.tracker.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.tracker.load_state_dict(state)
