"""Frozen-backbone feature extraction (:func:`extract_features`, the package's one extraction
loop) and the on-disk :class:`FeatureCache` the frozen protocols share."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import e2mc.files as files
from e2mc.data.identity import content_digest
from e2mc.data.subsets import LabeledSubset, subset_parts
from e2mc.processes import available_cores, loader_options


@torch.no_grad()
def extract_features(
    backbone: nn.Module,
    dataset: Dataset,
    batch_size: int = 256,
    device: str | torch.device = "cpu",
    num_workers: int | None = None,
    progress: bool = True,
    autocast: bool | None = None,
    shard: bool = True,
    desc: str = "features",
) -> tuple[Any, np.ndarray]:
    """``(features [N, D] float32, labels)`` of ``dataset`` under ``backbone`` in eval mode
    (restored after); a tuple of arrays for a backbone returning a tuple. ``autocast`` None:
    bf16 on an accelerator only. Under ``torchrun`` with ``shard`` the ranks share the work."""
    from e2mc.distributed import is_distributed, rank, world_size
    from e2mc.progress import progress_bar

    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    n = len(dataset)  # type: ignore[arg-type]
    if n == 0:
        raise ValueError("cannot extract features of an empty dataset")
    device = torch.device(device)
    autocast = device.type != "cpu" if autocast is None else autocast
    sharded = shard and is_distributed()
    part: Dataset = dataset
    if sharded:
        per_rank = -(-n // world_size())
        lo, hi = min(n, rank() * per_rank), min(n, (rank() + 1) * per_rank)
        part = LabeledSubset(dataset, range(lo, hi))
    if num_workers is None:  # a core per worker but one, at most 8; none for one batch
        one_batch = len(part) <= batch_size  # type: ignore[arg-type]
        num_workers = 0 if one_batch else max(0, min(8, available_cores() - 1))
    was_training = backbone.training
    backbone.eval().to(device)
    runner = cpu_channels_last(backbone, device)
    loader = _array_batches(part, batch_size) or DataLoader(
        part, batch_size=batch_size, shuffle=False, num_workers=num_workers,
        pin_memory=device.type == "cuda", **loader_options(num_workers))
    feats: list[list[torch.Tensor]] = []  # one list per output of the backbone
    labels: list[torch.Tensor] = []
    several = False

    def outputs(images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        nonlocal several
        images = images.to(device, non_blocking=True)
        if runner is not backbone and images.ndim == 4:
            images = images.contiguous(memory_format=torch.channels_last)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            out = runner(images)
        several = isinstance(out, tuple)
        for o in out if several else (out,):
            if o.ndim != 2:
                raise ValueError(f"backbone must return [B, D] pooled features, got "
                                 f"shape {tuple(o.shape)}")
        return tuple(o.float().cpu() for o in (out if several else (out,)))

    try:
        for images, targets in progress_bar(loader, desc=desc, disable=not progress,
                                            leave=False, total=-(-len(part) // batch_size)):
            out = outputs(images)
            feats = feats or [[] for _ in out]
            for slot, o in zip(feats, out, strict=True):
                slot.append(o)
            labels.append(torch.as_tensor(targets))
        if sharded and not feats:  # an empty shard (more ranks than items): learn the shapes
            image, target = dataset[0]
            feats = [[o[:0]] for o in outputs(torch.as_tensor(image)[None])]
            labels.append(torch.as_tensor(np.asarray(target))[None][:0])
        blocks = [*(torch.cat(slot) for slot in feats), torch.cat(labels)]
        if sharded:
            blocks = _gather_blocks(blocks, n, device)
    finally:
        backbone.train(was_training)
    arrays = tuple(b.numpy() for b in blocks[:-1])
    return (arrays if several else arrays[0]), blocks[-1].numpy()


def _array_batches(dataset: Dataset, batch_size: int) -> Any:
    """Batches of an in-memory :class:`~e2mc.data.datasets.ArrayDataset` (or a subset of one),
    the same tensors as a DataLoader without a PIL image each; None for other data sets."""
    from e2mc.data.datasets import ArrayDataset

    dataset, indices = subset_parts(dataset)
    if not isinstance(dataset, ArrayDataset):
        return None
    return dataset.batches(batch_size, None if indices is None else indices.tolist())


def cpu_channels_last(backbone: nn.Module, device: torch.device) -> nn.Module:
    """On a CPU, a channels-last copy of a convolutional backbone (1.5-2x faster, features equal
    to ~1e-8), else ``backbone`` itself. Never converted in place: a model in training keeps
    its layout, steps and checkpoint."""
    if device.type != "cpu" or isinstance(backbone, BackboneAndProjector) or \
            not any(isinstance(m, nn.Conv2d) for m in backbone.modules()):
        return backbone
    try:
        import copy

        return copy.deepcopy(backbone).to(memory_format=torch.channels_last)
    except Exception:  # noqa: BLE001 - a module that cannot be copied: its own layout
        return backbone


class BackboneAndProjector(nn.Module):
    """A method as a feature extractor: ``forward(images) -> (backbone features [B, F],
    projector embeddings [B, D])``, the method run on the batch's halves as two views (eval-mode
    BatchNorm: an image's vectors do not depend on its batch)."""

    def __init__(self, backbone: nn.Module, method: nn.Module) -> None:
        super().__init__()
        self.backbone, self.method = backbone, method

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        captured: list[torch.Tensor] = []
        hook = self.backbone.register_forward_hook(lambda _m, _i, out: captured.append(out))
        try:
            n = len(x)  # two views of equal size, at least 2 each: pad by repeating images
            x = x[torch.arange(max(4, n + n % 2), device=x.device) % n]
            half = len(x) // 2
            out = self.method([x[:half], x[half:]])  # each image through the backbone once
        finally:
            hook.remove()
        if sum(len(c) for c in captured) != len(x):  # not one backbone call per view
            captured[:] = [self.backbone(x)]
        return torch.cat(captured)[:n], torch.cat(out.embeddings[:2])[:n]


def features_and_embeddings(
    backbone: nn.Module,
    method: nn.Module | None,
    dataset: Dataset,
    batch_size: int = 256,
    device: str | torch.device = "cpu",
    progress: bool = True,
    desc: str = "features",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Backbone features ``[N, F]`` and (with ``method``) projector embeddings ``[N, D]`` as
    float32 tensors, in this process without workers or autocast; modes and devices restored."""
    modules = [m for m in (backbone, method) if m is not None]
    states = [(m, m.training, next(m.parameters(), torch.empty(0)).device) for m in modules]
    model = backbone if method is None else BackboneAndProjector(backbone, method)
    try:
        out, _ = extract_features(model, dataset, batch_size, device, num_workers=0,
                                  progress=progress, autocast=False, shard=False, desc=desc)
    finally:
        for m, training, dev in states:
            m.train(training).to(dev)
    if method is None:
        return torch.from_numpy(out), None
    return torch.from_numpy(out[0]), torch.from_numpy(out[1])


def _gather_blocks(blocks: list[torch.Tensor], n: int, device: torch.device
                   ) -> list[torch.Tensor]:
    """All-gather each tensor's per-rank blocks (padded to ``ceil(n / W)`` rows), to ``n``."""
    import torch.distributed as dist

    per_rank = -(-n // dist.get_world_size())
    comm = device if dist.get_backend() == "nccl" else torch.device("cpu")

    def gather(t: torch.Tensor) -> torch.Tensor:
        padded = t.new_zeros((per_rank, *t.shape[1:]))
        padded[:len(t)] = t
        padded = padded.to(comm)
        out = [torch.empty_like(padded) for _ in range(dist.get_world_size())]
        dist.all_gather(out, padded)
        return torch.cat(out)[:n].cpu()

    return [gather(b) for b in blocks]


def state_dict_digest(module: nn.Module) -> str:
    """SHA-256 of ``module.state_dict()``: names, shapes, dtypes, values (buffers too)."""
    h = hashlib.sha256()
    for name, tensor in module.state_dict().items():
        t = tensor.detach().cpu().contiguous().reshape(-1)
        h.update(f"{name}|{tuple(tensor.shape)}|{t.dtype}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def dataset_fingerprint(dataset: Dataset, data_id: str,
                        content: str | None = None) -> dict[str, Any]:
    """A data set's cache identity: ``data_id``, size, transform ``repr``, a hash of its first
    and last transformed items and the ``content`` digest of every image and label
    (:func:`e2mc.data.identity.content_digest` unless given)."""
    n = len(dataset)  # type: ignore[arg-type]
    base = dataset
    while not hasattr(base, "transform") and hasattr(base, "dataset"):  # through subsets
        base = base.dataset
    h = hashlib.sha256()
    for idx in sorted({0, n - 1}) if n else []:
        image, target = dataset[idx]
        h.update(torch.as_tensor(image).float().contiguous().numpy().tobytes())
        h.update(np.asarray(target).tobytes())
    return {
        "data_id": data_id,  # recorded; the key leaves it out (FeatureCache.key)
        "size": n,
        "transform": repr(getattr(base, "transform", None)),
        "items": h.hexdigest(),
        "content": content if content is not None else content_digest(dataset),
    }


#: Bumped when the stored layout or the identity changes; older entries are then stale.
CACHE_FORMAT = 5


def model_signature(module: nn.Module) -> str:
    """Class name, state-dict names and shapes: another architecture, another key."""
    h = hashlib.sha256(type(module).__name__.encode())
    for name, tensor in module.state_dict().items():
        h.update(f"{name}|{tuple(tensor.shape)}".encode())
    return h.hexdigest()[:16]


def _keyed(identity: dict[str, Any]) -> dict[str, Any]:
    """A cache identity less ``data_id`` (the content identity says what the images are)."""
    return {k: v for k, v in identity.items() if k != "data_id"}


class FeatureCache:
    """Features on disk, one ``.npz`` per key of model, data (:func:`dataset_fingerprint`) and
    precision, written atomically; an entry that does not read back whole with the key's
    identity and shapes is removed and extracted again. An unwritable cache warns once."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        #: Keys found stale (and rebuilt) by this object, for reporting.
        self.rebuilt: list[str] = []
        #: False after a write failed (warned once); entries are still read.
        self.writable = True

    def key(self, backbone: nn.Module, dataset: Dataset, data_id: str,
            checkpoint: str | os.PathLike[str] | None = None,
            precision: str = "float32", content: str | None = None
            ) -> tuple[str, dict[str, Any]]:
        """The cache key (hex) and the identity it was computed from."""
        model_id = (f"file:{files.sha256_file(checkpoint)}:{model_signature(backbone)}"
                    if checkpoint is not None else f"state:{state_dict_digest(backbone)}")
        identity = {"format": CACHE_FORMAT, "model": model_id, "precision": precision,
                    **dataset_fingerprint(dataset, data_id, content)}
        blob = json.dumps(_keyed(identity), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:32], identity

    def path(self, key: str) -> Path:
        return self.root / f"{key}.npz"

    def load(self, key: str, identity: dict[str, Any]) -> tuple[np.ndarray, np.ndarray] | None:
        """The stored ``(features, labels)`` of a valid entry, else None (stale: deleted)."""
        path = self.path(key)
        try:
            if not path.exists():
                return None
        except OSError as err:  # e.g. a directory without search permission
            self._give_up("read", err)
            return None
        try:
            with np.load(path, allow_pickle=False) as stored:
                features, labels = stored["features"], stored["labels"]
                stored_identity = json.loads(str(stored["identity"]))
            if _keyed(stored_identity) != _keyed(identity):
                raise ValueError("identity differs")
            if features.ndim != 2 or len(features) != identity["size"] \
                    or len(labels) != identity["size"]:
                raise ValueError(f"shapes {features.shape}, {labels.shape} for "
                                 f"{identity['size']} items")
        except Exception as exc:  # noqa: BLE001 - any unreadable entry is stale
            import warnings

            warnings.warn(f"feature cache entry {path.name} is stale ({type(exc).__name__}: "
                          f"{exc}); extracting again", stacklevel=2)
            self.rebuilt.append(key)
            with contextlib.suppress(OSError):  # a read-only cache keeps it; it is not used
                path.unlink(missing_ok=True)
            return None
        return features, labels

    def _give_up(self, verb: str, err: OSError) -> None:
        """Warn once (one line on stderr) that the cache cannot be used and stop writing to it."""
        if self.writable:
            print(f"warning: feature cache {self.root} cannot be {verb} ({err.strerror or err}); "
                  "going on without it", file=sys.stderr)
        self.writable = False

    #: A temporary file of an entry older than this (seconds) was left by a killed write.
    STALE_TEMP_S = 600.0

    def _remove_stale_temp_files(self, key: str) -> None:
        """Remove ``key``'s temporaries of killed writes (too old for a live one's)."""
        import time

        for tmp in self.root.glob(f".{self.path(key).name}.*.tmp"):
            try:
                if time.time() - tmp.stat().st_mtime > self.STALE_TEMP_S:
                    tmp.unlink()
            except FileNotFoundError:
                pass

    def get_or_extract(
        self,
        backbone: nn.Module,
        dataset: Dataset,
        data_id: str,
        checkpoint: str | os.PathLike[str] | None = None,
        extractor: Callable[..., tuple[np.ndarray, np.ndarray]] = extract_features,
        content: str | None = None,
        **extract_kwargs: Any,
    ) -> tuple[np.ndarray, np.ndarray, bool]:
        """``(features, labels, hit)``: the valid cached entry, else ``extractor``'s, stored."""
        import torch.distributed as dist

        from e2mc.distributed import is_distributed, is_main_process

        device = torch.device(extract_kwargs.get("device", "cpu"))
        autocast = extract_kwargs.get("autocast")
        autocast = device.type != "cpu" if autocast is None else autocast
        key, identity = self.key(backbone, dataset, data_id, checkpoint,
                                 "bfloat16-autocast" if autocast else "float32", content)
        loaded = self.load(key, identity)
        if is_distributed():
            flags: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(flags, loaded is not None)
            if not all(flags):
                loaded = None
        if loaded is not None:
            return loaded[0], loaded[1], True
        features, labels = extractor(backbone, dataset, **extract_kwargs)
        if is_main_process() and self.writable:
            try:
                self._remove_stale_temp_files(key)
                files.atomic_write(self.path(key), lambda f: np.savez(
                    f, features=features, labels=labels,
                    identity=np.array(json.dumps(identity, sort_keys=True))))
            except OSError as err:  # read-only, full, not a directory: go on without it
                self._give_up("written", err)
        if is_distributed():
            dist.barrier()
        return features, labels, False
