"""Reading checkpoints safely and writing them atomically (:mod:`e2mc.files`)."""

from __future__ import annotations

import argparse
import os
import pickle
import pickletools
import struct
import warnings
import zipfile
from typing import Any

import torch

from e2mc import files
from e2mc.errors import CorruptFileError


class UntrustedCheckpointError(ValueError):
    """The file holds Python objects that only full unpickling can restore."""


def _vicreg_exclude_bias_and_norm(p: torch.Tensor) -> bool:
    """Stand-in for VICReg's function that its LARS stores in the optimizer's groups."""
    return p.ndim == 1


#: Globals the official checkpoints reference, mapped to harmless stand-ins so that they load
#: with ``weights_only=True`` (VICReg ran as ``__main__`` or, through submitit, ``main_vicreg``).
OFFICIAL_SAFE_GLOBALS: list[Any] = [
    (_vicreg_exclude_bias_and_norm, "__main__.exclude_bias_and_norm"),
    (_vicreg_exclude_bias_and_norm, "main_vicreg.exclude_bias_and_norm"),
    argparse.Namespace,  # the ``args`` of DINO's (and MoCo v3's) training checkpoints: plain values
]


def torch_load(path: str | os.PathLike[str], trust: bool = False, mmap: bool = False) -> Any:
    """The one reader of checkpoint files: ``torch.load`` on CPU with ``weights_only=True``;
    full unpickling (which can run code stored in the file) only with ``trust``, else
    :class:`UntrustedCheckpointError`. An empty, truncated, damaged (:func:`check_torch_file`)
    or non-PyTorch file is a :class:`~e2mc.errors.CorruptFileError` naming it."""
    check_torch_file(path)
    try:
        with torch.serialization.safe_globals(OFFICIAL_SAFE_GLOBALS):
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except (EOFError, RuntimeError, pickle.UnpicklingError, IndexError, struct.error,
            ValueError) as err:  # a cut or damaged pickle stream, a zip torch cannot read
        if "Weights only load failed" not in str(err) or not _pickles_complete(path):
            cause = str(err).split(". ")[0] or type(err).__name__
            raise CorruptFileError(f"{path}: truncated or damaged checkpoint file ({cause}); "
                                   "download or write it again") from err
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
#: (path, inode, size, mtime) of the files whose zip members matched their CRC-32 here: once each.
_VERIFIED: set[tuple[str, int, int, int]] = set()


def check_torch_file(path: Any) -> None:
    """Raise :class:`~e2mc.errors.CorruptFileError` unless ``path`` (file objects pass) begins
    like a ``torch.save`` file and, for a zip archive, every member matches its CRC-32 (a
    flipped or cut byte, which ``torch.load`` does not look for)."""
    if not isinstance(path, (str, os.PathLike)):
        return
    with open(path, "rb") as f:  # FileNotFoundError / IsADirectoryError name the path
        head = f.read(64)
        st = os.fstat(f.fileno())
    if not head:
        raise CorruptFileError(f"{path}: the checkpoint file is empty (0 bytes)")
    if head.startswith(_ZIP_MAGIC):
        key = (os.path.realpath(path), st.st_ino, st.st_size, st.st_mtime_ns)
        if key not in _VERIFIED:
            _check_zip(path)
            _VERIFIED.add(key)
        return
    if head.startswith(_PICKLE_MAGIC):
        return
    text = head.decode("utf-8", errors="replace").strip()
    kind = "JSON" if text[:1] in "{[" else "text" if text.isprintable() else "unknown data"
    raise CorruptFileError(f"{path}: not a PyTorch checkpoint (it holds {kind}, beginning "
                           f"{text[:24]!r})")


def _check_zip(path: str | os.PathLike[str]) -> None:
    """:func:`check_torch_file` of a zip archive: its directory read, every member's CRC-32."""
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
    except (zipfile.BadZipFile, EOFError, ValueError, struct.error, NotImplementedError) as err:
        raise CorruptFileError(f"{path}: truncated or damaged checkpoint file (not a readable "
                               f"zip archive: {err}); download or write it again") from err
    if bad is not None:
        raise CorruptFileError(f"{path}: damaged checkpoint file (the bytes of {bad} do not "
                               "match their CRC-32); download or write it again")


def _pickles_complete(path: str | os.PathLike[str]) -> bool:
    """Whether the five pickles of a legacy ``torch.save`` file each reach their STOP (read
    opcode by opcode, nothing built); a zip archive passed :func:`check_torch_file` whole."""
    with open(path, "rb") as f:
        if f.read(4) == _ZIP_MAGIC:
            return True
        f.seek(0)
        try:
            for _ in range(5):
                for _op in pickletools.genops(f):
                    pass
        except (ValueError, EOFError, MemoryError, OverflowError):
            return False
    return True


def atomic_save(obj: Any, path: str | os.PathLike[str]) -> None:
    """``torch.save`` to a temporary file in the same directory, then ``os.replace``: readers
    never see a half-written file."""
    files.atomic_write(path, lambda f: torch.save(obj, f), "wb")
