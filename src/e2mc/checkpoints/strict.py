"""Strict state-dict loading with errors that list what is wrong."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn


class CheckpointMismatchError(ValueError):
    """A checkpoint's tensors do not match the model (missing, unexpected or mis-shaped keys)."""


def _listing(title: str, items: list[str]) -> str:
    """``"12 missing keys: a, b, ... and 2 more"``: the count and the first ten names."""
    more = f", ... and {len(items) - 10} more" if len(items) > 10 else ""
    return f"{len(items)} {title}: {', '.join(items[:10])}{more}"


def check_keys(expected: Mapping[str, torch.Tensor], given: Mapping[str, torch.Tensor],
               fmt: str, to_file_name: Callable[[str], str] = lambda k: k,
               unmapped: list[str] | None = None) -> None:
    """Raise :class:`CheckpointMismatchError` unless ``given`` has exactly the keys and shapes
    of ``expected``. Names in the message are the file's names (``to_file_name`` maps a model
    key back); ``unmapped`` are file keys no rule of the format maps (reported as unexpected).
    The message is one line: the count of each kind and its first ten names."""
    missing = [to_file_name(k) for k in expected if k not in given]
    unexpected = list(unmapped or []) + [to_file_name(k) for k in given if k not in expected]
    mismatched = [f"{to_file_name(k)}: file {tuple(v.shape)} vs model {tuple(expected[k].shape)}"
                  for k, v in given.items()
                  if k in expected and tuple(v.shape) != tuple(expected[k].shape)]
    if missing or unexpected or mismatched:
        found = [_listing(title, items) for title, items in
                 (("missing keys", missing), ("unexpected keys", unexpected),
                  ("shape mismatches", mismatched)) if items]
        raise CheckpointMismatchError(f"checkpoint does not match the model (format assumed: "
                                      f"{fmt}); nothing was loaded: {'; '.join(found)}")


def load_strict(build: Callable[[], nn.Module], state: Mapping[str, torch.Tensor], fmt: str,
                to_file_name: Callable[[str], str] = lambda k: k,
                unmapped: list[str] | None = None) -> nn.Module:
    """Build the model without initialising it (meta device), check ``state`` strictly, then
    adopt the tensors (cast to the model's dtypes). Every tensor comes from ``state``. A model
    whose constructor computes on tensors (torchvision's RegNets read their widths off one) is
    built on the CPU instead, its initial weights then replaced all the same."""
    try:
        with torch.device("meta"):
            model = build()
    except NotImplementedError:  # "Cannot copy out of meta tensor": built for real
        model = build()
    expected = model.state_dict()
    check_keys(expected, state, fmt, to_file_name, unmapped)
    cast: dict[str, Any] = {k: v.detach().to(dtype=expected[k].dtype).contiguous()
                           for k, v in state.items()}
    model.load_state_dict(cast, strict=True, assign=True)
    still_meta = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if still_meta:
        raise CheckpointMismatchError(f"tensors outside the state dict were left uninitialised: "
                                      f"{still_meta[:10]}")
    return model
