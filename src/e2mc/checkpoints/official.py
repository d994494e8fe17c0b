"""The official VICReg, SwAV and SimSiam checkpoint layouts (docs/method.md#official-checkpoints).

- VICReg ``resnet50_fullckpt.pth``: ``{"epoch", "model", "optimizer"}``, keys
  ``module.backbone.*`` and ``module.projector.*``.
- SwAV ``swav_800ep_pretrain.pth.tar``: bare state dict (or training checkpoint
  ``{"epoch", "state_dict", "optimizer", ...}``), keys ``module.<resnet>``,
  ``module.projection_head.*``, ``module.prototypes.weight``.
- SimSiam ``checkpoint_0099.pth.tar``: ``{"epoch", "arch", "state_dict", "optimizer"}``, keys
  ``module.encoder.<resnet>``, ``module.encoder.fc.*`` (projector), ``module.predictor.*``.
- Backbone only (VICReg ``resnet50.pth``, torchvision state dicts): torchvision names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import torch

#: (file prefix, model prefix) rules per format, first match wins.
KEY_RULES: dict[str, list[tuple[str, str]]] = {
    "vicreg": [("backbone.", "backbone."), ("projector.", "projector.")],
    "swav": [("projection_head.", "projection_head."), ("prototypes.", "prototypes."),
             ("", "backbone.")],
    "simsiam": [("encoder.fc.", "projector."), ("encoder.", "backbone."),
                ("predictor.", "predictor.")],
    "backbone": [("", "backbone.")],
}
METHOD_FORMATS = ("vicreg", "swav", "simsiam")


@dataclass
class Detected:
    """An official checkpoint split into its parts; ``state_dict`` without ``module.``."""

    format: str
    state_dict: dict[str, torch.Tensor]
    prefix: str = ""
    epoch: int | None = None
    optimizer: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_model_key(self, key: str) -> str | None:
        for src, dst in KEY_RULES[self.format]:
            if key.startswith(src):
                return dst + key[len(src):]
        return None

    def to_file_key(self, model_key: str) -> str:
        for src, dst in KEY_RULES[self.format]:
            if model_key.startswith(dst):
                return self.prefix + src + model_key[len(dst):]
        return self.prefix + model_key

    def mapped(self) -> tuple[dict[str, torch.Tensor], list[str]]:
        """The state dict under model names, and the file keys no rule maps."""
        out, unmapped = {}, []
        for k, v in self.state_dict.items():
            mk = self.to_model_key(k)
            if mk is None:
                unmapped.append(self.prefix + k)
            else:
                out[mk] = v
        return out, unmapped


def _is_state_dict(obj: Any) -> bool:
    return (isinstance(obj, dict) and len(obj) > 0
            and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()))


def detect(obj: Any, method: str | None = None) -> Detected:
    """Find which official layout ``obj`` (a loaded checkpoint) has; ``method`` checks it."""
    if not isinstance(obj, dict):
        raise ValueError(f"a checkpoint must be a dict, got {type(obj).__name__}")
    epoch = obj.get("epoch")
    optimizer = obj.get("optimizer")
    if _is_state_dict(obj.get("model")):
        sd, container = obj["model"], "{'epoch', 'model', 'optimizer'}"
    elif _is_state_dict(obj.get("state_dict")):
        sd, container = obj["state_dict"], "{'epoch', 'state_dict', 'optimizer'}"
    elif _is_state_dict(obj):
        sd, container, epoch, optimizer = obj, "bare state dict", None, None
    else:
        raise ValueError("not a known checkpoint layout: expected a state dict, or a dict with "
                         f"'model' or 'state_dict'; top-level keys: {sorted(map(str, obj))[:10]}")
    prefix = "module." if all(k.startswith("module.") for k in sd) else ""
    sd = {k[len(prefix):]: v for k, v in sd.items()}
    keys = list(sd)

    def has(p: str) -> bool:
        return any(k.startswith(p) for k in keys)

    if has("projection_head.") or has("prototypes."):
        fmt = "swav"
    elif has("backbone.") and has("projector."):
        fmt = "vicreg"
    elif has("encoder.") and has("predictor."):
        fmt = "simsiam"
    elif not any(has(p) for p in ("backbone.", "projector.", "encoder.", "predictor.")):
        fmt = "backbone"
    else:
        raise ValueError(f"cannot tell the layout of this {container}: keys start "
                         f"{sorted({k.split('.')[0] for k in keys})[:10]}")
    if method is not None and method not in METHOD_FORMATS:
        raise ValueError(f"method must be one of {METHOD_FORMATS}, got {method!r}")
    if method is not None and fmt not in (method, "backbone"):
        raise ValueError(f"the file has the official {fmt} layout, not {method}")
    extra = {"arch": obj["arch"]} if isinstance(obj.get("arch"), str) else {}
    return Detected(fmt, sd, prefix, epoch if isinstance(epoch, int) else None,
                    optimizer if isinstance(optimizer, dict) else None, extra)


_RESNET_DEPTHS = {("basic", (2, 2, 2, 2)): "resnet18", ("basic", (3, 4, 6, 3)): "resnet34",
                  ("bottleneck", (3, 4, 6, 3)): "resnet50",
                  ("bottleneck", (3, 4, 23, 3)): "resnet101",
                  ("bottleneck", (3, 8, 36, 3)): "resnet152"}


def infer_resnet(sd: dict[str, torch.Tensor], prefix: str = "") -> dict[str, Any] | None:
    """``{"backbone", "small_images", "in_channels"}`` of a torchvision ResNet state dict
    (keys under ``prefix``), or ``None`` when it is not a recognisable ResNet."""
    conv1 = sd.get(prefix + "conv1.weight")
    if conv1 is None or conv1.ndim != 4:
        return None
    blocks = []
    for layer in range(1, 5):
        pat = re.compile(re.escape(f"{prefix}layer{layer}.") + r"(\d+)\.")
        ids = {int(m.group(1)) for k in sd if (m := pat.match(k))}
        blocks.append(len(ids))
    kind = "bottleneck" if prefix + "layer1.0.conv3.weight" in sd else "basic"
    arch = _RESNET_DEPTHS.get((kind, tuple(blocks)))
    if arch == "resnet50":
        conv2 = sd[prefix + "layer1.0.conv2.weight"]
        if conv2.shape[0] == 128:
            arch = "resnext50_32x4d" if conv2.shape[1] == 4 else "wide_resnet50_2"
    if arch is None:
        return None
    return {"backbone": arch, "small_images": conv1.shape[-1] == 3,
            "in_channels": int(conv1.shape[1])}


def infer_hparams(fmt: str, model_sd: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Constructor arguments read off the shapes (model names); explicit ones override them."""
    hp: dict[str, Any] = dict(infer_resnet(model_sd, "backbone.") or {})
    if fmt == "vicreg":
        linears = sorted((int(m.group(1)), v.shape[0]) for k, v in model_sd.items()
                         if (m := re.fullmatch(r"projector\.(\d+)\.weight", k)) and v.ndim == 2)
        if linears:
            hp["projector"] = "-".join(str(n) for _, n in linears)
    elif fmt == "swav":
        for key, name in (("projection_head.0.weight", "hidden_dim"),
                          ("projection_head.3.weight", "output_dim"),
                          ("prototypes.weight", "n_prototypes")):
            if key in model_sd:
                hp[name] = int(model_sd[key].shape[0])
    elif fmt == "simsiam":
        for key, name in (("projector.6.weight", "dim"), ("predictor.0.weight", "pred_dim")):
            if key in model_sd:
                hp[name] = int(model_sd[key].shape[0])
    return hp
