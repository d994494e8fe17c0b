"""Continued pre-training and pre-training from a run configuration: one way in
(:func:`~e2mc.training.run.run_training`), the trainer, its callbacks, checkpoints and logging.
Heavy modules are imported lazily so that ``e2mc --help`` stays fast."""

from __future__ import annotations

from typing import Any

__all__ = ["NonFiniteLossError", "TrainResult", "continue_module", "run_training"]


#: Where each public name lives (imported on first use).
_MODULES = {"TrainResult": "result", "NonFiniteLossError": "nonfinite", "run_training": "run",
            "continue_module": "run"}


def __getattr__(name: str) -> Any:
    if name not in _MODULES:
        raise AttributeError(f"module 'e2mc.training' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"e2mc.training.{_MODULES[name]}"), name)
