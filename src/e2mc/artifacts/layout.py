"""The file names that code outside their directory's class reads, the mean and
standard error of a column, and JSON lines read and written."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

CHECKPOINT = "checkpoint.pt"
BEST = "best.pt"
EPOCH_DIR = "checkpoints"
RESULTS = "results.json"
SEARCH_JSON = "search.json"
LOCK = ".e2mc.lock"
GENERATIONS = ".generations.json"


def in_root(name: str) -> property:
    """``root / name`` as a read-only attribute of a directory class."""
    return property(lambda self: self.root / name)


def mean_se(values: Iterable[float]) -> tuple[float, float | None]:
    """Mean and standard error ``std(ddof=1) / sqrt(n)``; the SE is ``None`` for one value."""
    arr = np.asarray(list(values), dtype=np.float64)
    if arr.size == 0:
        raise ValueError("mean_se of an empty list")
    se = float(arr.std(ddof=1) / math.sqrt(arr.size)) if arr.size > 1 else None
    return float(arr.mean()), se


def read_jsonl(path: str | Path, partial_last_line: bool = False) -> list[dict[str, Any]]:
    """The records of a JSON-lines file (blank lines skipped); a malformed line is a
    ``ValueError`` naming file and line, except a malformed *last* line with ``partial_last_line``
    (a process killed mid-write), which is dropped."""
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


