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
    start.json               what the run started from (checkpoint, pretrained weights or a
                             module) and the SHA-256 of its starting backbone's state dict
    monitor.png              the monitor's validation metrics against steps (kept step marked)
    tensorboard/             the same scalars for TensorBoard
    done.json                the step and the end the run reached (written by ``e2mc search`` when
                             the run finished as configured; never after a pre-emption)
    .e2mc.lock               held by the process writing the directory (:func:`writer_lock`; also
                             in evaluation and search directories)

An **evaluation directory** (``e2mc eval``)::

    results.json             :class:`EvalResults`: one :class:`EvalEntry` per probe and seed
    predictions/<name>.<generation>.npz   per-image top-1 predictions and labels of each entry
                             (written first; results.json, written last, records their sha256)
    .generations.json        the generations of predictions/ files this directory's
                             evaluations wrote: its clean-up deletes only those (and the files
                             the replaced results.json named), never a file it did not write

A **search directory** (``e2mc search``, :class:`SearchDir`)::

    search.json, search.md, search.png   the spec and rule, the table, the trajectories
    trials/<trial>-<hash>/run, trials/control-<overrides>-<hash>   training run directories
                              (+ done.json once finished); <hash>: of the trial's overrides
    confirm/seed<N>/{run,control}[-eval]  the confirmation runs and their test evaluations
    confirm.json, confirm.md               the paired tests of the confirmation
    feature-cache/                         features of the confirmation's evaluations
    jobs.json, jobs/                       with ``--executor local|slurm``: each run's and
                                           evaluation's job id, and submitit's files and logs
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from e2mc.errors import InputError
from e2mc.processes import lock_held, process_identity, same_process

CONFIG = "config.yaml"
CHECKPOINT = "checkpoint.pt"
BEST = "best.pt"
METRICS = "metrics.jsonl"
VAL_SPLIT = "val_split.json"
START = "start.json"
MONITOR_PLOT = "monitor.png"
EPOCH_DIR = "checkpoints"
TENSORBOARD_DIR = "tensorboard"
RESULTS = "results.json"
PREDICTIONS_DIR = "predictions"
SEARCH_JSON = "search.json"
SEARCH_MD = "search.md"
RUN_DONE = "done.json"
CONFIG_CHANGES = "config_changes.jsonl"
LOCK = ".e2mc.lock"
GENERATIONS = ".generations.json"

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
    from e2mc.files import atomic_write_text

    atomic_write_text(path, "".join(json.dumps(r, allow_nan=True) + "\n" for r in records))


# --------------------------------------------------------------------------- one writer
class DirectoryBusy(InputError):
    """Another live process is writing to the directory (exit 2 on the command line)."""


_HELD: set[Path] = set()  # lock files this process holds


@contextmanager
def writer_lock(root: str | os.PathLike[str]) -> Iterator[Path]:
    """Hold ``ROOT/.e2mc.lock`` while writing to ``root``: one writer per run, evaluation or
    search directory.

    The lock is an advisory POSIX record lock (``lockf``, also honoured over NFS) on a file
    holding the writer's pid, host, start time and command line. It belongs to the process
    (DataLoader workers forked from it do not inherit it) and the kernel releases it when the
    process ends, however it ends, so a lock file left by a dead process is taken over (with a
    note on stderr); a live holder makes :class:`DirectoryBusy` naming it. Temporary files of
    atomic writes that an earlier writer left in ``root`` are removed once the lock is held.
    The file is removed on release, and ``root`` too when this call made it and it is empty.
    """
    import fcntl

    root = Path(root)
    created = not root.exists()
    root.mkdir(parents=True, exist_ok=True)
    path = root / LOCK
    if path.resolve() in _HELD:  # a second lockf in this process would succeed, and its
        raise DirectoryBusy(f"{root} is already being written by this process")  # close free it
    from e2mc.files import is_temp_file, refuse_link

    while True:
        refuse_link(path)  # a planted link: its target is never opened for writing
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        except OSError as err:
            if err.errno == errno.ELOOP:  # planted between the check and the open
                refuse_link(path)
            raise
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 1 << 16).decode("utf-8", "replace")
            os.close(fd)
            raise DirectoryBusy(f"{root} is being written by another process ({_holder(holder)})"
                                "; wait for it to end or use another directory") from None
        try:  # the file may have been removed by its last holder between open and lock
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    key = path.resolve()
    _HELD.add(key)
    try:
        stale = os.read(fd, 1 << 16).decode("utf-8", "replace").strip()
        if stale:
            print(f"note: {path} was left by a process that is gone ({_holder(stale)}); "
                  "taking it over", file=sys.stderr)
        record = {**process_identity(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                  "command": sys.argv}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        for temp in root.iterdir():  # an interrupted atomic write of an earlier writer
            if is_temp_file(temp.name) and not temp.is_dir():
                temp.unlink(missing_ok=True)
        yield path
    finally:
        _HELD.discard(key)
        path.unlink(missing_ok=True)
        os.close(fd)
        if created and not any(root.iterdir()):  # refused before writing: leave no trace
            root.rmdir()


def live_writer(root: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The record of the process writing ``root`` (:func:`writer_lock`) while it is alive, else
    ``None``. Only asks (never takes the lock, which would refuse the writer itself for that
    instant): the kernel says whether a process holds the lock (``F_GETLK``, which NFS answers
    for other hosts too), so a lock file left by a crash, one whose pid now belongs to another
    process, or one naming another host's process that ended, is not a live writer. Where the
    file system cannot say, the record's identity decides (:func:`same_process`: this host's
    process with the same start time and boot id), and a process of another host is not
    waited for."""
    path = Path(root) / LOCK
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    try:
        record = json.loads(text)
        record = record if isinstance(record, dict) else {}
    except ValueError:
        record = {}  # (being written)
    if path.resolve() in _HELD:  # this process (closing a descriptor would drop its lock)
        return record
    held = lock_held(path)
    if held is not None:
        return record if held else None
    return record if same_process(record) else None


def _holder(text: str) -> str:
    try:
        r = json.loads(text)
        return (f"pid {r['pid']} on {r['host']} since {r['started']}: "
                f"{' '.join(map(str, r.get('command', [])))}")
    except (ValueError, KeyError, TypeError):
        return "unknown holder"


# --------------------------------------------------------------------------- training runs
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


#: Checkpoints shipped with the package (``e2mc/assets``), by the name ``builtin:NAME`` that
#: every command taking a checkpoint accepts: name -> (file, what it is).
BUILTIN_CHECKPOINTS: dict[str, tuple[str, str]] = {
    "demo-vicreg": ("demo_base_vicreg.pt", "the demo's VICReg base (cnn5_small, 16 epochs on the "
                                           "shipped Fashion-MNIST subset)"),
}
BUILTIN_PREFIX = "builtin:"


def builtin_checkpoint(ref: str | os.PathLike[str]) -> Path | None:
    """The shipped file ``builtin:NAME`` stands for (:data:`BUILTIN_CHECKPOINTS`); ``None`` for
    any other reference; an unknown ``NAME`` is an :class:`~e2mc.errors.InputError` listing
    the builtin names."""
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
    """What a command's model argument stands for: a training run directory's model
    (:meth:`RunDir.model`: ``best.pt`` when keep-best wrote one, else or with ``last`` the
    latest checkpoint), a checkpoint file itself (``best.pt`` named explicitly counts as the
    kept model) or a shipped one (``builtin:NAME``, :func:`builtin_checkpoint`); ``None`` for a
    URL."""
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
    def start(self) -> Path:
        return self.root / START

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
        """``checkpoints/epoch_XXXX.pt`` of run epoch ``run_epoch`` (0 = the starting model);
        a symbolic link at ``checkpoints`` is refused (:func:`e2mc.files.refuse_link`)."""
        from e2mc.files import refuse_link

        refuse_link(self.epoch_dir)
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
        """Temporary files of interrupted atomic writes (``.NAME.*.tmp``) in the run directory
        and its epoch folder."""
        from e2mc.files import is_temp_file, refuse_link

        found: list[Path] = []
        refuse_link(self.epoch_dir)
        for folder in (self.root, self.epoch_dir):
            if folder.is_dir():
                found += [p for p in folder.iterdir() if is_temp_file(p.name)]
        return sorted(found)

    @property
    def done(self) -> Path:
        return self.root / RUN_DONE

    def mark_done(self, step: int, end: str) -> None:
        """Record that the run reached its configured end (``end``: how) at ``step``; a run that
        was stopped early (pre-empted) is never marked. Written atomically."""
        from e2mc.files import atomic_write_text

        atomic_write_text(self.done, json.dumps({"step": int(step), "end": end}))

    def read_done(self) -> dict[str, Any] | None:
        """What :meth:`mark_done` recorded (``step``, ``end``) when the run is done and the
        checkpoint it describes is there; else ``None``."""
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


# --------------------------------------------------------------------------- evaluation sets
class EvalSetDir:
    """The files of ``e2mc eval A B ... --out DIR``: one evaluation directory per checkpoint
    (``DIR/<name>/``, :class:`EvalDir`; names from :func:`evaluation_set_names`),
    ``evaluations.json`` (each name's checkpoint, written before the first evaluation) and the
    jobs' ``jobs.json`` and ``jobs/`` (as in a search directory)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.index = self.root / "evaluations.json"
        self.jobs_json = self.root / "jobs.json"
        self.jobs_dir = self.root / "jobs"

    def evaluation(self, name: str) -> EvalDir:
        return EvalDir(self.root / name)


def slug_dir_name(label: str, identity: str, fallback: str) -> str:
    """A directory name injective in ``identity``: a readable slug of ``label`` (at most 80
    characters, ``fallback`` when nothing is left of it) and the first 10 hex digits of the
    SHA-256 of ``identity`` (``"beta 100"`` and ``"beta_100"`` share the slug, not the hash)."""
    import hashlib
    import re

    slug = re.sub(r"[^A-Za-z0-9.+-]+", "_", label).strip("_")[:80] or fallback
    return f"{slug}-{hashlib.sha256(identity.encode()).hexdigest()[:10]}"


def evaluation_set_names(checkpoints: list[str]) -> list[str]:
    """A directory name per checkpoint argument (:func:`slug_dir_name`): a slug of its last part
    (a run directory's or file's name) and a hash of the whole argument (``a/run`` and
    ``b/run`` share the slug, not the hash). The same argument twice is an
    :class:`~e2mc.errors.InputError`."""
    twice = sorted({c for c in checkpoints if checkpoints.count(c) > 1})
    if twice:
        raise InputError(f"checkpoint {twice[0]} is given twice; list each once")
    seen: dict[str, str] = {}
    for ref in checkpoints:  # ./x.pt, x.pt and a link to it are one file
        real = os.path.realpath(ref) if os.path.exists(ref) else ref
        if real in seen:
            raise InputError(f"checkpoints {seen[real]} and {ref} are the same file "
                             f"({real}); list each once")
        seen[real] = ref
    return [slug_dir_name(Path(ref.rstrip("/")).name or ref, ref, "checkpoint")
            for ref in checkpoints]


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
        self.jobs_json = self.root / "jobs.json"
        self.jobs_dir = self.root / "jobs"

    def trial_run(self, slug: str) -> RunDir:
        return RunDir(self.root / "trials" / slug / "run")

    def control_run(self, slug: str) -> RunDir:
        return RunDir(self.root / "trials" / f"control-{slug}")

    def confirm_run(self, seed: int, kind: str) -> RunDir:
        """``kind``: ``run`` (the selected trial) or ``control``."""
        return RunDir(self.root / "confirm" / f"seed{seed}" / kind)

    def confirm_eval(self, seed: int, kind: str) -> EvalDir:
        return EvalDir(self.root / "confirm" / f"seed{seed}" / f"{kind}-eval")

    def refuse_links(self, *inside: Path) -> None:
        """Refuse (:func:`e2mc.files.refuse_link`) a symbolic link at any folder or file the
        search makes: its folders, and every path from the root down to each of ``inside``."""
        from e2mc.files import refuse_link

        for path in (self.root / "trials", self.root / "confirm", self.feature_cache,
                     self.jobs_dir, self.jobs_json, self.json, self.markdown, self.plot,
                     self.confirm_json, self.confirm_markdown):
            refuse_link(path)
        for path in inside:
            for part in [path, *path.parents]:
                if part == self.root or self.root not in part.parents:
                    break
                refuse_link(part)



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
    #: SHA-256 of the predictions file, recorded by :meth:`EvalDir.write` (``None`` in files
    #: written before it was recorded: such predictions are read unchecked).
    predictions_sha256: str | None = None

    @property
    def value(self) -> float:
        """The primary metric (top-1 percent for every protocol the package writes)."""
        return float(self.metrics[self.primary])

    _FIELDS = ("protocol", "column", "primary", "metrics", "fraction", "seed", "predictions",
               "predictions_sha256")

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
        """``(predictions, labels)`` saved for ``entry``, checked against the SHA-256 that
        ``results.json`` records for the file: a file of another evaluation is refused."""
        import hashlib
        import io

        if not entry.predictions:
            raise ValueError(f"{self.dir}: entry {entry.column!r} has no saved predictions")
        path = self.dir / entry.predictions
        try:
            data = path.read_bytes()
        except FileNotFoundError as err:
            raise ValueError(f"{path}: missing predictions file of entry {entry.column!r}; "
                             f"re-run the evaluation into {self.dir}") from err
        digest = hashlib.sha256(data).hexdigest()
        if entry.predictions_sha256 is not None and digest != entry.predictions_sha256:
            raise ValueError(f"{path}: does not match results.json (sha256 {digest[:12]}..., "
                             f"recorded {entry.predictions_sha256[:12]}...): the file is not "
                             f"the one this evaluation wrote; re-run the evaluation into "
                             f"{self.dir}")
        try:
            with np.load(io.BytesIO(data)) as f:
                return f["predictions"], f["labels"]
        except (OSError, KeyError, ValueError) as err:
            raise ValueError(f"{path}: unreadable predictions ({err}); re-run the evaluation "
                             f"or delete {self.dir}") from err

class EvalDir:
    """The files of one evaluation directory, written as one unit.

    An evaluation writes its predictions under names no complete evaluation uses
    (``predictions/<name>.<generation>.npz``, :meth:`begin`), then ``results.json`` last and
    atomically (:meth:`write`), recording each file's SHA-256; only then are the previous
    evaluation's files removed. A writer killed at any point leaves the previous complete
    result, whose files :meth:`EvalResults.predictions` checks against their digests. The
    writer holds :func:`writer_lock` (``run_evaluation`` does)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    @property
    def results(self) -> Path:
        return self.root / RESULTS

    @property
    def predictions_dir(self) -> Path:
        return self.root / PREDICTIONS_DIR

    def prediction_file(self, name: str, generation: str | None = None) -> str:
        """Path of ``predictions/<name>.<generation>.npz`` (``<name>.npz`` without a
        generation) relative to the directory (as stored in entries)."""
        stem = f"{name}.{generation}" if generation else name
        return (Path(PREDICTIONS_DIR) / f"{stem}.npz").as_posix()

    @staticmethod
    def new_generation() -> str:
        """A fresh generation id for the files of one evaluation."""
        import uuid

        return uuid.uuid4().hex[:12]

    @property
    def generations(self) -> Path:
        """``.generations.json``: the generations this directory's evaluations started, the
        record of which ``predictions/`` files are its own (:meth:`remove_unreferenced`)."""
        return self.root / GENERATIONS

    def _own_generations(self) -> set[str]:
        try:
            listed = json.loads(self.generations.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return set()
        return {g for g in listed if isinstance(g, str)} if isinstance(listed, list) else set()

    def _record_generations(self, generations: Iterable[str]) -> None:
        from e2mc.files import atomic_write_text

        atomic_write_text(self.generations, json.dumps(sorted(set(generations))))

    def begin(self) -> str:
        """Start an evaluation into the directory: remove what an interrupted one left (its own
        files of ``predictions/`` that ``results.json`` does not reference) and return a new
        generation id for :func:`~e2mc.evaluation.results.save_predictions`, recorded first as
        the directory's own. The previous complete result stays as it is until :meth:`write`
        replaces it. A symbolic link at ``predictions`` is refused."""
        from e2mc.files import refuse_link

        refuse_link(self.predictions_dir)
        self.remove_unreferenced()
        generation = self.new_generation()
        self._record_generations([*self._referenced_generations(), generation])
        return generation

    def _referenced(self, entries: Iterable[dict[str, Any]] | None = None) -> set[str]:
        if entries is None:
            try:
                entries = [e.to_dict() for e in self.load().entries]
            except ValueError:  # no or an unreadable results.json: it references nothing
                entries = []
        return {os.path.normpath(self.root / e["predictions"]) for e in entries
                if e.get("predictions")}

    def _referenced_generations(self, entries: Iterable[dict[str, Any]] | None = None
                                ) -> set[str]:
        return {g for p in self._referenced(entries) if (g := _generation(Path(p).name))}

    def remove_unreferenced(self, entries: Iterable[dict[str, Any]] | None = None,
                            also: Iterable[str] = ()) -> list[Path]:
        """Remove the directory's own files of ``predictions/`` that ``entries`` (default: those
        of ``results.json``) do not reference: files of a generation :meth:`begin` recorded
        (``.generations.json``) and their killed writes' temporary files, and the files
        ``also`` names (those the previous ``results.json`` referenced); returns them. Any
        other file is left alone: a user's file in the folder is never deleted."""
        from e2mc.files import refuse_link, temp_target

        refuse_link(self.predictions_dir)
        if not self.predictions_dir.is_dir():
            return []
        keep = self._referenced(entries)
        own, named = self._own_generations(), {os.path.normpath(p) for p in also}
        removed = [p for p in self.predictions_dir.iterdir()
                   if os.path.normpath(p) not in keep and not p.is_dir()
                   and (_generation(temp_target(p.name) or p.name) in own
                        or os.path.normpath(p) in named)]
        for path in removed:
            path.unlink(missing_ok=True)
        return removed

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
        from e2mc.files import atomic_write_text, temp_target

        record = dict(record)
        entries = [e.to_dict() if isinstance(e, EvalEntry) else dict(e)
                   for e in record["entries"]]
        for entry in entries:  # the files this record describes, exactly
            if entry.get("predictions"):
                entry["predictions_sha256"] = self._file_digest(entry)
        record["entries"] = entries
        record["summary"] = summarize(entries)
        text = json.dumps(record, indent=2, default=_jsonable)
        self.root.mkdir(parents=True, exist_ok=True)
        for stale in self.root.iterdir():  # its own files' temporaries, left by a killed write
            if temp_target(stale.name) in (RESULTS, GENERATIONS):
                stale.unlink(missing_ok=True)
        previous = self._referenced()  # the files the record about to be replaced names
        atomic_write_text(self.results, text)
        self.remove_unreferenced(entries, also=previous)  # the previous evaluation's files
        self._record_generations(self._referenced_generations(entries))
        return self.results

    def _file_digest(self, entry: dict[str, Any]) -> str:
        from e2mc.files import sha256_file

        path = self.root / entry["predictions"]
        if not path.is_file():
            raise ValueError(f"{self.results}: entry {entry.get('column')!r} names predictions "
                             f"{entry['predictions']}, which {self.root} does not hold")
        return sha256_file(path)


_GENERATION = re.compile(r"^.+\.([0-9a-f]{12})\.npz$")


def _generation(filename: str) -> str | None:
    """The generation of a ``predictions/<name>.<generation>.npz`` file name, else None."""
    m = _GENERATION.match(filename)
    return m.group(1) if m else None


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
