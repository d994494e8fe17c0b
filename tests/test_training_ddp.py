"""Two processes with gloo on CPU (as torchrun would start them): DDP trains, only rank 0
writes, and both ranks end with identical parameters."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from e2mc.artifacts import RunDir
from helpers import TINY_RUN, free_port

OVERRIDES = [*TINY_RUN, "addon.name=e2mc", "addon.params={beta: 1.0, gamma: 1.0}"]



def _worker(rank: int, port: int, data: str, run_dir: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE="2")
    import torch.distributed as dist

    from e2mc.config import load_config
    from e2mc.training.run import run_training

    cfg = load_config("fmnist-vicreg-pretrain", [*OVERRIDES, f"data.dataset={data}"])
    result = run_training(cfg, run_dir)
    torch.save({k: v.detach().clone() for k, v in result.method.named_parameters()},
               Path(out) / f"rank{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.slow  # integration: a few seconds on 2 cores
def test_two_gloo_processes_hold_identical_weights(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    data = tmp_path / "tiny.npz"
    np.savez(data, x_train=rng.integers(0, 256, (24, 16, 16), dtype=np.uint8),
             y_train=rng.integers(0, 10, 24))
    run = tmp_path / "run"
    mp.spawn(_worker, args=(free_port(), str(data), str(run), str(tmp_path)), nprocs=2,
             join=True)
    w0 = torch.load(tmp_path / "rank0.pt", weights_only=True)
    w1 = torch.load(tmp_path / "rank1.pt", weights_only=True)
    assert w0.keys() == w1.keys()
    for key in w0:
        assert torch.equal(w0[key], w1[key]), key
    ckpt = torch.load(run / "checkpoint.pt", weights_only=True)
    assert ckpt["world_size"] == 2 and ckpt["step"] == 3 and len(ckpt["rng"]) == 2
    for key, value in w0.items():  # rank 0's checkpoint holds the trained weights
        assert torch.equal(ckpt["model"][key], value)
    from e2mc.methods import build_method

    torch.manual_seed(0)  # the run's initialisation (training.seed = 0), rebuilt here
    init = build_method("vicreg", backbone="cnn5_small", small_images=False,
                        in_channels=1, projector="32-32").state_dict()
    changed = [k for k in w0 if not torch.equal(init[k], w0[k])]
    assert any(k.startswith("backbone.") for k in changed)
    metrics = RunDir(run).read_metrics()
    assert [m["step"] for m in metrics] == [1, 2, 3]  # written once, by rank 0
    assert all("addon/entropy" in m for m in metrics)
