"""Run logging: ``metrics.jsonl`` (one JSON object per logged step) and TensorBoard scalars.

Only the main process logs; on the others the logger is disabled and every call is a no-op.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from e2mc.artifacts import RunDir


class MetricsLogger:
    """Append metrics to ``run_dir/metrics.jsonl`` and ``run_dir/tensorboard`` (if importable).

    Each :meth:`log` call writes one line ``{"step": ..., "epoch": ..., <name>: value, ...}``
    with every name given; TensorBoard gets the numeric ones as scalars at ``step``.
    """

    def __init__(self, run_dir: str | Path, enabled: bool = True, tensorboard: bool = True) -> None:
        self.enabled = enabled
        self.run = RunDir(run_dir)
        self.path = self.run.metrics
        self._file = None
        self._writer = None
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                print("note: tensorboard is not installed; logging to metrics.jsonl only",
                      file=sys.stderr)
            else:
                self._writer = SummaryWriter(log_dir=str(self.run.tensorboard))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.enabled or self._file is None:
            return
        record = {"step": int(step), **{k: _plain(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(record, allow_nan=True) + "\n")
        self._file.flush()
        if self._writer is not None:
            for name, value in record.items():
                if name != "step" and isinstance(value, (int, float)) and math.isfinite(value):
                    self._writer.add_scalar(name, value, global_step=step)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _plain(value: Any) -> Any:
    """Tensors and numpy scalars to Python numbers."""
    if hasattr(value, "item"):
        return value.item()
    return value


def truncate_metrics(run_dir: str | Path, last_step: int) -> None:
    """:meth:`e2mc.artifacts.RunDir.truncate_metrics`."""
    RunDir(run_dir).truncate_metrics(last_step)


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """All records of ``run_dir``'s ``metrics.jsonl`` in order
    (:meth:`e2mc.artifacts.RunDir.read_metrics`)."""
    return RunDir(run_dir).read_metrics()
