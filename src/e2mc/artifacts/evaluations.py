"""Evaluation directories (:class:`EvalDir`, :class:`EvalResults`, :class:`EvalEntry`)
and evaluation sets (:class:`EvalSetDir`, injective directory names)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from e2mc.artifacts.layout import GENERATIONS, RESULTS, in_root, mean_se
from e2mc.errors import InputError


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
    #: SHA-256 of the predictions file (:meth:`EvalDir.write`); None: read unchecked.
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
    """One directory's ``results.json``, typed; ``info``: its other fields."""

    dir: Path
    entries: list[EvalEntry]
    info: dict[str, Any] = field(default_factory=dict)

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
    """One evaluation directory, written as one unit: predictions under a new generation
    (:meth:`begin`), then ``results.json`` with their SHA-256s (:meth:`write`), then the old
    files removed; a killed writer leaves the previous complete result."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    results = in_root(RESULTS)
    predictions_dir = in_root("predictions")
    #: ``.generations.json``: the generations this directory started (its own files)
    generations = in_root(GENERATIONS)

    def prediction_file(self, name: str, generation: str | None = None) -> str:
        """``predictions/<name>[.<generation>].npz``, relative to the directory."""
        stem = f"{name}.{generation}" if generation else name
        return f"predictions/{stem}.npz"

    @staticmethod
    def new_generation() -> str:
        """A fresh generation id for the files of one evaluation."""
        import uuid

        return uuid.uuid4().hex[:12]

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
        """Remove what an interrupted evaluation left and return a new generation id, recorded
        first as the directory's own. A symbolic link at ``predictions`` is refused."""
        from e2mc.files import refuse_link

        refuse_link(self.predictions_dir)
        entries = self._entries()
        self.remove_unreferenced(entries)
        generation = self.new_generation()
        self._record_generations([*self._referenced_generations(entries), generation])
        return generation

    def _entries(self) -> list[dict[str, Any]]:
        """The entries of ``results.json`` (none when it is missing or unreadable)."""
        try:
            return [e.to_dict() for e in self.load().entries]
        except ValueError:  # no or an unreadable results.json: it references nothing
            return []

    def _referenced(self, entries: Iterable[dict[str, Any]] | None = None) -> set[str]:
        entries = self._entries() if entries is None else entries
        return {os.path.normpath(self.root / e["predictions"]) for e in entries
                if e.get("predictions")}

    def _referenced_generations(self, entries: Iterable[dict[str, Any]] | None = None
                                ) -> set[str]:
        return {g for p in self._referenced(entries) if (g := _generation(Path(p).name))}

    def remove_unreferenced(self, entries: Iterable[dict[str, Any]] | None = None,
                            also: Iterable[str] = ()) -> list[Path]:
        """Remove and return the directory's own files of ``predictions/`` (a recorded generation's,
        temporaries, ``also``) that ``entries`` do not reference; a user's file stays."""
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
        """Write ``record`` atomically as ``results.json`` with its ``summary``."""
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
    return {column: {key: dict(zip(("mean", "se"), mean_se(values), strict=True), n=len(values))
                     for key, values in metrics.items()} for column, metrics in grouped.items()}


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, np.integer | np.floating):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


class EvalSetDir:
    """The files of ``e2mc eval A B ... --out DIR``: ``DIR/<name>/`` per checkpoint,
    ``evaluations.json`` (each name's checkpoint) and the jobs' ``jobs.json`` and ``jobs/``."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.index = self.root / "evaluations.json"
        self.jobs_json = self.root / "jobs.json"
        self.jobs_dir = self.root / "jobs"

    def evaluation(self, name: str) -> EvalDir:
        return EvalDir(self.root / name)


def slug_dir_name(label: str, identity: str, fallback: str) -> str:
    """A directory name injective in ``identity``: a slug of ``label`` (at most 80 characters,
    else ``fallback``) and the first 10 hex digits of the SHA-256 of ``identity``."""
    import hashlib

    slug = re.sub(r"[^A-Za-z0-9.+-]+", "_", label).strip("_")[:80] or fallback
    return f"{slug}-{hashlib.sha256(identity.encode()).hexdigest()[:10]}"


def evaluation_set_names(checkpoints: list[str]) -> list[str]:
    """A directory name per checkpoint argument (:func:`slug_dir_name` of its last part and the
    whole); the same argument (or file) twice is an :class:`~e2mc.errors.InputError`."""
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


