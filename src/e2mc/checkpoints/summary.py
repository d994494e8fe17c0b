"""What identifies a loaded checkpoint in a result."""

from __future__ import annotations

import os
from typing import Any

import torch

from e2mc.files import sha256_file

SUMMARY_MAX_VALUES = 256  # values (numbers, strings) per entry of checkpoint_summary


def _plain_values(value: Any) -> tuple[Any, int] | None:
    """``(value as dicts, lists and scalars, number of values)``; None when it holds a tensor.
    Objects of other types become their ``repr``."""
    if isinstance(value, torch.Tensor):
        return None
    if isinstance(value, (dict, list, tuple)):
        items = [_plain_values(v) for v in (value.values() if isinstance(value, dict) else value)]
        if any(item is None for item in items):
            return None
        plain = [item[0] for item in items]  # type: ignore[index]
        count = sum(item[1] for item in items)  # type: ignore[index]
        return (dict(zip(map(str, value), plain, strict=True)) if isinstance(value, dict)
                else plain), count
    if value is None or isinstance(value, (str, int, float, bool)):
        return value, 1
    return repr(value), 1


def checkpoint_summary(info: dict[str, Any], local_file: str | os.PathLike[str] | None = None
                       ) -> dict[str, Any]:
    """A loader's ``info`` small enough to record with a result: the entries without tensors
    and with at most :data:`SUMMARY_MAX_VALUES` values (the others named under ``omitted``),
    and the ``sha256`` of the file read."""
    out: dict[str, Any] = {}
    omitted = []
    for key, value in info.items():
        plain = _plain_values(value)
        if plain is None or plain[1] > SUMMARY_MAX_VALUES:
            omitted.append(str(key))
        else:
            out[str(key)] = plain[0]
    if omitted:
        out["omitted"] = sorted(omitted)
    if local_file is not None:
        out["sha256"] = sha256_file(local_file)
    return out


def recorded_image_size(info: dict[str, Any]) -> int | None:
    """The image size a loaded checkpoint was trained at (a project checkpoint's ``run_config``,
    an exported backbone's sidecar); ``None`` for official and plain files."""
    size = ((info.get("run_config") or {}).get("data") or {}).get("image_size")
    if size is None and info.get("format") == "backbone":
        size = info.get("image_size")
    return int(size) if isinstance(size, int) and not isinstance(size, bool) and size > 0 \
        else None
