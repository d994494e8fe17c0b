"""k-nearest-neighbour classification with cosine similarity: class ``c`` scores
``sum_i exp(s_i / T) [y_i = c]`` (``weighted``) or ``sum_i [y_i = c]`` (``uniform``) over the
``k`` nearest (ties to the lower index, then the lower class). One blockwise search serves every
``k`` and weighting; the ``N_test x N_train`` matrix never exists."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

WEIGHTINGS = ("weighted", "uniform")


@dataclass
class KNNResult:
    """Top-1/top-5 (percent) for one ``k`` and weighting, and the per-test-image predictions
    ``[N]`` and top-5 labels ``[N, min(5, C)]``."""

    k: int
    temperature: float
    top1: float
    top5: float
    predictions: np.ndarray
    top5_predictions: np.ndarray
    weighting: str = "weighted"

    def metrics(self) -> dict[str, float | str]:
        return {"k": self.k, "temperature": self.temperature, "weighting": self.weighting,
                "top1": self.top1, "top5": self.top5}


@torch.no_grad()
def nearest_neighbours(
    bank: torch.Tensor,
    queries: torch.Tensor,
    k: int,
    chunk_size: int = 1024,
    bank_chunk: int = 65536,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(similarities, indices)`` ``[N_q, k]`` of the ``k`` largest dot products of every
    query with the bank, decreasing, ties to the lower bank index (``k`` checked by
    :func:`knn_classify`)."""
    if chunk_size < 1 or bank_chunk < 1:
        raise ValueError("chunk sizes must be >= 1")
    sims_out = torch.empty(len(queries), k, dtype=bank.dtype, device=bank.device)
    idx_out = torch.empty(len(queries), k, dtype=torch.long, device=bank.device)
    for q0 in range(0, len(queries), chunk_size):
        q = queries[q0:q0 + chunk_size]
        best_s, best_i = q.new_empty(0), q.new_empty(0, dtype=torch.long)
        for b0 in range(0, len(bank), bank_chunk):
            sims = q @ bank[b0:b0 + bank_chunk].T
            kk = min(k, sims.shape[1])
            s, i = _sorted_topk(sims, kk)
            if b0 == 0:
                best_s, best_i = s, i
                continue
            # merge with the running list: a stable sort keeps the earlier block first on ties
            cand_s = torch.cat([best_s, s], dim=1)
            cand_i = torch.cat([best_i, i + b0], dim=1)
            s, order = torch.sort(cand_s, dim=1, descending=True, stable=True)
            best_s, best_i = s[:, :k], cand_i.gather(1, order[:, :k])
        sims_out[q0:q0 + len(q)] = best_s
        idx_out[q0:q0 + len(q)] = best_i
    return sims_out, idx_out


def _sorted_topk(values: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` largest per row in decreasing order, ties to the lower column; rows with a tie
    at the border (``topk(k + 1)``'s last two equal) are redone with a stable full sort."""
    if k >= values.shape[1]:
        return torch.sort(values, dim=1, descending=True, stable=True)
    top_s, top_i = values.topk(k + 1, dim=1)
    tied = (top_s[:, k - 1] == top_s[:, k]).nonzero().flatten()
    top_s, top_i = top_s[:, :k], top_i[:, :k]
    # within the k: ties by column (sort by column, then stably by value)
    by_col = top_i.argsort(dim=1)
    top_s, top_i = top_s.gather(1, by_col), top_i.gather(1, by_col)
    order = torch.sort(top_s, dim=1, descending=True, stable=True).indices
    top_s, top_i = top_s.gather(1, order), top_i.gather(1, order)
    if len(tied):
        s, i = torch.sort(values[tied], dim=1, descending=True, stable=True)
        top_s[tied], top_i[tied] = s[:, :k], i[:, :k]
    return top_s, top_i


def class_scores(neighbour_sims: torch.Tensor, neighbour_labels: torch.Tensor, k: int,
                 num_classes: int, weighting: str, temperature: float) -> torch.Tensor:
    """Class scores ``[N, C]`` from the first ``k`` of the sorted neighbours (``weighting``
    checked by :func:`knn_classify`)."""
    weights = ((neighbour_sims[:, :k] / temperature).exp() if weighting == "weighted"
               else torch.ones_like(neighbour_sims[:, :k]))
    scores = torch.zeros(len(neighbour_sims), num_classes, dtype=weights.dtype,
                         device=weights.device)
    return scores.scatter_add_(1, neighbour_labels[:, :k], weights)


def knn_classify(
    train_x: np.ndarray,
    train_y: np.ndarray,
    test_x: np.ndarray,
    test_y: np.ndarray,
    ks: Sequence[int] = (20, 200),
    temperature: float = 0.07,
    num_classes: int | None = None,
    chunk_size: int = 1024,
    device: str | torch.device = "cpu",
    weightings: Sequence[str] = ("weighted",),
    bank_chunk: int = 65536,
) -> list[KNNResult]:
    """kNN accuracy for each ``k`` of ``ks`` (outer) and weighting (inner) from one search of
    ``max(ks)`` neighbours; a ``k`` larger than the training bank is an error."""
    train_y = np.asarray(train_y)
    test_y = np.asarray(test_y)
    if train_x.ndim != 2 or test_x.ndim != 2 or train_x.shape[1] != test_x.shape[1]:
        raise ValueError(f"features must be [N, D] with equal D, got {train_x.shape}, "
                         f"{test_x.shape}")
    if train_y.shape != (len(train_x),) or test_y.shape != (len(test_x),):
        raise ValueError("labels must be 1-D class indices, one per feature row")
    if not ks:
        raise ValueError("need at least one k")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if any(w not in WEIGHTINGS for w in weightings):
        raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {list(weightings)}")
    if not all(1 <= k <= len(train_x) for k in ks):
        raise ValueError(f"k must be in [1, {len(train_x)}] (training bank size), got {list(ks)}")
    device = torch.device(device)
    num_classes = num_classes or int(max(train_y.max(), test_y.max())) + 1
    bank = F.normalize(torch.as_tensor(train_x, device=device).float(), dim=1)
    queries = F.normalize(torch.as_tensor(test_x, device=device).float(), dim=1)
    y = torch.as_tensor(train_y, dtype=torch.long, device=device)
    ty = torch.as_tensor(test_y, dtype=torch.long, device=device)
    sims, idx = nearest_neighbours(bank, queries, max(ks), chunk_size, bank_chunk)
    labels = y[idx]
    results = []
    width = min(5, num_classes)
    for k in ks:
        for weighting in weightings:
            scores = class_scores(sims, labels, k, num_classes, weighting, temperature)
            top = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :width]
            hit1 = (top[:, 0] == ty).float().mean().item() * 100
            hit5 = (top == ty[:, None]).any(dim=1).float().mean().item() * 100
            results.append(KNNResult(k=k, temperature=temperature, top1=hit1, top5=hit5,
                                     predictions=top[:, 0].cpu().numpy(),
                                     top5_predictions=top.cpu().numpy(), weighting=weighting))
    return results
