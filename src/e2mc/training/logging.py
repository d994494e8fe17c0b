"""Run logging by the main process: ``metrics.jsonl``, TensorBoard scalars, and optionally
Weights & Biases (``logging.wandb: true``, the ``[wandb]`` extra)."""

from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path
from typing import Any

from e2mc.artifacts import RunDir

#: The optional extras this process has already printed a "not installed" note about.
_NOTED: set[str] = set()


class MetricsLogger:
    """Each :meth:`log` writes one line ``{"step": ..., <name>: value, ...}`` to ``metrics.jsonl``;
    TensorBoard and wandb get the finite numbers. ``logging.tensorboard`` None: used when
    installed, silently; True: a missing package is one note; False: off."""

    def __init__(self, run_dir: str | Path, enabled: bool = True, *, config: Any) -> None:
        self.run = run = RunDir(run_dir)
        self._file = None
        self._writer = None
        self._wandb: Any = None
        if not enabled:
            return
        from e2mc.files import open_append, own_dir

        run.root.mkdir(parents=True, exist_ok=True)
        self._file = open_append(run.metrics)
        log_cfg = config.logging
        if log_cfg.wandb:  # its name: the run directory's unless set; its files under it
            try:
                import wandb
            except ImportError:
                raise ValueError("logging.wandb needs the wandb package: pip install "
                                 "'e2mc[wandb]' (or set logging.wandb=false)") from None
            self._wandb = wandb.init(
                project=log_cfg.wandb_project, entity=log_cfg.wandb_entity,
                name=log_cfg.wandb_name or run.root.resolve().name, mode=log_cfg.wandb_mode,
                dir=str(run.root), id=wandb_run_id(run), resume="allow", config=config.to_dict())
        if log_cfg.tensorboard is not False:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                if log_cfg.tensorboard is True and not _NOTED:
                    _NOTED.add("tensorboard")
                    print("note: tensorboard is not installed (pip install tensorboard); "
                          "logging to metrics.jsonl only", file=sys.stderr)
            else:
                self._writer = SummaryWriter(log_dir=str(own_dir(run.tensorboard)))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        if self._file is None:
            return
        record = {"step": int(step), **{k: v.item() if hasattr(v, "item") else v
                                        for k, v in metrics.items()}}
        self._file.write(json.dumps(record, allow_nan=True) + "\n")
        self._file.flush()
        scalars = {name: value for name, value in record.items()
                   if name != "step" and isinstance(value, int | float)
                   and not isinstance(value, bool) and math.isfinite(value)}
        if self._writer is not None:
            for name, value in scalars.items():
                self._writer.add_scalar(name, value, global_step=step)
        if self._wandb is not None:
            self._wandb.log(scalars, step=int(step))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wandb_run_id(run: RunDir) -> str:
    """A wandb id fixed by the run directory's path, so a resumed run continues its wandb run."""
    return hashlib.sha1(str(run.root.resolve()).encode()).hexdigest()[:16]
