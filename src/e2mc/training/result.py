"""What :meth:`e2mc.training.trainer.Trainer.fit` did: the position reached and how it ended."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from torch import nn


@dataclass
class TrainResult:
    """What :meth:`Trainer.fit` did, or for a run already marked done (:meth:`done`) its marker."""

    run_epoch: int | None
    step: int
    skipped_steps: int
    completed: bool
    checkpoint: Path | None
    method: nn.Module | None = field(default=None, repr=False)  # (printed: pages of layers)
    stop_reason: str | None = None

    @classmethod
    def done(cls, checkpoint: Path, step: int, end: str | None) -> TrainResult:
        """A run marked done, not trained now (``trained`` False; no ``run_epoch``)."""
        return cls(None, step, 0, end == "completed", checkpoint,
                   stop_reason=None if end == "completed" else end)

    @property
    def trained(self) -> bool:
        """Whether this call trained (False: the run was marked done already)."""
        return self.method is not None

    @property
    def finished(self) -> bool:
        """Whether the run reached its configured end (epochs, ``max_steps`` or a callback's stop);
        a pre-empted run is not finished."""
        from e2mc.training.preemption import is_preemption

        return self.completed or (self.stop_reason is not None
                                  and not is_preemption(self.stop_reason))
