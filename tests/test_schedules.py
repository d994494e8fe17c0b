"""The official schedules over a run (issue 43): an EMA teacher's momentum by cosine from its
base value to 1 (BYOL, MoCo v3, DINO: ``method.params.momentum_schedule=cosine``) and DINO's
weight decay by cosine to ``optim.weight_decay_end``; against the official formula
``end + (start - end) (1 + cos(pi t / T)) / 2``."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from e2mc.methods import build_method
from e2mc.optim import set_scheduled_weight_decay

SMALL = {"byol": {"hidden_dim": 16, "dim": 8}, "mocov3": {"dim": 8, "mlp_dim": 16},
         "dino": {"out_dim": 16, "hidden_dim": 16, "bottleneck_dim": 8}}


def official(start: float, end: float, t: int, total: int) -> float:
    return end + (start - end) * (1 + math.cos(math.pi * t / total)) / 2


@pytest.mark.parametrize("name", list(SMALL))
def test_the_teacher_follows_the_cosine_momentum_of_each_step(name: str) -> None:
    torch.manual_seed(0)
    method = build_method(name, backbone="resnet18", small_images=True, in_channels=1,
                          momentum_schedule="cosine", **SMALL[name])
    base = method.momentum
    method.set_run_length(first_iteration=40, iterations=8)  # a run continued at step 40
    assert [method.momentum_at(40 + t) for t in range(8)] == pytest.approx(
        [official(base, 1.0, t, 8) for t in range(8)])
    method.ensure_teacher()
    teacher = [p.clone() for p in method.teacher.parameters()]
    with torch.no_grad():  # a step moved the student
        for p in method._student().parameters():
            p.add_(1.0)
    method.after_step(43)
    m = official(base, 1.0, 3, 8)
    for t, s, new in zip(teacher, method._student().parameters(), method.teacher.parameters(),
                         strict=True):
        torch.testing.assert_close(new, m * t + (1 - m) * s)
    constant = build_method(name, backbone="resnet18", small_images=True, in_channels=1,
                            **SMALL[name])
    constant.set_run_length(0, 8)
    assert constant.momentum_at(5) == constant.momentum


def test_weight_decay_by_cosine_in_the_decayed_groups_only() -> None:
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.AdamW([{"params": [a], "weight_decay": 0.04},
                             {"params": [b], "weight_decay": 0.0}], lr=0.1)
    for t in (0, 3, 10):
        set_scheduled_weight_decay(opt, t, 10, 0.4)
        assert opt.param_groups[0]["weight_decay"] == pytest.approx(official(0.04, 0.4, t, 10))
        assert opt.param_groups[1]["weight_decay"] == 0.0


def test_a_run_applies_both_schedules(tmp_path: Path) -> None:
    """A DINO run of 4 steps: the optimizer's weight decay of its last step, the teacher
    momentum recorded per step by the schedule."""
    import numpy as np

    from e2mc.cli import main
    from helpers import tiny_base  # noqa: F401 - the helpers folder is importable

    data = tmp_path / "d.npz"
    rng = np.random.default_rng(0)
    np.savez(data, x_train=rng.integers(0, 256, (16, 28, 28), dtype=np.uint8),
             y_train=np.arange(16) % 2)
    run = tmp_path / "run"
    assert main(["pretrain", "--config", "fmnist-dino-pretrain", "--data", str(data),
                 "--out", str(run), "--epochs", "1", "--set", "training.batch_size=4",
                 "--set", "training.progress=false", "--set", "training.device=cpu",
                 "--set", "data.num_workers=0", "--set", "training.keep_epoch_checkpoints=false",
                 "--set", "optim.weight_decay_end=0.4", "--set", "optim.warmup_epochs=0",
                 "--set", "method.params.momentum_schedule=cosine",
                 "--set", "method.params.out_dim=16", "--set", "method.params.hidden_dim=16",
                 "--set", "method.params.bottleneck_dim=8"]) == 0
    saved = torch.load(run / "checkpoint.pt", map_location="cpu", weights_only=False)
    decayed = [g for g in saved["optimizer"]["param_groups"] if g["initial_weight_decay"] > 0]
    assert decayed and all(g["weight_decay"] == pytest.approx(official(0.04, 0.4, 3, 4))
                           for g in decayed)
