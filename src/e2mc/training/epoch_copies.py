"""Epoch copies: the model-only checkpoint ``checkpoints/epoch_XXXX.pt`` of the weights at the
start (epoch 0) and at the end of every epoch, for accuracy-vs-epoch curves
(``training.keep_epoch_checkpoints``)."""

from __future__ import annotations

import sys

from e2mc.training.callbacks import Callback, TrainerView


class EpochCopies(Callback):
    """Writes the copy of epoch 0 and one after each epoch; after a resume it writes the copy a
    kill interrupted and names the ones that cannot be recreated."""

    name = "epoch_copies"

    def on_fit_start(self, trainer: TrainerView, step: int) -> None:
        if not trainer.cfg.training.keep_epoch_checkpoints:
            return
        if step == 0:
            trainer.save_model(trainer.run.epoch_checkpoint(0), 0, 0)
            return
        if not trainer.runtime.is_main:
            return
        run, run_epoch = trainer.run, trainer.start_epoch
        have = {epoch for epoch, _ in run.epoch_checkpoints()}
        missing = [e for e in range(run_epoch + 1) if e not in have]
        # resumed at the end of an epoch whose copy a kill interrupted: these are its weights
        if step == run_epoch * trainer.steps_per_epoch and run_epoch in missing:
            trainer.save_model(run.epoch_checkpoint(run_epoch), run_epoch, step)
            print(f"wrote the missing {run.epoch_checkpoint(run_epoch)}", file=sys.stderr)
            missing.remove(run_epoch)
        if missing:
            print(f"warning: {run.epoch_dir} lacks the copies of epoch(s) "
                  f"{', '.join(map(str, missing))}, whose weights are gone (the run was "
                  "interrupted or keep_epoch_checkpoints was off)", file=sys.stderr)

    def on_epoch_end(self, trainer: TrainerView, run_epoch: int, step: int) -> None:
        if trainer.cfg.training.keep_epoch_checkpoints:
            trainer.save_model(trainer.run.epoch_checkpoint(run_epoch), run_epoch, step)
