"""Which heads share a matrix product: the heads (:class:`HeadSpec`), their *streams* (heads
that see the same rows in the same order) and the *groups* of streams that one ``bmm`` serves
(streams of one batch size)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from e2mc.evaluation.probe_settings import LinearProbeConfig


@dataclass(eq=False)
class HeadSpec:
    """One probe: train on ``train_x[rows]`` with ``config`` and ``seed``; evaluate on
    ``eval_x[eval_rows]`` (None: all) after every epoch (``history``) or only the last."""

    rows: np.ndarray
    config: LinearProbeConfig
    seed: int = 0
    eval_rows: np.ndarray | None = None
    history: bool = True

    def __post_init__(self) -> None:
        self.rows = np.asarray(self.rows, dtype=np.int64)
        if self.rows.ndim != 1 or self.rows.size == 0:
            raise ValueError("a head needs a non-empty 1-D array of training rows")
        if self.eval_rows is not None:
            self.eval_rows = np.asarray(self.eval_rows, dtype=np.int64)
            if self.eval_rows.ndim != 1 or self.eval_rows.size == 0:
                raise ValueError("eval_rows must be a non-empty 1-D array (or None)")


def digest(a: np.ndarray | None) -> str | None:
    """The identity of a row set (None stays None)."""
    return None if a is None else hashlib.sha1(np.ascontiguousarray(a).tobytes()).hexdigest()


@dataclass(eq=False)
class Stream:
    """Heads that see the same batches (rows, seed, batch size, standardization)."""

    rows: np.ndarray
    seed: int
    batch_size: int
    standardize: bool
    eval_rows: np.ndarray | None
    heads: list[int] = field(default_factory=list)   # positions in the list of heads
    n: int = 0
    steps_per_epoch: int = 0
    total_steps: int = 0                              # of its longest head
    # where the stream reads its rows, set with the feature bank (engine.build_bank)
    offset: int = 0           # where the stream's rows start in the bank (standardized copy)
    mean: torch.Tensor | None = None
    std: torch.Tensor | None = None
    # its evaluation rows gathered/standardized once (scoring.prepare_eval_rows), else None
    eval_x: torch.Tensor | None = None


def plan_streams(heads: Sequence[HeadSpec]) -> tuple[list[Stream], list[tuple[Stream, int]]]:
    """The streams, in order of their first head, and each head's (stream, slot)."""
    streams: dict[tuple, Stream] = {}
    head_slots: list[tuple[Stream, int]] = []
    for i, h in enumerate(heads):
        key = (digest(h.rows), h.seed, h.config.batch_size, h.config.standardize,
               digest(h.eval_rows))
        s = streams.get(key)
        if s is None:
            s = streams[key] = Stream(h.rows, h.seed, h.config.batch_size,
                                      h.config.standardize, h.eval_rows)
        head_slots.append((s, len(s.heads)))
        s.heads.append(i)
    for s in streams.values():
        s.n = len(s.rows)
        s.steps_per_epoch = -(-s.n // s.batch_size)
        s.total_steps = s.steps_per_epoch * max(heads[i].config.epochs for i in s.heads)
    return list(streams.values()), head_slots


def plan_groups(streams: Sequence[Stream]) -> list[list[Stream]]:
    """Streams by batch size, each longest first (those still training: a prefix)."""
    return [sorted((s for s in streams if s.batch_size == batch_size),
                   key=lambda s: -s.total_steps)
            for batch_size in sorted({s.batch_size for s in streams})]
