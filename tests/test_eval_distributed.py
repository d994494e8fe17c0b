"""Two gloo processes (as torchrun starts them): sharded feature extraction gives every rank the
features of one process, and the feature cache is written once and then read by both."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.utils.data import TensorDataset

from e2mc.evaluation.features import FeatureCache, extract_features
from helpers import free_port

WORLD = 2
N = 23  # not a multiple of the world size: the last shard is shorter


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten())


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(3)
    return TensorDataset(torch.randn(N, 1, 7, 7, generator=g), torch.arange(N) % 4)


def worker(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        seen = []

        def extractor(backbone, dataset, **kw):
            x, y = extract_features(backbone, dataset, **kw)
            seen.append(len(x))
            return x, y

        model, rows = net(), [0]
        model.register_forward_hook(lambda m, inp, out: rows.__setitem__(0, rows[0] + len(out)))
        x, y = extract_features(model, data(), batch_size=4, num_workers=0, progress=False)
        cache = FeatureCache(Path(out_dir) / "cache")
        cx, cy, hit1 = cache.get_or_extract(net(), data(), "d", extractor=extractor,
                                            batch_size=5, num_workers=0, progress=False)
        _, _, hit2 = cache.get_or_extract(net(), data(), "d", extractor=extractor,
                                          batch_size=5, num_workers=0, progress=False)
        entries = len(list((Path(out_dir) / "cache").glob("*.npz")))
        np.savez(Path(out_dir) / f"rank{rank}.npz", x=x, y=y, cx=cx, cy=cy,
                 hits=np.array([hit1, hit2]), entries=entries, rows=rows[0])
    finally:
        dist.destroy_process_group()



@pytest.mark.slow  # two spawned processes import torch: ~10 s on an idle 2-core machine
def test_sharded_extraction_equals_one_process(tmp_path: Path) -> None:
    mp.spawn(worker, args=(free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    ref_x, ref_y = extract_features(net(), data(), batch_size=7, num_workers=0, progress=False)
    assert ref_x.shape == (N, 3)
    for rank in range(WORLD):
        with np.load(tmp_path / f"rank{rank}.npz") as got:
            np.testing.assert_allclose(got["x"], ref_x, rtol=1e-5, atol=1e-6)
            np.testing.assert_array_equal(got["y"], ref_y)
            np.testing.assert_allclose(got["cx"], ref_x, rtol=1e-5, atol=1e-6)
            np.testing.assert_array_equal(got["cy"], ref_y)
            assert got["hits"].tolist() == [False, True]
            assert int(got["entries"]) == 1
            # each rank ran the backbone on its shard only: ceil(23 / 2) = 12, then 11
            assert int(got["rows"]) == (12 if rank == 0 else 11)
