"""Writing files safely: atomically (a temporary file beside the target, then a rename), into
directories checked for write permission first; and the SHA-256 that identifies a file's
content. No torch: checkpoints are written through :func:`e2mc.checkpoints.io.atomic_save`."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from e2mc.errors import InputError


def _new_file_mode(target: Path) -> int:
    """The mode a plain ``open(target, "w")`` would give: the existing file's, else 0o666 less
    the umask (``mkstemp`` would leave 0o600, unreadable for colleagues)."""
    try:
        return target.stat().st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def atomic_write(path: str | os.PathLike[str], write: Any, mode: str = "wb") -> None:
    """Call ``write(file)`` on a temporary file beside ``path`` (``mode`` ``"wb"`` or ``"w"``),
    flush and fsync it, then ``os.replace`` it onto ``path``; on failure nothing is left and
    ``path`` is untouched. The file gets the mode a plain write would give (umask). A full disk
    is an ``OSError(ENOSPC)`` naming ``path``. A temporary file left by a killed process is
    named ``.NAME.*.tmp`` (``RunDir.stale_temp_files``)."""
    target = Path(path)
    if target.is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a directory, not a file", str(target))
    target.parent.mkdir(parents=True, exist_ok=True)
    file_mode = _new_file_mode(target)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, file_mode)
        with os.fdopen(fd, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException as err:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT) \
                and err.filename is None:
            raise OSError(err.errno, os.strerror(err.errno), str(target)) from err
        raise


def check_writable_dir(path: str | os.PathLike[str], what: str = "directory") -> None:
    """Raise :class:`~e2mc.errors.InputError` (one line naming ``path``) unless a file can be
    created in the directory ``path`` or, when it does not exist yet, in its nearest existing
    parent: a read-only file system or a directory without write permission is found before
    any work is done, not at the first write. Nothing is left behind."""
    target = Path(path)
    where = target
    while not where.exists() and where != where.parent:
        where = where.parent
    if not where.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(where))
    try:
        fd, probe = tempfile.mkstemp(prefix=".e2mc-write-test.", suffix=".tmp", dir=where)
    except OSError as err:
        if err.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        inside = "" if where == target else f" (in {where})"
        reason = (err.strerror or os.strerror(err.errno)).lower()
        raise InputError(f"{target}: cannot write the {what} here{inside}: {reason}") from err
    os.close(fd)
    with contextlib.suppress(FileNotFoundError):  # (removed by a cleaner meanwhile)
        os.unlink(probe)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Replace ``path`` atomically by ``text`` (:func:`atomic_write`)."""
    atomic_write(path, lambda f: f.write(text), "w")


def atomic_write_json(obj: Any, path: str | os.PathLike[str]) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def sha256_file(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    """SHA-256 (hex) of a file's content, read in ``chunk``-byte blocks: the one identity of a
    file's bytes (checkpoints, downloads, predictions)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()
