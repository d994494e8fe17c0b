"""The training progress bar (main process, ``training.progress``): one bar per epoch with the
images per second, the losses and the latest validation value."""

from __future__ import annotations

from typing import Any

from e2mc.progress import progress_bar
from e2mc.training.callbacks import Callback, FitResult, TrainerView


class ProgressBar(Callback):
    """Advances the epoch's bar every step, showing the logged record and ``val_metric``."""

    name = "progress"

    def __init__(self, val_metric: str = "val/knn") -> None:
        self.val_metric = val_metric
        self.bar: Any = None

    def on_epoch_start(self, trainer: TrainerView, run_epoch: int, start_batch: int) -> None:
        if trainer.runtime.is_main and trainer.cfg.training.progress:
            self.bar = progress_bar(
                total=trainer.steps_per_epoch, initial=start_batch, unit="step",
                desc=f"epoch {run_epoch + 1}/{trainer.cfg.training.epochs}", mininterval=1.0)

    def on_step_end(self, trainer: TrainerView, step: int, run_epoch: int, terms: Any) -> None:
        if self.bar is None:
            return
        logged = {k: v for k, (s, v) in trainer.last_logged.items() if s == step}
        if "loss" in logged:  # the trainer logged this step
            fields = {"img/s": f"{logged['images_per_s']:.0f}", "loss": f"{logged['loss']:.4g}",
                      "base": f"{logged['base/loss']:.4g}", "addon": f"{logged['addon/loss']:.4g}"}
            if self.val_metric in trainer.last_logged:
                fields["val"] = f"{trainer.last_logged[self.val_metric][1]:.2f}"
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
