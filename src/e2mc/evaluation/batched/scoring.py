"""The heads scored after each epoch of their stream (top-1/top-5; at the last epoch also loss,
predictions and top-5 labels) into an :class:`~e2mc.evaluation.linear.EpochTracker` each, and
the best of several finished heads (:func:`best_head`)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Sequence

import torch

from e2mc.evaluation.batched.engine import Group, head_weights
from e2mc.evaluation.batched.plan import HeadSpec, Stream, digest
from e2mc.evaluation.linear import EpochTracker, ProbeResult

#: Elements (rows x dim) of evaluation features kept gathered / standardized per stream.
EVAL_CACHE_ELEMENTS = 1 << 28

#: How :func:`best_head` chooses (recorded with a learning-rate grid's choice).
BEST_HEAD_RULE = "best last-epoch validation top-1; ties: lower validation loss, then grid order"


def prepare_eval_rows(streams: Sequence[Stream], ex_all: torch.Tensor) -> None:
    """Gather / standardize the streams' evaluation rows once, up to :data:`EVAL_CACHE_ELEMENTS`."""
    prepared: dict[tuple, torch.Tensor] = {}
    budget = EVAL_CACHE_ELEMENTS
    dim = ex_all.shape[1]
    for s in streams:
        if s.eval_rows is None and not s.standardize:
            continue
        key = (digest(s.eval_rows), digest(s.rows) if s.standardize else None)
        if key not in prepared:
            n_eval = len(ex_all) if s.eval_rows is None else len(s.eval_rows)
            if n_eval * dim > budget:
                continue
            budget -= n_eval * dim
            ex = ex_all if s.eval_rows is None else \
                ex_all[torch.as_tensor(s.eval_rows, device=ex_all.device)]
            prepared[key] = (ex - s.mean) / s.std if s.standardize else ex
        s.eval_x = prepared[key]


def new_trackers(heads: Sequence[HeadSpec], ey_all: torch.Tensor) -> list[EpochTracker]:
    """One record per head, with the labels of its evaluation rows."""
    return [EpochTracker(ey_all if h.eval_rows is None
                         else ey_all[torch.as_tensor(h.eval_rows, device=ey_all.device)])
            for h in heads]


def _eval_batches(s: Stream, ex_all: torch.Tensor, ey_all: torch.Tensor, labels: torch.Tensor,
                  chunk: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The stream's evaluation rows (standardized as its training rows) and labels, in chunks."""
    rows = None if s.eval_rows is None else torch.as_tensor(s.eval_rows, device=ex_all.device)
    n = len(ex_all) if rows is None else len(rows)
    for start in range(0, n, chunk):
        if s.eval_x is not None:  # prepared once
            yield s.eval_x[start:start + chunk], labels[start:start + chunk]
            continue
        if rows is None:
            x, y = ex_all[start:start + chunk], ey_all[start:start + chunk]
        else:
            x, y = ex_all[rows[start:start + chunk]], ey_all[rows[start:start + chunk]]
        yield (x - s.mean) / s.std if s.standardize else x, y


def evaluate_stream(group: Group, j: int, epochs_done: int, heads: Sequence[HeadSpec],
                    ex_all: torch.Tensor, ey_all: torch.Tensor, records: list[EpochTracker],
                    chunk: int, trace: Counter | None = None) -> None:
    """Record epoch ``epochs_done`` of stream ``j``'s heads (every epoch with ``history``).
    A row is a top-1 (top-5) hit when no (fewer than 5) class scores above its label's;
    predictions are computed only for a new best top-1 or the last epoch."""
    s = group.streams[j]
    sel = [(slot, i) for slot, i in enumerate(s.heads)
           if heads[i].config.epochs >= epochs_done
           and (heads[i].history or heads[i].config.epochs == epochs_done)]
    if not sel:
        return
    classes = group.classes
    final = [heads[i].config.epochs == epochs_done for _, i in sel]
    cols = torch.tensor([slot * classes + c for slot, _ in sel for c in range(classes)],
                        device=ex_all.device)
    w = group.weight[j].index_select(1, cols)                    # [D, G * C]
    b = group.bias[j, 0].index_select(0, cols)                   # [G * C]
    finite = (torch.isfinite(w).all(dim=0) & torch.isfinite(b)).view(len(sel), classes).all(1)
    labels = records[sel[0][1]].labels

    def batches() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return _eval_batches(s, ex_all, ey_all, labels, chunk)

    top1, top5, loss = _accuracies(w, b, batches, len(labels), finite, any(final), trace)
    need = [g for g, (_, i) in enumerate(sel) if final[g] or top1[g] > records[i].best[0]]
    preds, tops = _predictions(w, b, batches, need, [final[g] for g in need], classes, trace)
    for g, (_, i) in enumerate(sel):  # the last call of a head is its final epoch
        records[i].add(top1[g], top5[g], preds.get(g), tops.get(g),
                       loss[g] if final[g] else float("nan"))


def _accuracies(w: torch.Tensor, b: torch.Tensor, batches, n: int, finite: torch.Tensor,
                with_loss: bool, trace: Counter | None
                ) -> tuple[list[float], list[float], list[float]]:
    """Top-1 and top-5 (percent; 0 for a head with non-finite weights) and mean cross-entropy
    (when ``with_loss``) of each of the ``G`` heads of ``w [D, G * C]``, ``b [G * C]``."""
    n_sel = len(finite)
    classes = len(b) // n_sel
    k = min(5, classes)
    hits1 = torch.zeros(n_sel, dtype=torch.long, device=w.device)
    hits5 = torch.zeros_like(hits1)
    loss = torch.zeros(n_sel, dtype=torch.float64, device=w.device)
    for x, y in batches():
        m = len(x)
        logits = torch.addmm(b[:, None], w.T, x.T).view(n_sel, classes, m)
        if trace is not None:
            trace[("eval", m, w.shape[0], n_sel * classes)] += 1
        picked = logits.gather(1, y.view(1, 1, m).expand(n_sel, 1, m))
        above = (logits > picked).sum(dim=1)                      # [G, m]
        hits1 += (above == 0).sum(dim=1)
        hits5 += (above < k).sum(dim=1)
        if with_loss:
            loss += (torch.logsumexp(logits, dim=1) - picked[:, 0]).sum(dim=1).double()
    # as the sequential probe computes it: a float32 mean of 0/1 hits, times 100 in Python
    top1 = [100.0 * v for v in (hits1.float() / n * finite).tolist()]
    top5 = [100.0 * v for v in (hits5.float() / n * finite).tolist()]
    return top1, top5, (loss / n).tolist()


def _predictions(w: torch.Tensor, b: torch.Tensor, batches, need: list[int], final: list[bool],
                 classes: int, trace: Counter | None
                 ) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]]:
    """For heads ``need`` (positions in ``w``'s ``G``): the argmax predictions, and where
    ``final`` the top-k labels ``[N, k]`` (stable sort: ties to the lower class)."""
    if not need:
        return {}, {}
    k = min(5, classes)
    preds: dict[int, list[torch.Tensor]] = {g: [] for g in need}
    tops: dict[int, list[torch.Tensor]] = {g: [] for g, f in zip(need, final, strict=True) if f}
    sub_cols = torch.tensor([g * classes + c for g in need for c in range(classes)],
                            device=w.device)
    w_sub, b_sub = w.index_select(1, sub_cols), b.index_select(0, sub_cols)
    for x, _ in batches():
        logits = torch.addmm(b_sub, x, w_sub).view(len(x), len(need), classes)
        if trace is not None:
            trace[("eval", len(x), w.shape[0], len(need) * classes)] += 1
        arg = logits.argmax(dim=-1)
        for pos, g in enumerate(need):
            if g in tops:
                tops[g].append(torch.sort(logits[:, pos], dim=-1, descending=True,
                                          stable=True).indices[:, :k])
            preds[g].append(arg[:, pos])
    return ({g: torch.cat(p) for g, p in preds.items()},
            {g: torch.cat(t) for g, t in tops.items()})


def head_results(records: Sequence[EpochTracker], groups: Sequence[Group] | None = None,
                 head_slots: Sequence[tuple[Stream, int]] | None = None) -> list[ProbeResult]:
    """Each head's result, in order; with ``groups`` and ``head_slots`` its weights too."""
    results = []
    for i, record in enumerate(records):
        result = record.result()
        if groups is not None and head_slots is not None:
            s, slot = head_slots[i]
            group = next(g for g in groups if s in g.streams)
            result.weight, result.bias = head_weights(group, s, slot)
        results.append(result)
    return results


def best_head(results: Sequence[ProbeResult]) -> int:
    """Position of the best of finished heads (:data:`BEST_HEAD_RULE`): the highest last-epoch
    top-1; ties: the lower last-epoch loss (NaN last), then the first."""
    if not results:
        raise ValueError("no heads to choose from")

    def loss(r: ProbeResult) -> float:
        return math.inf if math.isnan(r.loss_last) else r.loss_last

    return min(range(len(results)), key=lambda i: (-results[i].top1_last, loss(results[i]), i))
