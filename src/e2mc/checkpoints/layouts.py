"""The MoCo v3, Barlow Twins, solo-learn and lightly training checkpoints loaded strictly into
e2mc's methods (:func:`load_layout`): heads compared layer by layer first (one line where they
differ, nothing loaded), the official optimizer state put in the model's parameter order; and
DINO's (:func:`load_dino`; DINO's backbone-only files are the generic backbone layout)."""

from __future__ import annotations

import re
import warnings
from typing import Any

import torch
from torch import nn

from e2mc.checkpoints.official import (
    Detected,
    infer_resnet,
    is_state_dict,
    linears,
    unprefixed,
    vit_depth,
)
from e2mc.checkpoints.strict import (
    CheckpointMismatchError,
    check_keys,
    load_strict,
    rebuild,
)
from e2mc.models.build import build_on_meta

#: moco-v3's ViTs all have 12 attention heads (timm's ``vit_small`` has 6).
MOCOV3_VIT_HEADS = {"vit_small": 12, "vit_base": 12, "vit_conv_small": 12, "vit_conv_base": 12}
#: arch -> (the e2mc backbone, its (width, patch, depth)).
MOCOV3_VIT_NAMES = {"vit_base": ("timm:vit_base_patch16_224", (768, 16, 12)),
                    "vit_small": ("timm:vit_small_patch16_224(num_heads=12)", (384, 16, 12))}


class HeadMismatchError(CheckpointMismatchError):
    """The file's projector or predictor is another architecture than the method's."""


def layers(state: dict[str, Any], part: str) -> dict[int, str]:
    """Index -> ``Linear``, ``Linear(bias)``, ``BatchNorm``, ``BatchNorm(no affine)`` (else the
    tensor names) of the layers with tensors of the ``nn.Sequential`` ``part``."""
    names: dict[int, set[str]] = {}
    pat = re.compile(re.escape(part) + r"\.(\d+)\.(.+)")
    for k in state:
        if m := pat.fullmatch(k):
            names.setdefault(int(m.group(1)), set()).add(m.group(2))
    out = {}
    for i, held in sorted(names.items()):
        if "running_mean" in held:
            out[i] = "BatchNorm" if "weight" in held else "BatchNorm(no affine)"
        elif "weight" in held and state[f"{part}.{i}.weight"].ndim == 2:
            out[i] = "Linear(bias)" if "bias" in held else "Linear"
        else:
            out[i] = "/".join(sorted(held))
    return out


def describe(state: dict[str, Any], part: str) -> str:
    """:func:`layers` in words: ``"0:Linear(bias) 1:BatchNorm 3:Linear"``, or ``"(none)"``."""
    return " ".join(f"{i}:{kind}" for i, kind in layers(state, part).items()) or "(none)"


def infer_hparams(det: Detected, state: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The constructor arguments of ``det.method`` read off the shapes (model names)."""
    hp: dict[str, Any] = dict(infer_resnet(state, "backbone.") or {}) or _vit(det, state)
    proj, pred = linears(state, "projector"), linears(state, "predictor")
    if det.method in ("vicreg", "barlowtwins") and proj:
        hp["projector"] = "-".join(str(int(w.shape[0])) for _, w in proj)
    elif det.method == "swav":
        for key, name in (("projection_head.0.weight", "hidden_dim"),
                          ("projection_head.3.weight", "output_dim"),
                          ("prototypes.weight", "n_prototypes")):
            if key in state:
                hp[name] = int(state[key].shape[0])
    elif det.method == "simsiam":
        for key, name in (("projector.6.weight", "dim"), ("predictor.0.weight", "pred_dim")):
            if key in state:
                hp[name] = int(state[key].shape[0])
    elif det.method == "mocov3" and proj:
        hp.update(dim=int(proj[-1][1].shape[0]), projector_layers=len(proj))
        if len(proj) > 1:
            hp["mlp_dim"] = int(proj[0][1].shape[0])
        elif pred:
            hp["mlp_dim"] = int(pred[0][1].shape[0])
        if pred:
            hp["predictor_last_bn"] = f"predictor.{pred[-1][0] + 1}.running_mean" in state
    elif det.method == "byol" and proj:
        hp.update(hidden_dim=int(proj[0][1].shape[0]), dim=int(proj[-1][1].shape[0]),
                  hidden_bias="projector.0.bias" in state)
        if pred and int(pred[0][1].shape[0]) != hp["hidden_dim"]:
            hp["pred_hidden_dim"] = int(pred[0][1].shape[0])
    elif det.method == "simclr" and proj:
        hp.update(hidden_dim=int(proj[0][1].shape[0]), dim=int(proj[-1][1].shape[0]))
    return hp


def _vit(det: Detected, state: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The backbone of moco-v3's ``vit_base`` / ``vit_small``, and any timm ViT's channels."""
    proj = state.get("backbone.patch_embed.proj.weight")
    if proj is None:
        return {}
    hp: dict[str, Any] = {"in_channels": int(proj.shape[1])}
    depth = vit_depth(state)
    name, shape = MOCOV3_VIT_NAMES.get(det.extra.get("arch", ""), (None, None))
    if det.format == "mocov3" and name and (int(proj.shape[0]), int(proj.shape[-1]),
                                            depth) == shape:
        hp["backbone"] = name
    return hp


class UnknownArchitectureError(ValueError):
    """A file whose keys do not give its backbone's architecture, and nothing named it."""


def _backbone_known(det: Detected, hp: dict[str, Any], source: str | None) -> None:
    """Refuse a backbone that neither the shapes nor an argument name."""
    arch = det.extra.get("arch")
    if det.format == "mocov3" and isinstance(arch, str) and arch.startswith("vit_conv"):
        raise ValueError(f"{source or 'the checkpoint'} holds moco-v3's {arch}, a ViT with a "
                         "convolutional stem that no e2mc backbone has")
    if "backbone" in hp:
        return
    what = f"moco-v3's {arch}" if det.format == "mocov3" and arch else "its backbone"
    raise UnknownArchitectureError(
        f"{source or 'the checkpoint'}: cannot tell the architecture of {what} from its keys: "
        "name it (e2mc eval: --arch; convert, continue: --backbone; Python: backbone=)")


def _check_vit_heads(det: Detected, model: nn.Module) -> None:
    """Refuse a backbone with another number of heads than moco-v3's ViT (12)."""
    want = MOCOV3_VIT_HEADS.get(det.extra.get("arch", "")) if det.format == "mocov3" else None
    blocks = getattr(getattr(model, "backbone", None), "blocks", None)
    if want is None or blocks is None or len(blocks) == 0:
        return
    got = getattr(getattr(blocks[0], "attn", None), "num_heads", None)
    if got is not None and got != want:
        raise HeadMismatchError(f"the file holds moco-v3's {det.extra['arch']} ({want} attention "
                                f"heads) and the backbone {model.hparams.get('backbone')} has "
                                f"{got}: the same shapes, another model; nothing was loaded")


def _head_differences(det: Detected, model: nn.Module, state: dict[str, torch.Tensor]
                      ) -> list[str]:
    """The heads whose layers differ between the file and the model, in words."""
    expected = model.state_dict()
    out = []
    for part in ("projector", "predictor", "teacher.projector"):
        mine, theirs = layers(expected, part), layers(state, part)
        if all(mine.get(i) == kind for i, kind in theirs.items()):
            continue  # the same, or layers missing (a strict key error, not an architecture)
        theirs_name = det.to_file_key(part + ".").rstrip(".")  # module.base_encoder.fc
        out.append(f"the file's {theirs_name} is [{describe(state, part)}], "
                   f"e2mc's {det.method} {part} [{describe(expected, part)}]")
    return out


def load_layout(det: Detected, source: str | None, new_heads: bool,
                method_hparams: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The method ``det.method`` loaded strictly from ``det``; ``method_hparams`` override the
    shapes and must still match. Heads of another architecture are a :class:`HeadMismatchError`,
    or with ``new_heads`` the backbone alone is loaded (``info["new_heads"]``)."""
    name = det.method
    assert name is not None  # detect names it or refuses
    state, unmapped = det.mapped()
    hp = {**infer_hparams(det, state), **method_hparams}
    _backbone_known(det, hp, source)
    if det.format == "solo-learn" and hp.get("small_images"):
        warnings.warn("solo-learn's CIFAR stem pads its 3x3 conv1 by 2 pixels, e2mc's "
                      "small-image stem by 1: the weights load, and e2mc's feature maps are 2 "
                      "pixels smaller (32 instead of 34 on CIFAR)", stacklevel=2)
    probe = build_on_meta(lambda: rebuild(name, hp))
    _check_vit_heads(det, probe)
    label = f"{det.format} ({name})"
    differences = _head_differences(det, probe, state)
    info: dict[str, Any] = {"format": det.format, "method": name, "epoch": det.epoch,
                            "optimizer": None, "source": source,
                            "dropped_keys": [det.prefix + k for k in det.dropped], **det.extra}
    if differences and not new_heads:
        raise HeadMismatchError(f"{source or 'the checkpoint'} ({det.format} layout): "
                                f"{'; '.join(differences)}: the heads differ, nothing was loaded "
                                "(--new-heads / new_heads=True starts from its backbone alone, "
                                "with new heads)")
    if differences:
        return _backbone_alone(det, name, hp, state, info)
    teacher = any(k.startswith("teacher.") for k in state)
    names = {}
    if teacher and "teacher_initialized" in probe.state_dict():
        state["teacher_initialized"] = torch.tensor(True)
        names["teacher_initialized"] = "(the file's momentum encoder)"
    model = load_strict(lambda: rebuild(name, hp), state, label,
                        lambda k: names.get(k) or det.to_file_key(k), unmapped)
    info.update(hparams=model.hparams, optimizer=_optimizer_in_model_order(det, model))
    return model, info


def _backbone_alone(det: Detected, name: str, hp: dict[str, Any],
                    state: dict[str, torch.Tensor], info: dict[str, Any]
                    ) -> tuple[Any, dict[str, Any]]:
    """``new_heads``: the file's student backbone in a new model."""
    model = rebuild(name, hp)
    sd = {k[len("backbone."):]: v for k, v in state.items() if k.startswith("backbone.")}
    load_backbone_alone(model, sd, f"{det.format} backbone",
                        lambda k: det.to_file_key("backbone." + k))
    info.update(hparams=model.hparams, new_heads=head_names(model))
    return model, info


def head_names(model: nn.Module) -> list[str]:
    """The modules of ``model`` with parameters besides its backbone and EMA teacher."""
    return sorted(n for n, m in model.named_children()
                  if n not in ("backbone", "teacher") and any(True for _ in m.parameters()))


def load_backbone_alone(model: Any, sd: dict[str, torch.Tensor], label: str,
                        to_file_name: Any) -> None:
    """``sd`` loaded strictly into ``model.backbone`` (keys, shapes and finiteness checked)."""
    check_keys(model.backbone.state_dict(), sd, label, to_file_name)
    model.backbone.load_state_dict(sd, strict=True)


def _official_parameter_order(det: Detected, model: nn.Module) -> list[str] | None:
    """The model names of the parameters the official optimizer lists, in its order (MoCo v3:
    the state dict's; Barlow Twins: weights, then biases); None for the libraries' files."""
    if det.format not in ("mocov3", "barlowtwins"):
        return None
    params = dict(model.named_parameters())
    order = [mk for k in det.state_dict if (mk := det.to_model_key(k)) in params]
    if det.format == "barlowtwins":
        order = ([k for k in order if params[k].ndim != 1]
                 + [k for k in order if params[k].ndim == 1])
    return order


def _optimizer_in_model_order(det: Detected, model: nn.Module) -> dict[str, Any] | None:
    """The official optimizer state re-indexed in ``model.parameters()`` order (one group,
    the first's settings); None where the order is unknown or does not cover the model."""
    state, order = det.optimizer, _official_parameter_order(det, model)
    if state is None or order is None:
        return None
    try:
        saved = [i for g in state["param_groups"] for i in g["params"]]
        per_param = state["state"]
        settings = {k: v for k, v in state["param_groups"][0].items() if k != "params"}
    except (KeyError, TypeError, IndexError):
        return None
    names = [n for n, _ in model.named_parameters()]
    if len(saved) != len(order) or sorted(order) != sorted(names):
        return None
    where = dict(zip(order, saved, strict=True))
    return {"state": {j: per_param[where[n]] for j, n in enumerate(names)
                      if where[n] in per_param},
            "param_groups": [{**settings, "params": list(range(len(names)))}]}


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
