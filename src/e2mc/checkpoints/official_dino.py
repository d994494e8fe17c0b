"""The official DINO training checkpoint (``{"student", "teacher", "optimizer", "epoch", "args",
"dino_loss"}``, keys in docs/checkpoints.md), loaded strictly into the ``dino`` method. DINO's
backbone-only files are the generic backbone layout (``--new-heads``)."""

from __future__ import annotations

import re
from typing import Any

import torch

from e2mc.checkpoints.official import (
    infer_resnet,
    is_state_dict,
    linears,
    unprefixed,
    vit_depth,
)
from e2mc.checkpoints.strict import load_strict, rebuild

#: ViT widths of timm's names: DINO's vit_tiny / vit_small / vit_base.
_VIT_SIZES = {192: "tiny", 384: "small", 768: "base"}


def is_dino_checkpoint(obj: Any) -> bool:
    """A dict with ``student`` and ``teacher`` state dicts."""
    return isinstance(obj, dict) and is_state_dict(obj.get("student")) \
        and is_state_dict(obj.get("teacher"))


def dino_state(obj: dict[str, Any]) -> tuple[dict[str, torch.Tensor], list[str], dict[str, str]]:
    """``(state under the DINO method's names, unmapped file keys, model key -> file key)``."""
    state: dict[str, torch.Tensor] = {}
    unmapped: list[str] = []
    names: dict[str, str] = {}
    for part, to in (("student", ""), ("teacher", "teacher.")):
        sd, prefix = unprefixed(obj[part])
        for k, v in sd.items():
            if k.startswith(("backbone.", "head.")):
                state[to + k], names[to + k] = v, f"{part}.{prefix}{k}"
            else:
                unmapped.append(f"{part}.{prefix}{k}")
    loss = obj.get("dino_loss")
    if isinstance(loss, dict) and isinstance(loss.get("center"), torch.Tensor):
        state["center"], names["center"] = loss["center"], "dino_loss.center"
    state["teacher_initialized"] = torch.tensor(True)
    names["teacher_initialized"] = "(the file's teacher)"
    return state, unmapped, names


def infer_dino_hparams(state: dict[str, torch.Tensor], args: Any = None) -> dict[str, Any]:
    """The DINO constructor arguments read off the shapes and the run's ``args``."""
    hp: dict[str, Any] = {}
    resnet = infer_resnet(state, "backbone.")
    if resnet is not None:
        hp.update(resnet)
    elif "backbone.patch_embed.proj.weight" in state:
        proj = state["backbone.patch_embed.proj.weight"]
        size = _VIT_SIZES.get(int(proj.shape[0]))
        if size is not None and vit_depth(state) == 12:
            hp.update(backbone=f"timm:vit_{size}_patch{int(proj.shape[-1])}_224",
                      in_channels=int(proj.shape[1]))
    v = state.get("head.last_layer.weight_v")
    if v is not None:
        hp.update(out_dim=int(v.shape[0]), bottleneck_dim=int(v.shape[1]))
    mlp = linears(state, "head.mlp")
    if mlp:
        hp["nlayers"] = len(mlp)
        hp["use_bn_in_head"] = any(re.fullmatch(r"head\.mlp\.\d+\.running_mean", k)
                                   for k in state)
        if len(mlp) > 1:
            hp["hidden_dim"] = int(mlp[0][1].shape[0])
    values = vars(args) if hasattr(args, "__dict__") else dict(args or {})
    for key in ("norm_last_layer", "teacher_temp", "warmup_teacher_temp",
                "warmup_teacher_temp_epochs", "freeze_last_layer", "clip_grad"):
        if key in values:
            hp[key] = values[key]
    if "momentum_teacher" in values:
        hp["momentum"] = values["momentum_teacher"]
    if "norm_last_layer" not in hp and "head.last_layer.weight_g" in state:
        hp["norm_last_layer"] = bool(torch.all(state["head.last_layer.weight_g"] == 1))
    return hp


def load_dino(obj: dict[str, Any], source: str | None, method: str | None,
              method_hparams: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The DINO model of an official training checkpoint, loaded strictly; ``method_hparams``
    override the file's. ``info["optimizer"]`` is None: DINO's two parameter groups list the
    parameters in another order than the model's."""
    if method not in (None, "dino"):
        raise ValueError(f"the file has the official DINO layout (student and teacher), not "
                         f"{method}")
    state, unmapped, names = dino_state(obj)
    hp = {**infer_dino_hparams(state, obj.get("args")), **method_hparams}
    model = load_strict(lambda: rebuild("dino", hp), state, "dino (official)",
                        lambda k: names.get(k, k), unmapped)
    epoch = obj.get("epoch")
    info = {"format": "dino", "epoch": epoch if isinstance(epoch, int) else None,
            "optimizer": None, "source": source, "hparams": model.hparams}
    return model, info
