"""Trainer callbacks: what runs beside the loop without being part of it (the validation monitor,
keep-best, collapse warnings, pre-emption).

The trainer calls every callback on every process, in order, at three points; a callback that
only writes files or prints checks ``trainer.runtime.is_main`` itself. Its ``state_dict`` is
saved in the training checkpoint under its ``name`` and restored on resume, so a resumed run
continues with the same best value, patience counter or schedule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

    from e2mc.training.trainer import Trainer, TrainResult


class Callback:
    """Base class: every hook does nothing."""

    #: Key of the callback's state in the training checkpoint.
    name: str = "callback"

    def on_fit_start(self, trainer: Trainer, step: int) -> None:
        """Before the first step of this invocation; ``step`` is 0 for a fresh run (the weights
        are the starting model's) or the resumed step."""

    def on_step_end(self, trainer: Trainer, step: int, run_epoch: int,
                    terms: dict[str, torch.Tensor]) -> str | None:
        """After optimizer step ``step`` (1-based) and before the checkpoint decision.
        ``run_epoch`` counts completed epochs. Return a reason (a short sentence) to stop the
        run; the trainer then writes its checkpoint and ends."""
        return None

    def on_fit_end(self, trainer: Trainer, result: TrainResult) -> None:
        """After the last step of this invocation (not called when the run fails)."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
