"""Files laid out as the official repositories save them, for the tests of the checkpoint
layouts: the state dict renamed part by part, and facebookresearch/moco-v3's training file."""

from __future__ import annotations

import torch
from torch import nn


def renamed(sd: dict[str, torch.Tensor], rules: list[tuple[str, str]]) -> dict[str, torch.Tensor]:
    """The file's state dict: for each ``(model prefix, file name prefix)`` in order, the model's
    tensors under that prefix (so the file lists them in the official module order)."""
    out: dict[str, torch.Tensor] = {}
    for src, dst in rules:
        for k, v in sd.items():
            if k.startswith(src):
                out[dst + k[len(src):]] = v.clone()
    return out


def assert_same_tensors(loaded: nn.Module, model: nn.Module) -> None:
    want, got = model.state_dict(), loaded.state_dict()
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        if k != "teacher_initialized":
            assert torch.equal(got[k], v), k
    if "teacher_initialized" in got:
        assert bool(got["teacher_initialized"])  # the file's momentum encoder is kept


MOCO_RESNET = [("backbone.", "module.base_encoder."), ("projector.", "module.base_encoder.fc."),
               ("teacher.backbone.", "module.momentum_encoder."),
               ("teacher.projector.", "module.momentum_encoder.fc."),
               ("predictor.", "module.predictor.")]


def official_order(model: nn.Module, rules: list[tuple[str, str]]) -> list[str]:
    """The model names of ``model.parameters()`` of the official module, in its order."""
    names = [n for n, _ in model.named_parameters()]
    return [n for src, _ in rules for n in names if n.startswith(src)]


def mocov3_file(model: nn.Module, arch: str, rules: list[tuple[str, str]],
                optimizer: str = "lars") -> dict:
    """What main_moco.py saves: the optimizer state of ``model.parameters()`` (one group; the
    momentum encoder and the frozen parameters get no gradient, so no state), the state of
    official parameter ``i`` a constant ``i``: LARS's ``mu`` (ResNets) or AdamW's moments
    (ViTs)."""
    order = official_order(model, rules)
    params = dict(model.named_parameters())

    def state(i: int, p: torch.Tensor) -> dict:
        if optimizer == "lars":
            return {"mu": torch.full_like(p, float(i))}
        return {"step": torch.tensor(1000.0), "exp_avg": torch.full_like(p, float(i)),
                "exp_avg_sq": torch.full_like(p, float(i) ** 2)}

    group = ({"lr": 4.8, "weight_decay": 1e-6, "momentum": 0.9, "trust_coefficient": 0.001}
             if optimizer == "lars" else
             {"lr": 1.5e-4, "weight_decay": 0.1, "betas": (0.9, 0.999), "eps": 1e-8,
              "amsgrad": False})
    return {"epoch": 100, "arch": arch, "state_dict": renamed(model.state_dict(), rules),
            "optimizer": {"state": {i: state(i, params[n]) for i, n in enumerate(order)
                                    if params[n].requires_grad},
                          "param_groups": [{"params": list(range(len(order))), **group}]},
            "scaler": {"scale": 65536.0, "_growth_tracker": 0}}
