"""Weighted k-nearest-neighbour classification with cosine similarity.

The InstDisc / DINO rule: features are L2-normalized; for a test image with neighbours
``i = 1..k`` (largest cosine similarity ``s_i`` in the training bank), class ``c`` scores
``sum_i exp(s_i / T) * [y_i = c]``; the prediction is the highest-scoring class.
Similarities are computed in chunks of test images, so memory is ``O(chunk * N_train)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F


@dataclass
class KNNResult:
    """Top-1/top-5 (percent) for one ``k`` and the per-test-image predictions ``[N]`` and
    top-5 labels ``[N, min(5, C)]``."""

    k: int
    temperature: float
    top1: float
    top5: float
    predictions: np.ndarray
    top5_predictions: np.ndarray

    def metrics(self) -> dict[str, float]:
        return {"k": self.k, "temperature": self.temperature, "top1": self.top1,
                "top5": self.top5}


@torch.no_grad()
def knn_scores(
    train_x: torch.Tensor,
    train_y: torch.Tensor,
    test_x: torch.Tensor,
    k: int,
    temperature: float,
    num_classes: int,
    chunk_size: int = 1024,
) -> torch.Tensor:
    """Class scores ``[N_test, num_classes]`` of the weighted cosine kNN rule above."""
    if k < 1 or k > len(train_x):
        raise ValueError(f"k must be in [1, {len(train_x)}] (training bank size), got {k}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    bank = F.normalize(train_x.float(), dim=1)
    queries = F.normalize(test_x.float(), dim=1)
    out = torch.empty(len(queries), num_classes, device=queries.device)
    for start in range(0, len(queries), chunk_size):
        sims = queries[start:start + chunk_size] @ bank.T
        top_sims, top_idx = sims.topk(k, dim=1)
        weights = (top_sims / temperature).exp()
        scores = torch.zeros(len(sims), num_classes, device=queries.device)
        scores.scatter_add_(1, train_y[top_idx], weights)
        out[start:start + chunk_size] = scores
    return out


def knn_classify(
    train_x: np.ndarray,
    train_y: np.ndarray,
    test_x: np.ndarray,
    test_y: np.ndarray,
    ks: tuple[int, ...] = (20, 200),
    temperature: float = 0.07,
    num_classes: int | None = None,
    chunk_size: int = 1024,
    device: str | torch.device = "cpu",
) -> list[KNNResult]:
    """Weighted kNN accuracy for each ``k`` in ``ks`` (defaults: 20 and 200, ``T = 0.07``).
    ``k`` larger than the training bank is an error."""
    train_y = np.asarray(train_y)
    test_y = np.asarray(test_y)
    if train_x.ndim != 2 or test_x.ndim != 2 or train_x.shape[1] != test_x.shape[1]:
        raise ValueError(f"features must be [N, D] with equal D, got {train_x.shape}, "
                         f"{test_x.shape}")
    if train_y.shape != (len(train_x),) or test_y.shape != (len(test_x),):
        raise ValueError("labels must be 1-D class indices, one per feature row")
    device = torch.device(device)
    num_classes = num_classes or int(max(train_y.max(), test_y.max())) + 1
    x = torch.as_tensor(train_x, device=device)
    y = torch.as_tensor(train_y, dtype=torch.long, device=device)
    tx = torch.as_tensor(test_x, device=device)
    ty = torch.as_tensor(test_y, dtype=torch.long, device=device)
    results = []
    for k in ks:
        scores = knn_scores(x, y, tx, k, temperature, num_classes, chunk_size)
        top = scores.topk(min(5, num_classes), dim=1).indices
        hit1 = (top[:, 0] == ty).float().mean().item() * 100
        hit5 = (top == ty[:, None]).any(dim=1).float().mean().item() * 100
        results.append(KNNResult(k=k, temperature=temperature, top1=hit1, top5=hit5,
                                 predictions=top[:, 0].cpu().numpy(),
                                 top5_predictions=top.cpu().numpy()))
    return results
