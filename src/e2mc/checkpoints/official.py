"""Which checkpoint layout a loaded file has (:func:`detect`): the official VICReg, SwAV,
SimSiam, MoCo v3 and Barlow Twins files, solo-learn's and lightly's, and backbone-only files;
their keys are tabled in docs/checkpoints.md. SimCLR v2 as Separius/SimCLRv2-Pytorch converts
it (``{"resnet", "head"}``, ``sk0`` 1x only) is renamed to torchvision's ResNet names."""

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
    "barlowtwins": [("backbone.", "backbone."), ("projector.", "projector."), ("bn.", "bn.")],
    "mocov3": [("base_encoder.fc.", "projector."), ("base_encoder.", "backbone."),
               ("momentum_encoder.fc.", "teacher.projector."),
               ("momentum_encoder.", "teacher.backbone."), ("predictor.", "predictor.")],
    "solo-learn": [("momentum_backbone.", "teacher.backbone."),
                   ("momentum_projector.", "teacher.projector."), ("backbone.", "backbone."),
                   ("projector.", "projector."), ("predictor.", "predictor.")],
    "lightly": [("backbone_momentum.", "teacher.backbone."),
                ("projection_head_momentum.layers.", "teacher.projector."),
                ("backbone.", "backbone."), ("projection_head.layers.", "projector."),
                ("prediction_head.layers.", "predictor.")],
}
#: The methods each layout may hold, and all of them (``method=`` of :func:`detect`).
LAYOUT_METHODS: dict[str, tuple[str, ...]] = {
    "vicreg": ("vicreg",), "swav": ("swav",), "simsiam": ("simsiam",),
    "barlowtwins": ("barlowtwins",), "mocov3": ("mocov3",),
    "solo-learn": ("byol", "simclr", "mocov3", "barlowtwins"), "lightly": ("byol", "simclr")}
METHOD_FORMATS = tuple(dict.fromkeys(m for held in LAYOUT_METHODS.values() for m in held))
#: The layouts :mod:`e2mc.checkpoints.layouts` loads (heads checked, teacher, optimizer order).
LAYOUT_FORMATS = ("barlowtwins", "mocov3", "solo-learn", "lightly")
#: Where a ResNet's torchvision names sit in ``nn.Sequential(*list(resnet.children())[:-1])``
#: (the backbone of lightly's examples): conv1, bn1, relu, maxpool, layer1-4, avgpool.
_RESNET_CHILDREN = {0: "conv1", 1: "bn1", 4: "layer1", 5: "layer2", 6: "layer3", 7: "layer4"}


@dataclass
class Detected:
    """An official checkpoint split into its parts; ``state_dict`` without ``module.``."""

    format: str
    state_dict: dict[str, torch.Tensor]
    prefix: str = ""
    epoch: int | None = None
    optimizer: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    method: str | None = None  # the e2mc method the file holds
    rules: list[tuple[str, str]] | None = None  # this file's, where not the format's
    #: file keys of no part of the method (solo-learn's online classifiers), not mapped
    dropped: list[str] = field(default_factory=list)

    @property
    def key_rules(self) -> list[tuple[str, str]]:
        return self.rules if self.rules is not None else KEY_RULES[self.format]

    def to_model_key(self, key: str) -> str | None:
        for src, dst in self.key_rules:
            if key.startswith(src):
                return dst + key[len(src):]
        return None

    def to_file_key(self, model_key: str) -> str:
        for src, dst in self.key_rules:
            if model_key.startswith(dst):
                return self.prefix + src + model_key[len(dst):]
        return self.prefix + model_key

    def mapped(self) -> tuple[dict[str, torch.Tensor], list[str]]:
        """The state dict under model names, and the file keys no rule maps."""
        names = {k: self.to_model_key(k) for k in self.state_dict if k not in set(self.dropped)}
        return ({mk: self.state_dict[k] for k, mk in names.items() if mk is not None},
                [self.prefix + k for k, mk in names.items() if mk is None])


def is_state_dict(obj: Any) -> bool:
    """Whether ``obj`` is a non-empty plain state dict (string keys, tensor values)."""
    return (isinstance(obj, dict) and len(obj) > 0
            and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()))


def unprefixed(sd: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """``(sd without a "module." prefix that every key has, that prefix or "")``."""
    prefix = "module." if all(k.startswith("module.") for k in sd) else ""
    return {k[len(prefix):]: v for k, v in sd.items()}, prefix


def detect(obj: Any, method: str | None = None) -> Detected:
    """Find which official layout ``obj`` (a loaded checkpoint) has; ``method`` checks it."""
    if not isinstance(obj, dict):
        raise ValueError(f"a checkpoint must be a dict, got {type(obj).__name__}")
    epoch = obj.get("epoch")
    optimizer = obj.get("optimizer")
    if is_simclr_v2(obj):  # SimCLR v2 converted from TensorFlow: its ResNet, torchvision's names
        sd, container = simclr_v2_backbone(obj), "SimCLR v2 file {'resnet', 'head'}"
    elif is_state_dict(obj.get("model")):
        sd, container = obj["model"], "{'epoch', 'model', 'optimizer'}"
    elif is_state_dict(obj.get("state_dict")) and "pytorch-lightning_version" in obj:
        sd, container, optimizer = obj["state_dict"], "Lightning checkpoint", None
    elif is_state_dict(obj.get("state_dict")):
        sd, container = obj["state_dict"], "{'epoch', 'state_dict', 'optimizer'}"
    elif is_state_dict(obj):
        sd, container, epoch, optimizer = obj, "bare state dict", None, None
    else:
        raise ValueError("not a known checkpoint layout: expected a state dict, or a dict with "
                         f"'model' or 'state_dict'; top-level keys: {sorted(map(str, obj))[:10]}")
    sd, prefix = unprefixed(sd)
    keys = list(sd)

    def has(p: str) -> bool:
        return any(k.startswith(p) for k in keys)

    lightning = container == "Lightning checkpoint"  # its optimizer_states are not restored
    guess: str | None = None
    rules: list[tuple[str, str]] | None = None
    dropped: list[str] = []
    if has("base_encoder.") and (has("momentum_encoder.") or has("predictor.")):
        fmt = "mocov3"
        if has("base_encoder.head."):  # the ViT's projector is its head
            rules = [(src.replace(".fc.", ".head."), dst) for src, dst in KEY_RULES[fmt]]
    elif has("backbone.") and (has("projection_head.layers.") or has("backbone_momentum.")
                               or has("prediction_head.layers.")):
        fmt, guess, rules = "lightly", _lightly_method(keys), _lightly_rules(keys)
    elif has("backbone.") and has("projector.") and (
            lightning or has("momentum_backbone.") or has("classifier.")):
        fmt, guess = "solo-learn", _solo_method(keys)
        dropped = [k for k in keys if k.startswith(("classifier.", "momentum_classifier."))]
    elif has("projection_head.") or has("prototypes."):
        fmt = "swav"
    elif has("backbone.") and has("projector.") and has("bn."):
        fmt = "barlowtwins"
    elif has("backbone.") and has("projector."):
        fmt = "vicreg"
    elif has("encoder.") and has("predictor."):
        fmt = "simsiam"
    elif not any(has(p) for p in ("backbone.", "projector.", "encoder.", "predictor.")):
        fmt = "backbone"
    else:
        raise ValueError(f"cannot tell the layout of this {container}: keys start "
                         f"{sorted({k.split('.')[0] for k in keys})[:10]}")
    held = None
    if fmt != "backbone":
        allowed = LAYOUT_METHODS[fmt]
        guess = guess or (allowed[0] if len(allowed) == 1 else None)
        what = f"official {fmt}" if fmt not in ("solo-learn", "lightly") else \
            f"{fmt} {guess or ''}".rstrip()
        if method is not None and (method not in allowed or guess not in (None, method)):
            raise ValueError(f"the file has the {what} layout, not {method}")
        held = method or guess
        if held is None:
            raise ValueError(f"this {container} has the {fmt} layout, whose keys do not say "
                             f"which method it holds: name it (method=, --method) among "
                             f"{', '.join(allowed)}")
    extra = {"arch": obj["arch"]} if isinstance(obj.get("arch"), str) else {}
    return Detected(fmt, sd, prefix, epoch if isinstance(epoch, int) else None,
                    optimizer if isinstance(optimizer, dict) else None, extra, held, rules,
                    dropped)


def bare_backbone(obj: Any) -> Detected | None:
    """``obj`` as the backbone-only layout when it is a plain state dict (a ``module.``
    prefix on every key dropped), else None."""
    if not is_state_dict(obj):
        return None
    sd, prefix = unprefixed(obj)
    return Detected("backbone", sd, prefix)


def known_layout(bare: Detected) -> bool:
    """Whether :func:`detect` tells the layout of a plain state dict (an official method's or
    a backbone's names), rather than refusing it as ambiguous."""
    try:
        detect(bare.state_dict)
    except ValueError:
        return False
    return True


def _last_is_batchnorm(keys: list[str], part: str) -> bool:
    """Whether the last layer of the ``nn.Sequential`` ``part`` (file names) is a BatchNorm."""
    pat = re.compile(re.escape(part) + r"(\d+)\.")
    layers = {int(m.group(1)) for k in keys if (m := pat.match(k))}
    return bool(layers) and f"{part}{max(layers)}.running_mean" in keys


def _lightly_method(keys: list[str]) -> str | None:
    """The method of a lightly model read off its parts: a prediction head and a momentum
    backbone are BYOL's; a projection head ending in a BatchNorm alone is SimCLR's."""
    if any(k.startswith("prediction_head.") for k in keys):
        return "byol" if any(k.startswith("backbone_momentum.") for k in keys) else None
    if _last_is_batchnorm(keys, "projection_head.layers."):
        return "simclr"
    return None


def _solo_method(keys: list[str]) -> str | None:
    """The method of a solo-learn model read off its parts: with a momentum backbone and a
    predictor, BYOL (biased Linear layers) or MoCo v3 (none); without either, SimCLR when the
    projector has no BatchNorm (solo-learn's other methods have one: name them)."""
    momentum = any(k.startswith("momentum_backbone.") for k in keys)
    predictor = any(k.startswith("predictor.") for k in keys)
    if momentum and predictor:
        return "byol" if "projector.0.bias" in keys else "mocov3"
    if not momentum and not predictor and not any(
            k.startswith("projector.") and k.endswith(".running_mean") for k in keys):
        return "simclr"
    return None


def _lightly_rules(keys: list[str]) -> list[tuple[str, str]]:
    """lightly's rules, with the ``nn.Sequential`` of a ResNet's children (``backbone.0.*`` =
    ``conv1``, ``backbone.4.*`` = ``layer1``, ...) renamed to torchvision's names."""
    rules = KEY_RULES["lightly"]
    if "backbone.0.weight" in keys and "backbone.4.0.conv1.weight" in keys:
        renamed = [(f"{src}{i}.", f"{dst}{name}.") for src, dst in
                   (("backbone_momentum.", "teacher.backbone."), ("backbone.", "backbone."))
                   for i, name in _RESNET_CHILDREN.items()]
        rules = renamed + rules
    return rules


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


def linears(state: dict[str, torch.Tensor], part: str) -> list[tuple[int, torch.Tensor]]:
    """``(index, weight)`` of the Linear layers of the ``nn.Sequential`` ``part``."""
    pat = re.compile(re.escape(part) + r"\.(\d+)\.weight")
    return sorted((int(m.group(1)), v) for k, v in state.items()
                  if (m := pat.fullmatch(k)) and v.ndim == 2)


def vit_depth(state: dict[str, torch.Tensor]) -> int:
    """The number of ``backbone.blocks.N`` of a ViT state dict."""
    return len({m.group(1) for k in state if (m := re.match(r"backbone\.blocks\.(\d+)\.", k))})


#: The converter's bottleneck layers (``net.K``) and torchvision's names for them.
_BOTTLENECK = {"0": "conv1", "1": "bn1", "2": "conv2", "3": "bn2", "4": "conv3", "5": "bn3"}
_RULES = [
    (re.compile(r"net\.0\.0\.weight$"), lambda m: "conv1.weight"),
    (re.compile(r"net\.0\.1\.0\.(\w+)$"), lambda m: f"bn1.{m[1]}"),
    (re.compile(r"net\.([1-4])\.blocks\.(\d+)\.net\.([024])\.weight$"),
     lambda m: f"layer{m[1]}.{m[2]}.{_BOTTLENECK[m[3]]}.weight"),
    (re.compile(r"net\.([1-4])\.blocks\.(\d+)\.net\.([135])\.0\.(\w+)$"),
     lambda m: f"layer{m[1]}.{m[2]}.{_BOTTLENECK[m[3]]}.{m[4]}"),
    (re.compile(r"net\.([1-4])\.blocks\.(\d+)\.projection\.shortcut\.weight$"),
     lambda m: f"layer{m[1]}.{m[2]}.downsample.0.weight"),
    (re.compile(r"net\.([1-4])\.blocks\.(\d+)\.projection\.bn\.0\.(\w+)$"),
     lambda m: f"layer{m[1]}.{m[2]}.downsample.1.{m[3]}"),
    (re.compile(r"fc\.(weight|bias)$"), lambda m: f"fc.{m[1]}"),
]


def is_simclr_v2(obj: Any) -> bool:
    """Whether ``obj`` is a file of Separius/SimCLRv2-Pytorch (``{"resnet", "head"}``)."""
    return (isinstance(obj, dict) and set(obj) == {"resnet", "head"}
            and isinstance(obj["resnet"], dict)
            and any(isinstance(k, str) and k.startswith("net.0.") for k in obj["resnet"]))


def simclr_v2_backbone(obj: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The ResNet of a SimCLR v2 file under torchvision's names (``fc`` kept, for the caller
    to drop); a selective-kernel model or an unknown key is a ``ValueError`` naming it."""
    out: dict[str, torch.Tensor] = {}
    for key, value in obj["resnet"].items():
        if ".mixing_conv." in key or ".main_conv." in key:
            raise ValueError("this SimCLR v2 file holds a ResNet with selective kernels (sk1), "
                             "which no e2mc backbone has; the sk0 models convert")
        for pattern, name in _RULES:
            if (m := pattern.match(key)) is not None:
                out[name(m)] = value
                break
        else:
            raise ValueError(f"SimCLR v2 file: no torchvision ResNet name for {key!r} (a "
                             "width other than 1x, or another converter's file)")
    return out
