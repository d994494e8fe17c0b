"""Training run directories (:class:`RunDir`) and which file stands for a run
(:class:`RunModel`, :func:`run_model`, the shipped ``builtin:NAME`` checkpoints)."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2mc.artifacts.layout import BEST, CHECKPOINT, EPOCH_DIR, in_root, read_jsonl, write_jsonl
from e2mc.errors import InputError


@dataclass(frozen=True)
class RunModel:
    """Which file of a run directory stands for the run (:meth:`RunDir.model`)."""

    path: Path
    kept: bool  # best.pt, the model keep-best chose
    best_exists: bool = False  # (for the last step) whether best.pt was passed over
    from_directory: bool = True  # chosen for a run directory (not a file named directly)

    def describe(self) -> str:
        """One line for the user: which file, and why."""
        if self.kept and self.path.name == BEST and not self.from_directory:
            return f"{self.path}: a run's kept model (keep-best's best.pt)"
        if self.kept:
            return (f"{self.path}: the run's kept model (keep-best's best.pt; --last takes "
                    "the last step)")
        if self.best_exists:
            return f"{self.path}: the run's last step (--last; keep-best kept best.pt)"
        return f"{self.path}: the run's last step (the run kept no best.pt)"

    def record(self, step: int | None) -> dict[str, Any]:
        """What results.json, the report and the export sidecar record of the choice."""
        return {"file": str(self.path), "step": step, "kept_model": self.kept}


#: Checkpoints shipped in ``e2mc/assets`` (``builtin:NAME``): name -> (file, what it is).
BUILTIN_CHECKPOINTS: dict[str, tuple[str, str]] = {
    "demo-vicreg": ("demo_base_vicreg.pt", "the demo's VICReg base (cnn5_small, 16 epochs on the "
                                           "shipped Fashion-MNIST subset)"),
}
BUILTIN_PREFIX = "builtin:"


def builtin_checkpoint(ref: str | os.PathLike[str]) -> Path | None:
    """The shipped file ``builtin:NAME`` stands for; ``None`` for any other reference; an
    unknown ``NAME`` is an :class:`~e2mc.errors.InputError` listing the builtin names."""
    ref = os.fspath(ref)
    if not ref.startswith(BUILTIN_PREFIX):
        return None
    name = ref[len(BUILTIN_PREFIX):]
    if name not in BUILTIN_CHECKPOINTS:
        known = ", ".join(BUILTIN_PREFIX + n for n in BUILTIN_CHECKPOINTS)
        raise InputError(f"unknown builtin checkpoint {ref!r}; builtin checkpoints: {known}")
    from importlib import resources

    return Path(str(resources.files("e2mc") / "assets" / BUILTIN_CHECKPOINTS[name][0]))


def run_model(ref: str | os.PathLike[str], last: bool = False) -> RunModel | None:
    """What a command's model argument stands for: a run directory's :meth:`RunDir.model`, a
    checkpoint file (``best.pt`` named explicitly is the kept model) or ``builtin:NAME``; ``None``
    for a URL."""
    if "://" in os.fspath(ref):
        return None
    builtin = builtin_checkpoint(ref)
    if builtin is not None:
        return RunModel(builtin, kept=False, from_directory=False)
    path = Path(ref)
    if path.is_dir():
        return RunDir(path).model(last)
    return RunModel(path, kept=path.name == BEST, from_directory=False)


@dataclass(frozen=True)
class RunDir:
    """The files of one training run directory (docs/architecture.md)."""

    root: Path

    def __init__(self, root: str | os.PathLike[str]) -> None:
        object.__setattr__(self, "root", Path(root))

    config = in_root("config.yaml")
    checkpoint = in_root(CHECKPOINT)
    best = in_root(BEST)
    metrics = in_root("metrics.jsonl")
    val_split = in_root("val_split.json")
    start = in_root("start.json")
    monitor_plot = in_root("monitor.png")
    tensorboard = in_root("tensorboard")
    epoch_dir = in_root(EPOCH_DIR)
    done = in_root("done.json")
    config_changes = in_root("config_changes.jsonl")

    def epoch_checkpoint(self, run_epoch: int) -> Path:
        """``checkpoints/epoch_XXXX.pt`` of run epoch ``run_epoch`` (0 = the starting model);
        a symbolic link at ``checkpoints`` is refused (:func:`e2mc.files.refuse_link`)."""
        from e2mc.files import refuse_link

        refuse_link(self.epoch_dir)
        return self.epoch_dir / f"epoch_{run_epoch:04d}.pt"

    def epoch_checkpoints(self) -> list[tuple[int, Path]]:
        """``(run epoch, path)`` of every per-epoch checkpoint, in epoch order."""
        found = [(int(m.group(1)), p) for p in self.epoch_dir.glob("epoch_*.pt")
                 if (m := re.fullmatch(r"epoch_(\d+)\.pt", p.name))]
        return sorted(found)

    def latest_checkpoint(self) -> Path | None:
        """``checkpoint.pt``, else the last per-epoch checkpoint, else ``None``."""
        if self.checkpoint.is_file():
            return self.checkpoint
        epochs = self.epoch_checkpoints()
        return epochs[-1][1] if epochs else None

    def model(self, last: bool = False) -> RunModel:
        """The run's answer: ``best.pt`` when keep-best wrote one, else (or with ``last``) the
        latest checkpoint, the last step. Every command given a run directory takes this."""
        if not last and self.best.is_file():
            return RunModel(self.best, kept=True)
        latest = self.latest_checkpoint()
        if latest is None:
            raise ValueError(f"{self.root} is a directory without a checkpoint (not a training "
                             "run directory)")
        return RunModel(latest, kept=False, best_exists=self.best.is_file())

    def read_metrics(self, partial_last_line: bool = False) -> list[dict[str, Any]]:
        """The records of ``metrics.jsonl`` (``[]`` when the run has logged nothing yet)."""
        if not self.metrics.is_file():
            return []
        return read_jsonl(self.metrics, partial_last_line)

    def truncate_metrics(self, last_step: int) -> None:
        """Keep the records with ``step <= last_step`` (those a resumed run will not log again),
        so that every step appears once after a resume; a line cut by a kill is dropped."""
        if self.metrics.is_file():
            write_jsonl(self.metrics, (r for r in self.read_metrics(partial_last_line=True)
                                       if r.get("step", 0) <= last_step))

    def read_val_split(self) -> dict[str, Any] | None:
        """The validation split the run was started with (``None`` if it has none)."""
        if not self.val_split.is_file():
            return None
        try:
            record = json.loads(self.val_split.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ValueError(f"{self.val_split}: not valid JSON ({err}); delete the run "
                             "directory or restore the file") from err
        if not isinstance(record, dict) or not {"train", "val"} <= set(record):
            raise ValueError(f"{self.val_split}: not a validation-split record")
        return record

    def write_val_split(self, record: dict[str, Any]) -> None:
        """Write the validation-split record atomically."""
        from e2mc.files import atomic_write_text

        self.root.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.val_split, json.dumps(record))

    def stale_temp_files(self) -> list[Path]:
        """Temporary files of interrupted atomic writes here and in the epoch folder."""
        from e2mc.files import refuse_link, temp_target

        found: list[Path] = []
        refuse_link(self.epoch_dir)
        for folder in (self.root, self.epoch_dir):
            if folder.is_dir():
                found += [p for p in folder.iterdir() if temp_target(p.name) is not None]
        return sorted(found)

    def mark_done(self, step: int, end: str) -> None:
        """Record that the run reached its configured end (``end``: how) at ``step``; a run that
        was stopped early (pre-empted) is never marked. Written atomically."""
        from e2mc.files import atomic_write_text

        atomic_write_text(self.done, json.dumps({"step": int(step), "end": end}))

    def read_done(self) -> dict[str, Any] | None:
        """What :meth:`mark_done` recorded when the run is done and its checkpoint is there."""
        if not (self.done.is_file() and self.checkpoint.is_file()):
            return None
        try:
            done = json.loads(self.done.read_text(encoding="utf-8"))
            return done if isinstance(done["step"], int) else None
        except (ValueError, KeyError, TypeError):
            return None

    def is_done(self) -> bool:
        """Whether :meth:`mark_done` was called and the checkpoint it describes is there."""
        return self.read_done() is not None

    def record_config_change(self, step: int, changes: dict[str, Any]) -> None:
        """Append ``{"step": first step with the change, "changes": {key: {"old", "new"}}}`` to
        ``config_changes.jsonl`` (rewritten atomically)."""
        previous = read_jsonl(self.config_changes, True) if self.config_changes.is_file() else []
        write_jsonl(self.config_changes, [*previous, {"step": int(step), "changes": changes}])


