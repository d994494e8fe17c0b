"""The SHA-256 of image files' bytes, remembered between runs in an SQLite table
(``$E2MC_HASH_CACHE`` or ``~/.cache/e2mc/file-hashes.sqlite3``) keyed by the file's stat (device,
inode, size, mtime and ctime in ns). The table is only a cache: a stat change re-reads the bytes
and gives the same digest, so only other bytes change an identity. A table that cannot be read
or written is left aside with one ``warning:`` line and the files are hashed.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from e2mc.files import sha256_file
from e2mc.processes import available_cores
from e2mc.progress import progress_bar

__all__ = ["file_digests", "hash_cache_path"]

_SCHEMA = ("CREATE TABLE IF NOT EXISTS hashes (dev INTEGER, ino INTEGER, size INTEGER, "
           "mtime_ns INTEGER, ctime_ns INTEGER, sha256 TEXT, PRIMARY KEY (dev, ino))")
#: Files to hash before a progress display is worth showing.
_SHOW_FROM = 2000


def hash_cache_path() -> Path:
    """Where the table lives: ``$E2MC_HASH_CACHE`` or ``~/.cache/e2mc/file-hashes.sqlite3``."""
    return Path(os.environ.get("E2MC_HASH_CACHE")
                or Path.home() / ".cache" / "e2mc" / "file-hashes.sqlite3")


def _stat_key(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _warn(problem: str, err: Exception, then: str = "hashing every file") -> None:
    print(f"warning: the file-hash cache {hash_cache_path()} {problem} ({err}); {then}",
          file=sys.stderr)


def _open_table(path: Path) -> sqlite3.Connection | None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(path, timeout=30)
        db.execute(_SCHEMA)
        return db
    except (OSError, sqlite3.Error) as err:
        _warn("is not usable", err)
        return None


def file_digests(paths: Sequence[str], desc: str = "hashing images") -> list[str]:
    """The SHA-256 (hex) of each file's bytes, in order (the module docstring)."""
    keys = [_stat_key(os.stat(p)) for p in paths]
    found: list[str | None] = [None] * len(paths)
    db = _open_table(hash_cache_path())
    if db is not None:
        try:
            for i, key in enumerate(keys):
                row = db.execute("SELECT size, mtime_ns, ctime_ns, sha256 FROM hashes "
                                 "WHERE dev = ? AND ino = ?", key[:2]).fetchone()
                if row is not None and tuple(row[:3]) == key[2:]:
                    found[i] = row[3]
        except sqlite3.Error as err:
            _warn("could not be read", err)
            db.close()
            db = None
    todo = [i for i, d in enumerate(found) if d is None]
    if todo:
        with ThreadPoolExecutor(max(1, min(8, 2 * available_cores()))) as pool, \
                progress_bar(total=len(todo), desc=desc, unit="file",
                             disable=len(todo) < _SHOW_FROM) as bar:
            for i, digest in zip(todo, pool.map(sha256_file, (paths[i] for i in todo)),
                                 strict=True):
                found[i] = digest
                bar.update(1)
    if db is not None:
        with contextlib.closing(db):
            # only files whose stat did not change while they were read
            rows = [(*keys[i], found[i]) for i in todo
                    if _stat_key(os.stat(paths[i])) == keys[i]]
            try:
                with db:
                    db.executemany("INSERT OR REPLACE INTO hashes VALUES (?, ?, ?, ?, ?, ?)",
                                   rows)
            except sqlite3.Error as err:
                _warn("could not be written", err, "the files will be hashed again next time")
    return [d for d in found if d is not None]
