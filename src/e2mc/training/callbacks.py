"""Trainer callbacks: what runs beside the loop. Every callback runs on every process (one
that writes checks ``trainer.runtime.is_main``), sees the trainer as a :class:`TrainerView`,
and has its ``state_dict`` saved in the training checkpoint under its ``name``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # pragma: no cover - typing only
    from pathlib import Path

    import torch
    from torch.utils.data import DataLoader

    from e2mc.artifacts import RunDir
    from e2mc.config import RunConfig
    from e2mc.distributed import Runtime


class TrainerView(Protocol):
    """What a callback may use of the trainer that calls it."""

    runtime: Runtime
    #: not its DDP wrapper
    method: torch.nn.Module
    cfg: RunConfig
    run: RunDir
    #: its ``dataset`` yields ``(index, seed)`` items
    loader: DataLoader
    #: Completed epochs when this invocation started (the resumed checkpoint's; 0 when fresh).
    start_epoch: int

    @property
    def steps_per_epoch(self) -> int: ...

    @property
    def total_steps(self) -> int: ...

    @property
    def last_logged(self) -> Mapping[str, tuple[int, Any]]:
        """Every key logged in this invocation: its last ``(step, value)``, on every process."""
        ...

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """One record of ``metrics.jsonl`` / TensorBoard (written by the main process)."""

    def fixed_views(self, n: int) -> list[torch.Tensor]:
        """The views of the first ``n`` training images (the same at every call), as a step
        takes them."""
        ...

    def save_model(self, path: Path, run_epoch: int, step: int) -> None:
        """A model-only checkpoint of the current weights at ``path`` (main process writes)."""


class FitResult(Protocol):
    """What :meth:`Callback.on_fit_end` reads of how the invocation ended."""

    run_epoch: int
    step: int
    stop_reason: str | None


class Callback:
    """Base class: every hook does nothing."""

    #: Key of the callback's state in the training checkpoint.
    name: str = "callback"

    def on_fit_start(self, trainer: TrainerView, step: int) -> None:
        """Before the first step of this invocation (``step``: 0, or the resumed step)."""

    def on_epoch_start(self, trainer: TrainerView, run_epoch: int, start_batch: int) -> None:
        """Before the first batch of an epoch (``start_batch`` > 0: resumed in its middle)."""

    def on_step_end(self, trainer: TrainerView, step: int, run_epoch: int,
                    terms: dict[str, torch.Tensor]) -> str | None:
        """After optimizer step ``step`` (1-based), before the checkpoint decision; return a
        reason to stop the run (the trainer then checkpoints and ends)."""
        return None

    def on_epoch_end(self, trainer: TrainerView, run_epoch: int, step: int) -> None:
        """After the last step of an epoch and its checkpoint (``run_epoch`` epochs done)."""

    def on_fit_end(self, trainer: TrainerView, result: FitResult) -> None:
        """After the last step of this invocation (not called when the run fails)."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
