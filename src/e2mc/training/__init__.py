"""Continued pre-training (the paper's step 2) and pre-training from a run configuration
(:mod:`e2mc.config`): one way in (:func:`~e2mc.training.run.run_training`), the trainer (AMP,
DDP, exact resume), its callbacks, checkpoints and metric logging.

Heavy modules are imported lazily so that ``e2mc --help`` stays fast.
"""

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
