"""Continued pre-training and pre-training from a run configuration: one way in
(:func:`~e2mc.training.run.run_training`), the trainer, its callbacks, checkpoints and logging.
Heavy modules are imported lazily so that ``e2mc --help`` stays fast."""

from __future__ import annotations

from typing import Any

__all__ = ["NonFiniteLossError", "TrainResult", "continue_module", "run_training"]


def __getattr__(name: str) -> Any:
    if name == "TrainResult":
        from e2mc.training.result import TrainResult

        return TrainResult
    if name == "NonFiniteLossError":
        from e2mc.training.nonfinite import NonFiniteLossError

        return NonFiniteLossError
    if name in ("run_training", "continue_module"):
        from e2mc.training import run

        return getattr(run, name)
    raise AttributeError(f"module 'e2mc.training' has no attribute {name!r}")
