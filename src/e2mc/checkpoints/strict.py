"""Strict state-dict loading with errors that list what is wrong."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from e2mc.methods.registry import build_method
from e2mc.models import weights_from_checkpoint
from e2mc.models.build import build_on_meta


class CheckpointMismatchError(ValueError):
    """A checkpoint's tensors do not match the model (missing, unexpected or mis-shaped keys)."""


class NonFiniteWeightsError(ValueError):
    """A checkpoint's weights hold NaN or infinite values: nothing computed from them means
    anything (an evaluation would print chance-level numbers)."""


def _listing(title: str, items: list[str]) -> str:
    """``"12 missing keys: a, b, ... and 2 more"``: the count and the first ten names."""
    more = f", ... and {len(items) - 10} more" if len(items) > 10 else ""
    return f"{len(items)} {title}: {', '.join(items[:10])}{more}"


def check_keys(expected: Mapping[str, torch.Tensor], given: Mapping[str, torch.Tensor],
               fmt: str, to_file_name: Callable[[str], str] = lambda k: k,
               unmapped: list[str] | None = None) -> None:
    """Raise :class:`CheckpointMismatchError` (one line, the file's names) unless ``given`` has
    exactly the keys and shapes of ``expected`` (``unmapped`` file keys count as unexpected),
    then :func:`check_finite`: the one check of every loader."""
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
    check_finite(given, to_file_name)


def check_finite(state: Mapping[str, torch.Tensor],
                 to_file_name: Callable[[str], str] = lambda k: k) -> None:
    """Raise :class:`NonFiniteWeightsError` (naming the first such tensor) unless every floating
    tensor of ``state`` is finite. One sum per tensor first (a finite sum clears it), element
    by element only where it is not (the sum may overflow)."""
    floats = [(k, v) for k, v in state.items() if v.is_floating_point() and v.numel()]
    sums = torch.stack([v.sum().float() for _, v in floats]) if floats else torch.zeros(0)
    if bool(torch.isfinite(sums).all()):
        return
    for (key, value), total in zip(floats, sums.tolist(), strict=True):
        bad = 0 if math.isfinite(total) else int((~torch.isfinite(value)).sum())
        if bad:
            raise NonFiniteWeightsError(
                f"the checkpoint's {to_file_name(key)} holds {bad:,} of {value.numel():,} values "
                "that are not finite (NaN or inf); nothing was loaded")


def rebuild(name: str, hparams: dict[str, Any]) -> Any:
    """``build_method`` for a model whose every weight a checkpoint is about to set (no
    pretrained backbone weights are fetched)."""
    with weights_from_checkpoint():
        return build_method(name, **hparams)


def load_strict(build: Callable[[], nn.Module], state: Mapping[str, torch.Tensor], fmt: str,
                to_file_name: Callable[[str], str] = lambda k: k,
                unmapped: list[str] | None = None) -> nn.Module:
    """Build the model without initialising it (meta device), check ``state`` strictly, then
    adopt the tensors (cast to the model's dtypes). Every tensor comes from ``state``, also
    where :func:`build_on_meta` had to build on the CPU."""
    model = build_on_meta(build)
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
