"""Frozen-backbone feature extraction and an on-disk feature cache.

Every protocol that keeps the backbone frozen (linear probe, kNN, SVM) trains on pooled
features, so they are extracted once per (checkpoint, data, transform) and reused: training a
probe many times (fractions x seeds) then costs seconds instead of forward passes.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from e2mc.checkpoints.io import atomic_write


@torch.no_grad()
def extract_features(
    backbone: nn.Module,
    dataset: Dataset,
    batch_size: int = 256,
    device: str | torch.device = "cpu",
    num_workers: int = 0,
    progress: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(features [N, D] float32, labels)`` of ``dataset`` under ``backbone``.

    The backbone runs in eval mode (BatchNorm uses its running statistics, as in every linear
    evaluation protocol) under ``torch.no_grad``; its previous train/eval mode is restored.
    Labels are whatever the dataset yields per item, stacked (class indices ``[N]`` or
    multi-label indicator rows ``[N, C]``).
    """
    from tqdm.auto import tqdm

    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if len(dataset) == 0:  # type: ignore[arg-type]
        raise ValueError("cannot extract features of an empty dataset")
    device = torch.device(device)
    was_training = backbone.training
    backbone.eval().to(device)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers,
                        pin_memory=device.type == "cuda")
    feats: list[torch.Tensor] = []
    labels: list[torch.Tensor] = []
    try:
        for images, targets in tqdm(loader, desc="features", disable=not progress, leave=False):
            out = backbone(images.to(device, non_blocking=True))
            if out.ndim != 2:
                raise ValueError(f"backbone must return [B, D] pooled features, got "
                                 f"shape {tuple(out.shape)}")
            feats.append(out.float().cpu())
            labels.append(torch.as_tensor(targets))
    finally:
        backbone.train(was_training)
    return torch.cat(feats).numpy(), torch.cat(labels).numpy()


def file_digest(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    """SHA-256 of a file's content."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def state_dict_digest(module: nn.Module) -> str:
    """SHA-256 over the names, shapes, dtypes and values of ``module.state_dict()``
    (parameters and buffers such as BatchNorm running statistics)."""
    h = hashlib.sha256()
    for name, tensor in module.state_dict().items():
        t = tensor.detach().cpu().contiguous().reshape(-1)
        h.update(f"{name}|{tuple(tensor.shape)}|{t.dtype}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def dataset_fingerprint(dataset: Dataset, data_id: str) -> dict[str, Any]:
    """What identifies a data set for caching: the caller's ``data_id`` (spec and split), its
    size, the ``repr`` of its transform, and a hash of its first and last items (catches a
    changed file behind the same spec)."""
    n = len(dataset)  # type: ignore[arg-type]
    h = hashlib.sha256()
    for idx in sorted({0, n - 1}) if n else []:
        image, target = dataset[idx]
        h.update(torch.as_tensor(image).float().contiguous().numpy().tobytes())
        h.update(np.asarray(target).tobytes())
    return {
        "data_id": data_id,
        "size": n,
        "transform": repr(getattr(dataset, "transform", None)),
        "items": h.hexdigest(),
    }


class FeatureCache:
    """Features on disk under ``root``, one ``.npz`` per (model, data, transform) key.

    The model is identified by the SHA-256 of its checkpoint file when ``checkpoint`` is given,
    else by :func:`state_dict_digest`; so a changed checkpoint gives a new key and the old
    features are never reused for it. Writes are atomic (temporary file + rename).
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def key(self, backbone: nn.Module, dataset: Dataset, data_id: str,
            checkpoint: str | os.PathLike[str] | None = None) -> tuple[str, dict[str, Any]]:
        """The cache key (hex) and the identity it was computed from."""
        model_id = (f"file:{file_digest(checkpoint)}" if checkpoint is not None
                    else f"state:{state_dict_digest(backbone)}")
        identity = {"model": model_id, **dataset_fingerprint(dataset, data_id)}
        blob = json.dumps(identity, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:32], identity

    def path(self, key: str) -> Path:
        return self.root / f"{key}.npz"

    def get_or_extract(
        self,
        backbone: nn.Module,
        dataset: Dataset,
        data_id: str,
        checkpoint: str | os.PathLike[str] | None = None,
        extractor: Callable[..., tuple[np.ndarray, np.ndarray]] = extract_features,
        **extract_kwargs: Any,
    ) -> tuple[np.ndarray, np.ndarray, bool]:
        """Return ``(features, labels, hit)``: cached arrays when the key exists (``hit``), else
        ``extractor(backbone, dataset, **extract_kwargs)`` stored under the key."""
        key, identity = self.key(backbone, dataset, data_id, checkpoint)
        path = self.path(key)
        if path.exists():
            with np.load(path) as stored:
                return stored["features"], stored["labels"], True
        features, labels = extractor(backbone, dataset, **extract_kwargs)
        atomic_write(path, lambda f: np.savez(
            f, features=features, labels=labels,
            identity=np.array(json.dumps(identity, sort_keys=True))))
        return features, labels, False
