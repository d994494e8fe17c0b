"""The one identity of a data set's content (:func:`data_identity`), recorded wherever a result is
made from data and compared on every reuse, resume and pairing (never the text of a path). It
covers the content alone: files by their bytes (:mod:`e2mc.data.file_hashes`) and labels, arrays
and tensors by their bytes, a subset by its indices and parent, a transform wrapper by its parent,
anything else item by item.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import torch
from torch.utils.data import TensorDataset

from e2mc.data.file_hashes import file_digests
from e2mc.data.subsets import dataset_labels, subset_parts

#: How the content hash is made: 2, files by their bytes (1: by path, size and times).
SCHEME = 2


def update_array(h: Any, array: np.ndarray | torch.Tensor) -> None:
    """Hash ``array``'s dtype, shape and bytes into ``h`` (no copy when contiguous)."""
    if isinstance(array, torch.Tensor):
        t = array.detach().cpu().contiguous()
        h.update(f"{t.dtype}|{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy() if t.numel() else b"")
        return
    a = np.ascontiguousarray(array)
    h.update(f"{a.dtype.str}|{a.shape}".encode())
    h.update(a.reshape(-1).view(np.uint8) if a.size else b"")


def update_content(h: Any, dataset: Any) -> None:
    """Hash what every item of ``dataset`` is made of into ``h`` (the module docstring)."""
    if isinstance(getattr(dataset, "samples", None), list):
        h.update(b"file bytes")
        digests = file_digests([path for path, _ in dataset.samples])
        for (_, label), digest in zip(dataset.samples, digests, strict=True):
            h.update(f"{digest}\0{label}\n".encode())
    elif isinstance(getattr(dataset, "images", None), np.ndarray) \
            and isinstance(getattr(dataset, "labels", None), np.ndarray):
        h.update(b"arrays")
        update_array(h, dataset.images)
        update_array(h, dataset.labels)
    elif isinstance(dataset, TensorDataset):
        h.update(b"tensors")
        for t in dataset.tensors:
            update_array(h, t)
    elif (parts := subset_parts(dataset))[1] is not None:
        h.update(b"subset")
        update_array(h, parts[1])
        update_content(h, parts[0])
    elif hasattr(dataset, "dataset") and hasattr(dataset, "transform"):
        update_content(h, dataset.dataset)  # a transform over a parent: the parent's content
    else:
        h.update(type(dataset).__name__.encode())
        for idx in range(len(dataset)):
            image, target = dataset[idx]
            update_array(h, torch.as_tensor(image))
            update_array(h, np.asarray(target))


def content_digest(dataset: Any) -> str:
    """SHA-256 (hex) of ``dataset``'s content (:func:`update_content`)."""
    h = hashlib.sha256()
    update_content(h, dataset)
    return h.hexdigest()


def data_identity(dataset: Any) -> dict[str, Any]:
    """The content hash, item count and labels' SHA-256 of ``dataset`` (:func:`same_data`)."""
    labels = dataset_labels(dataset, False)
    h = hashlib.sha256()
    if labels is not None:
        update_array(h, labels)  # int64 (dataset_labels)
    return {"content": content_digest(dataset), "size": len(dataset),
            "labels": None if labels is None else h.hexdigest(), "scheme": SCHEME}


def same_data(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """Whether two recorded identities name the same data (an unrecorded one names nothing)."""
    return a is not None and b is not None and all(
        a.get(k) == b.get(k) for k in ("content", "size", "labels"))


def describe_change(old: dict[str, Any] | None, new: dict[str, Any],
                   then: str = "then", now: str = "now") -> str:
    """What differs between two identities, in words (``then``/``now`` name the sides)."""
    if old is None:
        return "no content identity was recorded (made by an older e2mc)"
    if old.get("scheme", 1) != new.get("scheme", 1) and old.get("content") != new.get("content"):
        return ("one identity was recorded by an older e2mc, which named image files by their "
                "path and times, not their bytes: make that result again with this e2mc")
    if old.get("size") != new.get("size"):
        return f"{old.get('size')} images {then}, {new.get('size')} {now}"
    # (the content hash covers the labels too: their own hash tells which changed)
    what = "the labels" if old.get("labels") != new.get("labels") else "the images"
    return (f"{what} differ: content {str(old.get('content'))[:12]} {then}, "
            f"{str(new.get('content'))[:12]} {now}, {new.get('size')} images each")


def _item_keys(dataset: Any) -> list[Any] | None:
    """Per item, a key equal exactly when the content is; None if read item by item."""
    if isinstance(getattr(dataset, "samples", None), list):
        return file_digests([path for path, _ in dataset.samples])
    if hasattr(dataset, "dataset") and hasattr(dataset, "indices"):
        parent = _item_keys(dataset.dataset)
        return None if parent is None else [parent[i] for i in dataset.indices]
    if hasattr(dataset, "dataset") and hasattr(dataset, "transform"):
        return _item_keys(dataset.dataset)
    images = (dataset.tensors[0].detach().cpu().numpy() if isinstance(dataset, TensorDataset)
              else getattr(dataset, "images", None))
    if not isinstance(images, np.ndarray):
        return None
    rows = np.ascontiguousarray(images).reshape(len(images), -1)
    return [hashlib.sha256(row.view(np.uint8)).digest() for row in rows]


def shared_items(train: Any, test: Any) -> int | None:
    """How many items of ``test`` have the content of one of ``train`` (None: not counted)."""
    a, b = _item_keys(train), _item_keys(test)
    if a is None or b is None:
        return None
    seen = set(a)
    return sum(key in seen for key in b)
