"""Keep-best: the model of the step with the best validation metric so far, step 0 included,
written atomically as ``best.pt`` (so it is never worse than the starting model); optional
early stop."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from e2mc.training.callbacks import Callback

if TYPE_CHECKING:  # pragma: no cover
    from e2mc.training.callbacks import FitResult, TrainerView


class KeepBest(Callback):
    """Writes ``best.pt`` whenever ``metric`` (as the monitor logged it; runs after the monitor)
    improves, that is exceeds the best by more than ``min_delta`` (the first value always does);
    asks to stop after ``patience`` evaluations without an improvement."""

    name = "keep_best"

    def __init__(self, metric: str, patience: int | None = None, min_delta: float = 0.0) -> None:
        self.metric, self.patience, self.min_delta = metric, patience, min_delta
        self.best_value: float | None = None
        self.best_step: int | None = None
        self.best_epoch: int | None = None
        self.stale = 0
        self.trajectory: list[tuple[int, float]] = []  # (step, value) of every evaluation

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

    def _take(self, trainer: TrainerView, step: int, run_epoch: int) -> str | None:
        """Update from the validation values logged at ``step``, if any and not seen yet."""
        if self.trajectory and self.trajectory[-1][0] == step:
            return None
        values = {k: v for k, (at, v) in trainer.last_logged.items()
                  if at == step and k.startswith("val/")}
        if not values:
            return None
        if self.metric not in values:
            raise ValueError(f"keep-best's metric {self.metric} is not among the validation "
                             f"values ({', '.join(sorted(values))})")
        value = values[self.metric]
        self.trajectory.append((step, value))
        improved, stop = self.update(step, value, run_epoch)
        if improved:
            trainer.save_model(trainer.run.best, run_epoch, step)
        if stop:
            return (f"early stop: {self.metric} has not improved for {self.stale} "
                    f"evaluation(s) (best {self.best_value:.2f} at step {self.best_step})")
        return None

    def on_fit_start(self, trainer: TrainerView, step: int) -> None:
        self._take(trainer, step, 0)  # the starting model, scored at step 0

    def on_step_end(self, trainer: TrainerView, step: int, run_epoch: int,
                    terms: Any) -> str | None:
        return self._take(trainer, step, run_epoch)

    def on_fit_end(self, trainer: TrainerView, result: FitResult) -> None:
        self._take(trainer, result.step, result.run_epoch)  # the last step, scored at the end
        self.report(trainer)

    def report(self, trainer: TrainerView, file: Any = None) -> None:
        """Print the chosen step and the metric's trajectory (main process)."""
        file = sys.stderr if file is None else file
        if not trainer.runtime.is_main or self.best_step is None:
            return
        points = ", ".join(f"{int(s)}: {v:.2f}" for s, v in self.trajectory)
        print(f"{self.metric} by step: {points}", file=file)
        if self.best_step == 0:
            print(f"keep-best: no step beat the starting model on {self.metric} "
                  f"({self.best_value:.2f}); {trainer.run.best} is the starting model.", file=file)
        else:
            print(f"keep-best: step {self.best_step} (epoch {self.best_epoch}) has the best "
                  f"{self.metric}, {self.best_value:.2f}; saved as {trainer.run.best}.", file=file)
        print(next_steps(trainer), file=file)

    def state_dict(self) -> dict[str, Any]:
        return {"best_value": self.best_value, "best_step": self.best_step,
                "best_epoch": self.best_epoch, "stale": self.stale,
                "trajectory": [list(p) for p in self.trajectory]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (or an older checkpoint's monitor ``history``)."""
        self.best_value, self.best_step = state.get("best_value"), state.get("best_step")
        self.best_epoch = state.get("best_epoch")
        self.stale = int(state.get("stale", 0))
        if "trajectory" in state:
            self.trajectory = [(int(s), v) for s, v in state["trajectory"]]
        else:
            self.trajectory = [(int(h["step"]), h[self.metric])
                               for h in state.get("history", []) if self.metric in h]


def next_steps(trainer: TrainerView) -> str:
    """Commands (or, for a ``continue_module`` run, Python calls) that evaluate the kept model."""
    import shlex

    run, data = trainer.run.root, trainer.cfg.data
    hparams = getattr(trainer.method, "hparams", {}) or {}
    if "backbone_class" in hparams or hparams.get("backbone", "") is None:
        cls, where = hparams.get("backbone_class", "YourModule"), str(run)
        return (f"the run's answer is {trainer.run.best}. Its model is built around your own "
                f"module ({cls}), which the e2mc commands cannot rebuild; evaluate it in "
                "Python: from e2mc.evaluation import evaluate_module; evaluate_module("
                f"{cls}(), {where!r}, {str(data.dataset)!r}, {where + '-eval'!r}); compare it: "
                f"e2mc compare OTHER-EVAL {shlex.quote(where + '-eval')}; analyse it: from "
                "e2mc.diagnostics.analyze import analyze, module_loader; analyze(["
                f"{where!r}], {str(data.dataset)!r}, {where + '-analysis'!r}, "
                f"loader=module_loader({cls}()))")
    q = shlex.quote
    return (f"the run's answer is {trainer.run.best}; commands given {run} use it (--last: "
            f"the last step). Evaluate it: e2mc eval {q(str(run))} --data "
            f"{q(str(data.dataset))} --image-size {data.image_size} --out "
            f"{q(str(run) + '-eval')}; export it: e2mc export-backbone {q(str(run))} "
            f"{q(str(run) + '-backbone.pt')}")
