"""Run artifacts, defined once: every file a training run, an evaluation or a search writes, and
the one reader of each.

A **training run directory** (``e2mc continue`` / ``e2mc pretrain``)::

    config.yaml              the resolved configuration
    checkpoint.pt            latest training checkpoint (resumable)
    best.pt                  the best step by the monitored metric (``--keep-best``)
    checkpoints/epoch_XXXX.pt  model-only copy after each epoch (epoch 0 = the start)
    metrics.jsonl            one JSON object per logged step (training terms, monitor values)
    config_changes.jsonl     configuration changes accepted on resume, with their first step
    val_split.json           the held-out validation indices (``--val-split``)
    monitor.png              the monitor's validation metrics against steps (kept step marked)
    tensorboard/             the same scalars for TensorBoard

An **evaluation directory** (``e2mc eval``)::

    results.json             :class:`EvalResults`: one :class:`EvalEntry` per probe and seed
    predictions/<name>.npz   per-image top-1 predictions and labels of each entry

A **search directory** (``e2mc search``, :class:`SearchDir`)::

    search.json, search.md, search.png   the spec and rule, the table, the trajectories
    trials/<trial>/run, trials/control-<overrides>   training run directories (+ done.json)
    confirm/seed<N>/{run,control}[-eval]  the confirmation runs and their test evaluations
    confirm.json, confirm.md               the paired tests of the confirmation
    feature-cache/                         features of the confirmation's evaluations
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

CONFIG = "config.yaml"
CHECKPOINT = "checkpoint.pt"
BEST = "best.pt"
METRICS = "metrics.jsonl"
VAL_SPLIT = "val_split.json"
MONITOR_PLOT = "monitor.png"
EPOCH_DIR = "checkpoints"
TENSORBOARD_DIR = "tensorboard"
RESULTS = "results.json"
PREDICTIONS_DIR = "predictions"
SEARCH_JSON = "search.json"
SEARCH_MD = "search.md"
RUN_DONE = "done.json"
CONFIG_CHANGES = "config_changes.jsonl"

_EPOCH_FILE = re.compile(r"^epoch_(\d+)\.pt$")


# --------------------------------------------------------------------------- numbers
def mean_se(values: Iterable[float]) -> tuple[float, float | None]:
    """Mean and standard error ``std(ddof=1) / sqrt(n)``; the SE is ``None`` for one value."""
    arr = np.asarray(list(values), dtype=np.float64)
    if arr.size == 0:
        raise ValueError("mean_se of an empty list")
    se = float(arr.std(ddof=1) / math.sqrt(arr.size)) if arr.size > 1 else None
    return float(arr.mean()), se


# --------------------------------------------------------------------------- JSON lines
def read_jsonl(path: str | Path, partial_last_line: bool = False) -> list[dict[str, Any]]:
    """The records of a JSON-lines file (one object per line; blank lines skipped).

    A malformed line is a ``ValueError`` naming the file and line, except, with
    ``partial_last_line``, a malformed *last* line (a process killed mid-write), which is dropped.
    """
    path = Path(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    records: list[dict[str, Any]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            if partial_last_line and number == len(lines):
                break  # a partial last line from an interrupted write
            raise ValueError(f"{path}:{number}: not valid JSON ({err.msg})") from err
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{number}: expected a JSON object")
        records.append(record)
    return records


def write_jsonl(path: str | Path, records: Iterable[dict[str, Any]]) -> None:
    """Replace ``path`` atomically by ``records``, one JSON object per line."""
    from e2mc.checkpoints.io import atomic_write

    text = "".join(json.dumps(r, allow_nan=True) + "\n" for r in records)
    atomic_write(Path(path), lambda f: f.write(text), "w")


# --------------------------------------------------------------------------- training runs
@dataclass(frozen=True)
class RunDir:
    """The files of one training run directory (see the module docstring)."""

    root: Path

    def __init__(self, root: str | os.PathLike[str]) -> None:
        object.__setattr__(self, "root", Path(root))

    @property
    def config(self) -> Path:
        return self.root / CONFIG

    @property
    def checkpoint(self) -> Path:
        return self.root / CHECKPOINT

    @property
    def best(self) -> Path:
        return self.root / BEST

    @property
    def metrics(self) -> Path:
        return self.root / METRICS

    @property
    def val_split(self) -> Path:
        return self.root / VAL_SPLIT

    @property
    def monitor_plot(self) -> Path:
        return self.root / MONITOR_PLOT

    @property
    def tensorboard(self) -> Path:
        return self.root / TENSORBOARD_DIR

    @property
    def epoch_dir(self) -> Path:
        return self.root / EPOCH_DIR

    def epoch_checkpoint(self, run_epoch: int) -> Path:
        """``checkpoints/epoch_XXXX.pt`` of run epoch ``run_epoch`` (0 = the starting model)."""
        return self.epoch_dir / f"epoch_{run_epoch:04d}.pt"

    def epoch_checkpoints(self) -> list[tuple[int, Path]]:
        """``(run epoch, path)`` of every per-epoch checkpoint, in epoch order."""
        found = [(int(m.group(1)), p) for p in self.epoch_dir.glob("epoch_*.pt")
                 if (m := _EPOCH_FILE.match(p.name))]
        return sorted(found)

    def latest_checkpoint(self) -> Path | None:
        """``checkpoint.pt``, else the last per-epoch checkpoint, else ``None``."""
        if self.checkpoint.is_file():
            return self.checkpoint
        epochs = self.epoch_checkpoints()
        return epochs[-1][1] if epochs else None

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
        from e2mc.checkpoints.io import atomic_write

        self.root.mkdir(parents=True, exist_ok=True)
        text = json.dumps(record)
        atomic_write(self.val_split, lambda f: f.write(text), "w")

    def stale_temp_files(self) -> list[Path]:
        """Temporary files of interrupted atomic writes (``.NAME.*.tmp``) in the run directory
        and its epoch folder."""
        found: list[Path] = []
        for folder in (self.root, self.epoch_dir):
            if folder.is_dir():
                found += [p for p in folder.iterdir()
                          if p.name.startswith(".") and p.name.endswith(".tmp")]
        return sorted(found)

    @property
    def config_changes(self) -> Path:
        return self.root / CONFIG_CHANGES

    def record_config_change(self, step: int, changes: dict[str, Any]) -> None:
        """Append ``{"step": first step with the change, "changes": {key: {"old", "new"}}}`` to
        ``config_changes.jsonl`` (rewritten atomically)."""
        previous = read_jsonl(self.config_changes, True) if self.config_changes.is_file() else []
        write_jsonl(self.config_changes, [*previous, {"step": int(step), "changes": changes}])

    def read_config_changes(self) -> list[dict[str, Any]]:
        """The records of ``config_changes.jsonl`` (``[]`` when the config never changed)."""
        return read_jsonl(self.config_changes, True) if self.config_changes.is_file() else []


# --------------------------------------------------------------------------- searches
class SearchDir:
    """The files of one ``e2mc search`` directory (see the module docstring)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.json = self.root / SEARCH_JSON
        self.markdown = self.root / SEARCH_MD
        self.plot = self.root / "search.png"
        self.confirm_json = self.root / "confirm.json"
        self.confirm_markdown = self.root / "confirm.md"
        self.feature_cache = self.root / "feature-cache"

    def trial_run(self, slug: str) -> RunDir:
        return RunDir(self.root / "trials" / slug / "run")

    def control_run(self, slug: str) -> RunDir:
        return RunDir(self.root / "trials" / f"control-{slug}")

    def confirm_run(self, seed: int, kind: str) -> RunDir:
        """``kind``: ``run`` (the selected trial) or ``control``."""
        return RunDir(self.root / "confirm" / f"seed{seed}" / kind)

    def confirm_eval(self, seed: int, kind: str) -> EvalDir:
        return EvalDir(self.root / "confirm" / f"seed{seed}" / f"{kind}-eval")

    @staticmethod
    def done_marker(run: RunDir) -> Path:
        """Written when a search's training run has finished (it is then read, not re-run)."""
        return run.root / RUN_DONE


# --------------------------------------------------------------------------- evaluations
@dataclass
class EvalEntry:
    """One probe of one evaluation: its column (``"linear 1%"``, ``"knn k=20"``, ...), label
    seed, the name of its primary metric, every metric, and its saved predictions."""

    protocol: str
    column: str
    primary: str
    metrics: dict[str, Any]
    fraction: float | None = None
    seed: int | None = None
    predictions: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def value(self) -> float:
        """The primary metric (top-1 percent for every protocol the package writes)."""
        return float(self.metrics[self.primary])

    _FIELDS = ("protocol", "column", "primary", "metrics", "fraction", "seed", "predictions")

    @classmethod
    def from_dict(cls, d: Any, where: str) -> EvalEntry:
        if not isinstance(d, dict):
            raise ValueError(f"{where}: an entry is not a JSON object")
        missing = [k for k in ("protocol", "column", "primary", "metrics") if k not in d]
        if missing:
            raise ValueError(f"{where}: an entry lacks {', '.join(missing)}")
        if not isinstance(d["metrics"], dict) or d["primary"] not in d["metrics"]:
            raise ValueError(f"{where}: entry {d.get('column')!r} has no value for its primary "
                             f"metric {d.get('primary')!r}")
        return cls(**{k: d.get(k) for k in cls._FIELDS},
                   extra={k: v for k, v in d.items() if k not in cls._FIELDS})

    def to_dict(self) -> dict[str, Any]:
        return {**{k: getattr(self, k) for k in self._FIELDS}, **self.extra}


@dataclass
class EvalResults:
    """The ``results.json`` of one evaluation directory, typed. ``info`` keeps the other
    top-level fields (checkpoint, command, data, protocols, settings, ...)."""

    dir: Path
    entries: list[EvalEntry]
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def checkpoint(self) -> str | None:
        return self.info.get("checkpoint")

    def columns(self) -> list[str]:
        """The columns in the order they first appear."""
        return list(dict.fromkeys(e.column for e in self.entries))

    def column(self, column: str) -> list[EvalEntry]:
        return [e for e in self.entries if e.column == column]

    def values(self, column: str) -> list[float]:
        """The primary metric of every entry of ``column`` (one per label seed)."""
        return [e.value for e in self.column(column)]

    def predictions(self, entry: EvalEntry) -> tuple[np.ndarray, np.ndarray]:
        """``(predictions, labels)`` saved for ``entry``."""
        if not entry.predictions:
            raise ValueError(f"{self.dir}: entry {entry.column!r} has no saved predictions")
        path = self.dir / entry.predictions
        try:
            with np.load(path) as f:
                return f["predictions"], f["labels"]
        except (OSError, KeyError, ValueError) as err:
            raise ValueError(f"{path}: unreadable predictions ({err}); re-run the evaluation "
                             f"or delete {self.dir}") from err

class EvalDir:
    """The files of one evaluation directory."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    @property
    def results(self) -> Path:
        return self.root / RESULTS

    def prediction_file(self, name: str) -> str:
        """Path of ``predictions/<name>.npz`` relative to the directory (as stored in entries)."""
        return (Path(PREDICTIONS_DIR) / f"{name}.npz").as_posix()

    def exists(self) -> bool:
        return self.results.is_file()

    def load(self) -> EvalResults:
        """Read and check ``results.json``; every problem is a ``ValueError`` naming the file."""
        path = self.results
        if not path.is_file():
            raise ValueError(f"{self.root} is not an evaluation directory (no {RESULTS})")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ValueError(f"{path}: not valid JSON ({err}); re-run the evaluation or delete "
                             "the file") from err
        if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
            raise ValueError(f"{path}: not an e2mc results file (no list of entries)")
        entries = [EvalEntry.from_dict(e, str(path)) for e in data["entries"]]
        info = {k: v for k, v in data.items() if k != "entries"}
        return EvalResults(dir=self.root, entries=entries, info=info)

    def write(self, record: dict[str, Any]) -> Path:
        """Write ``record`` (entries and top-level fields) as ``results.json``, atomically, with
        a ``summary`` (mean, SE and count over seeds of every numeric metric per column)."""
        from e2mc.checkpoints.io import atomic_write

        record = dict(record)
        entries = [e.to_dict() if isinstance(e, EvalEntry) else e for e in record["entries"]]
        record["entries"] = entries
        record["summary"] = summarize(entries)
        text = json.dumps(record, indent=2, default=_jsonable)
        self.root.mkdir(parents=True, exist_ok=True)
        for stale in self.root.glob(f".{RESULTS}.*.tmp"):  # left by a killed write
            stale.unlink(missing_ok=True)
        atomic_write(self.results, lambda f: f.write(text), "w")
        return self.results


def summarize(entries: Sequence[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """``{column: {metric: {"mean", "se", "n"}}}`` over the entries (seeds) of each column."""
    grouped: dict[str, dict[str, list[float]]] = {}
    for e in entries:
        col = grouped.setdefault(e["column"], {})
        for key, value in e["metrics"].items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                col.setdefault(key, []).append(float(value))
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for column, metrics in grouped.items():
        out[column] = {}
        for key, values in metrics.items():
            mean, se = mean_se(values)
            out[column][key] = {"mean": mean, "se": se, "n": len(values)}
    return out


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, np.integer | np.floating):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")
