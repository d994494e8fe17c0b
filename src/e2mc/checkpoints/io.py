"""Reading checkpoints safely and writing them atomically."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pickle
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch

from e2mc.errors import CorruptFileError, InputError


class UntrustedCheckpointError(ValueError):
    """The file holds Python objects that only full unpickling can restore."""


def _vicreg_exclude_bias_and_norm(p: torch.Tensor) -> bool:
    """Stand-in for VICReg's ``exclude_bias_and_norm``, which its LARS stores in the optimizer's
    parameter groups (so ``resnet50_fullckpt.pth`` references it by name)."""
    return p.ndim == 1


#: Globals the official checkpoints reference, mapped to harmless stand-ins so that they load
#: with ``weights_only=True``. VICReg ran ``main_vicreg.py`` as a script (``__main__``) or
#: imported it through submitit (``main_vicreg``).
OFFICIAL_SAFE_GLOBALS: list[tuple[Any, str]] = [
    (_vicreg_exclude_bias_and_norm, "__main__.exclude_bias_and_norm"),
    (_vicreg_exclude_bias_and_norm, "main_vicreg.exclude_bias_and_norm"),
]


def torch_load(path: str | os.PathLike[str], trust: bool = False) -> Any:
    """``torch.load`` on CPU with ``weights_only=True``; full unpickling only if ``trust``.

    Full unpickling can execute arbitrary code stored in the file, so it is refused unless the
    caller says the file comes from a trusted source (``trust=True``, ``--trust-checkpoint``).
    A file that is empty, truncated or not a PyTorch file at all (text, JSON) is a
    :class:`~e2mc.errors.CorruptFileError` naming it.
    """
    check_torch_file(path)
    try:
        with torch.serialization.safe_globals(OFFICIAL_SAFE_GLOBALS):
            return torch.load(path, map_location="cpu", weights_only=True)
    except (EOFError, RuntimeError) as err:  # a cut zip archive or pickle stream
        cause = str(err).split(". ")[0] or type(err).__name__
        raise CorruptFileError(f"{path}: truncated or damaged checkpoint file ({cause}); "
                               "download or write it again") from err
    except pickle.UnpicklingError as err:
        if "Weights only load failed" not in str(err):
            raise CorruptFileError(f"{path}: not a readable PyTorch checkpoint ({err})") from err
        if not trust:
            raise UntrustedCheckpointError(
                f"{path}: the file holds Python objects other than tensors and plain containers, "
                "which torch.load(weights_only=True) refuses to rebuild. Loading it fully runs "
                "code stored in the file, so only do it for a file from a source you trust: pass "
                f"trust=True (CLI: --trust-checkpoint). Details: {err}") from err
        warnings.warn(f"{path}: loading with full unpickling (weights_only=False) because "
                      "trust=True", stacklevel=2)
        return torch.load(path, map_location="cpu", weights_only=False)


_ZIP_MAGIC = b"PK\x03\x04"
_PICKLE_MAGIC = b"\x80"  # legacy torch.save files (the official .pth.tar) are pickle streams


def check_torch_file(path: Any) -> None:
    """Raise :class:`~e2mc.errors.CorruptFileError` unless ``path`` (a path; file objects pass)
    begins like a file of ``torch.save`` (a zip archive or a pickle stream)."""
    if not isinstance(path, (str, os.PathLike)):
        return
    with open(path, "rb") as f:  # FileNotFoundError / IsADirectoryError name the path
        head = f.read(64)
    if not head:
        raise CorruptFileError(f"{path}: the checkpoint file is empty (0 bytes)")
    if head.startswith(_ZIP_MAGIC) or head.startswith(_PICKLE_MAGIC):
        return
    text = head.decode("utf-8", errors="replace").strip()
    kind = "JSON" if text[:1] in "{[" else "text" if text.isprintable() else "unknown data"
    raise CorruptFileError(f"{path}: not a PyTorch checkpoint (it holds {kind}, beginning "
                           f"{text[:24]!r})")


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


def atomic_save(obj: Any, path: str | os.PathLike[str]) -> None:
    """``torch.save`` to a temporary file in the same directory, then ``os.replace``: readers
    never see a half-written file."""
    atomic_write(path, lambda f: torch.save(obj, f), "wb")


def atomic_write_json(obj: Any, path: str | os.PathLike[str]) -> None:
    atomic_write(path, lambda f: f.write(json.dumps(obj, indent=2, sort_keys=True) + "\n"), "w")
