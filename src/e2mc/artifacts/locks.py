"""One writer per directory: :func:`writer_lock` and :func:`live_writer`."""

from __future__ import annotations

import errno
import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from e2mc.artifacts.layout import LOCK
from e2mc.errors import InputError
from e2mc.processes import lock_held, process_identity, same_process


class DirectoryBusy(InputError):
    """Another live process is writing to the directory (exit 2 on the command line)."""


_HELD: set[Path] = set()  # lock files this process holds


@contextmanager
def writer_lock(root: str | os.PathLike[str]) -> Iterator[Path]:
    """Hold ``ROOT/.e2mc.lock`` while writing to ``root``: one writer per run, evaluation or
    search directory. An advisory POSIX record lock (``lockf``, honoured over NFS) on a file naming
    the writer; the kernel releases it however the process ends, so a dead writer's file is taken
    over (with a note), and a live one is :class:`DirectoryBusy`. Stale temporary files of atomic
    writes are removed once held; on release the file goes, and ``root`` if this call made it
    empty."""
    import fcntl

    root = Path(root)
    created = not root.exists()
    root.mkdir(parents=True, exist_ok=True)
    path = root / LOCK
    if path.resolve() in _HELD:  # a second lockf in this process would succeed, and its
        raise DirectoryBusy(f"{root} is already being written by this process")  # close free it
    from e2mc.files import refuse_link, temp_target

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
            raise DirectoryBusy(f"{root} is being written by another process "
                                f"({describe_holder(holder)}); wait for it to end or use "
                                "another directory") from None
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
            print(f"note: {path} was left by a process that is gone ({describe_holder(stale)}); "
                  "taking it over", file=sys.stderr)
        record = {**process_identity(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                  "command": sys.argv}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        for temp in root.iterdir():  # an interrupted atomic write of an earlier writer
            if temp_target(temp.name) is not None and not temp.is_dir():
                temp.unlink(missing_ok=True)
        yield path
    finally:
        _HELD.discard(key)
        path.unlink(missing_ok=True)
        os.close(fd)
        if created and not any(root.iterdir()):  # refused before writing: leave no trace
            root.rmdir()


def live_writer(root: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The record of the process writing ``root`` while it is alive, else ``None``. Only asks
    the kernel (``F_GETLK``; taking the lock would refuse the writer that instant); where the file
    system cannot say, the record's identity decides (:func:`same_process`), and another host's
    process is not waited for."""
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


def describe_holder(record: str | dict[str, Any]) -> str:
    """A lock's record (text or dict) in words: pid, host, since when, command."""
    try:
        r = json.loads(record) if isinstance(record, str) else record
        return (f"pid {r['pid']} on {r['host']} since {r['started']}: "
                f"{' '.join(map(str, r.get('command', [])))}")
    except (ValueError, KeyError, TypeError):
        return "unknown holder"


