"""Reading checkpoints safely and writing them atomically."""

from __future__ import annotations

import json
import os
import pickle
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch


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
    """
    try:
        with torch.serialization.safe_globals(OFFICIAL_SAFE_GLOBALS):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        if not trust:
            raise UntrustedCheckpointError(
                f"{path}: the file holds Python objects other than tensors and plain containers, "
                "which torch.load(weights_only=True) refuses to rebuild. Loading it fully runs "
                "code stored in the file, so only do it for a file from a source you trust: pass "
                f"trust=True (CLI: --trust-checkpoint). Details: {err}") from err
        warnings.warn(f"{path}: loading with full unpickling (weights_only=False) because "
                      "trust=True", stacklevel=2)
        return torch.load(path, map_location="cpu", weights_only=False)


def atomic_write(path: str | os.PathLike[str], write: Any, mode: str = "wb") -> None:
    """Call ``write(file)`` on a temporary file beside ``path`` (``mode`` ``"wb"`` or ``"w"``),
    flush and fsync it, then ``os.replace`` it onto ``path``; on failure nothing is left."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_save(obj: Any, path: str | os.PathLike[str]) -> None:
    """``torch.save`` to a temporary file in the same directory, then ``os.replace``: readers
    never see a half-written file."""
    atomic_write(path, lambda f: torch.save(obj, f), "wb")


def atomic_write_json(obj: Any, path: str | os.PathLike[str]) -> None:
    atomic_write(path, lambda f: f.write(json.dumps(obj, indent=2, sort_keys=True) + "\n"), "w")
