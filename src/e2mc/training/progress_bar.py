"""The training progress bar (main process, ``training.progress``): one bar per epoch with the
images per second, the losses and the latest validation value."""

from __future__ import annotations

from typing import Any

from e2mc import progress
from e2mc.training.callbacks import Callback, FitResult, TrainerView


def progress_bar(total: int, initial: int, desc: str) -> Any:
    """One epoch's bar on stderr (:func:`e2mc.progress.progress_bar`)."""
    return progress.progress_bar(total=total, initial=initial, unit="step", desc=desc,
                                 dynamic_ncols=True, mininterval=1.0)


def postfix(metrics: dict[str, Any]) -> dict[str, str]:
    """The bar's fields from a training record."""
    shown = {"img/s": f"{metrics['images_per_s']:.0f}", "loss": f"{metrics['loss']:.4g}"}
    for key in ("base/loss", "addon/loss"):
        shown[key.split("/")[0]] = f"{metrics[key]:.4g}"
    return shown


class ProgressBar(Callback):
    """Advances the epoch's bar every step, showing the logged record and ``val_metric``."""

    name = "progress"

    def __init__(self, val_metric: str = "val/knn") -> None:
        self.val_metric = val_metric
        self.bar: Any = None

    def on_epoch_start(self, trainer: TrainerView, run_epoch: int, start_batch: int) -> None:
        if trainer.runtime.is_main and trainer.cfg.training.progress:
            self.bar = progress_bar(trainer.steps_per_epoch, start_batch,
                                    f"epoch {run_epoch + 1}/{trainer.cfg.training.epochs}")

    def on_step_end(self, trainer: TrainerView, step: int, run_epoch: int, terms: Any) -> None:
        if self.bar is None:
            return
        logged = trainer.last_logged
        if logged.get("loss", (None,))[0] == step:  # the trainer logged this step
            fields = postfix({k: v for k, (s, v) in logged.items() if s == step})
            if self.val_metric in logged:
                fields["val"] = f"{logged[self.val_metric][1]:.2f}"
            self.bar.set_postfix(fields, refresh=False)  # before the update that draws it:
        self.bar.update(1)  # the line that says step N shows step N's values

    def on_epoch_end(self, trainer: TrainerView, run_epoch: int, step: int) -> None:
        self._close()

    def on_fit_end(self, trainer: TrainerView, result: FitResult) -> None:
        self._close()

    def _close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
