"""Building a backbone by name (:func:`build_backbone`): a library's classification network
without its classifier (whose keys :func:`classifier_keys` gives) or the package's own small
models for 28-32 px images on a CPU."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from e2mc.models.names import missing_extra, parse_backbone_name, timm_parts, unknown_error
from e2mc.models.pretrained import (
    fetch_failed,
    hf_cache,
    pretrained_skipped,
    timm_cache,
    torchvision_weights,
)

#: :class:`SmallConvNet` widths.
SMALL_CNNS: dict[str, tuple[int, ...]] = {
    "cnn5": (32, 64, 128, 128, 256),
    "cnn5_small": (16, 32, 64, 64, 128),
}
#: Small ViTs for 28 px images on a CPU: image and patch size, layers, heads, width, MLP width.
SMALL_VITS: dict[str, tuple[int, int, int, int, int, int]] = {
    "vit_tiny_p4_28": (28, 4, 4, 3, 96, 384),
}

class SmallConvNet(nn.Sequential):
    """Five 3x3 conv-BN-ReLU layers with strides (1, 2, 1, 2, 1), then global average pooling
    (10 or 40 million multiply-adds per 28 px image)."""

    def __init__(self, widths: tuple[int, ...], in_channels: int = 1) -> None:
        layers: list[nn.Module] = []
        channels = in_channels
        for i, width in enumerate(widths):
            layers += [nn.Conv2d(channels, width, 3, stride=2 if i % 2 else 1, padding=1,
                                 bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True)]
            channels = width
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        super().__init__(*layers)


def small_vit(name: str, in_channels: int) -> tuple[nn.Module, int]:
    """:data:`SMALL_VITS` ``name``: torchvision's ``VisionTransformer`` without its head."""
    from torchvision.models.vision_transformer import VisionTransformer

    size, patch, layers, heads, width, mlp = SMALL_VITS[name]
    model = VisionTransformer(image_size=size, patch_size=patch, num_layers=layers,
                              num_heads=heads, hidden_dim=width, mlp_dim=mlp)
    model.heads = nn.Identity()
    if in_channels != 3:
        model.conv_proj = nn.Conv2d(in_channels, width, kernel_size=patch, stride=patch)
    return model, width


def strip_classifier(model: nn.Module) -> int:
    """Replace the classifier (``fc``, ``classifier``, ``heads``, ``head``) by what precedes its
    first Linear (ConvNeXt's norm) or the identity; return the pooled feature size."""
    attr = next((a for a in ("fc", "classifier", "heads", "head") if hasattr(model, a)), None)
    if attr is None:
        raise ValueError(f"cannot find the classifier of {type(model).__name__}")
    head = getattr(model, attr)
    if isinstance(head, nn.Linear):
        dim = head.in_features
        new_head: nn.Module = nn.Identity()
    else:
        layers = list(head.children())
        first_linear = next((i for i, m in enumerate(layers) if isinstance(m, nn.Linear)), None)
        if first_linear is None:
            raise ValueError(f"the classifier of {type(model).__name__} has no Linear layer")
        dim = layers[first_linear].in_features
        kept = [m for m in layers[:first_linear] if not isinstance(m, nn.Dropout)]
        new_head = nn.Sequential(*kept) if kept else nn.Identity()
    setattr(model, attr, new_head)
    return dim


def input_channels(module: nn.Module) -> int:
    """Input channels of the first convolution of ``module`` (3 if it has none)."""
    conv = next((m for m in module.modules() if isinstance(m, nn.Conv2d)), None)
    return conv.in_channels if conv is not None else 3


def replace_first_conv(model: nn.Module, in_channels: int) -> None:
    for parent in model.modules():
        for child_name, child in parent.named_children():
            if isinstance(child, nn.Conv2d):
                setattr(parent, child_name, nn.Conv2d(
                    in_channels, child.out_channels, child.kernel_size, child.stride,
                    child.padding, dilation=child.dilation, groups=1,
                    bias=child.bias is not None))
                return
            if len(list(child.children())) > 0:
                break
    raise ValueError("could not find the first convolution to change the input channels")


#: ResNets end in ``fc`` after global average pooling, the others in a ``classifier``.
RESNETS = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "wide_resnet50_2",
           "resnext50_32x4d")
OTHERS = ("convnext_tiny", "efficientnet_b0", "mobilenet_v3_small", "mobilenet_v3_large",
          "regnet_y_400mf", "densenet121")
SUPPORTED_BACKBONES = RESNETS + OTHERS + tuple(SMALL_CNNS) + tuple(SMALL_VITS)


def build_backbone(
    name: str, small_images: bool = False, in_channels: int = 3
) -> tuple[nn.Module, int]:
    """``(backbone, feature_dim)``: the model ``name`` without its classifier, with the
    library's parameter names. ``small_images`` (ResNets): a 3x3 stride-1 stem, no max-pool;
    ``in_channels``: the first convolution's. An unknown name is a ``ValueError`` listing the
    close matches."""
    if in_channels < 1:
        raise ValueError(f"in_channels must be >= 1, got {in_channels}")
    source, model_name, weights = parse_backbone_name(name)
    if small_images and not (source == "torchvision" and (
            model_name in RESNETS or (model_name in SMALL_CNNS and weights is None))):
        raise ValueError(f"small_images=True is only supported for ResNets, not {name!r}")
    if source == "timm":
        return _timm_backbone(model_name, in_channels)
    if source == "hf":
        return _hf_backbone(model_name, in_channels)
    if model_name in SMALL_CNNS and weights is None:
        return SmallConvNet(SMALL_CNNS[model_name], in_channels), SMALL_CNNS[model_name][-1]
    if model_name in SMALL_VITS and weights is None:
        return small_vit(model_name, in_channels)
    return _torchvision_backbone(model_name, weights, small_images, in_channels)


@functools.lru_cache(maxsize=1)
def torchvision_names() -> tuple[str, ...]:
    """Names of torchvision's image classification models (``torchvision.models``)."""
    import torchvision.models as tvm

    return tuple(tvm.list_models(module=tvm))


def _torchvision_backbone(name: str, weights: str | None, small_images: bool,
                          in_channels: int) -> tuple[nn.Module, int]:
    import torchvision.models as tvm

    known = [*torchvision_names(), *SMALL_CNNS, *SMALL_VITS]
    if name not in known:
        raise unknown_error("backbone", name, known,
                            f"; supported: {', '.join(SUPPORTED_BACKBONES)}, "
                            "any torchvision classification model, timm:NAME or hf:REPO_ID")
    weight_enum = None
    if weights is not None:
        weight_enum = torchvision_weights(name, weights, tvm)
        if in_channels != 3 or small_images:
            raise ValueError(f"the {name} {weights} weights expect 3-channel images and the "
                             "standard stem: drop small_images / in_channels, or the weights")
    model = tvm.get_model(name, weights=None)
    if weight_enum is not None and not pretrained_skipped():
        # torch.hub's download and cache, with the hash check of the file name's hash prefix
        try:
            state = weight_enum.get_state_dict(progress=True, check_hash=True)
        except OSError as err:  # URLError (offline), HTTP errors, disk errors
            raise fetch_failed(f"torchvision:{name}:{weights}", err) from None
        model.load_state_dict(state)
    if name in RESNETS:
        feature_dim = model.fc.in_features
        model.fc = nn.Identity()
        if small_images or in_channels != 3:
            kernel, stride, padding = (3, 1, 1) if small_images else (7, 2, 3)
            model.conv1 = nn.Conv2d(in_channels, model.conv1.out_channels, kernel, stride,
                                    padding, bias=False)
            nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
        if small_images:
            model.maxpool = nn.Identity()
        return model, feature_dim
    feature_dim = strip_classifier(model)
    if in_channels != 3:
        replace_first_conv(model, in_channels)
    return model, feature_dim


def _timm_backbone(name: str, in_channels: int) -> tuple[nn.Module, int]:
    try:
        import timm
    except ImportError:
        raise missing_extra("timm", "timm", f"timm:{name}") from None
    architecture, tag, arguments = timm_parts(name)
    if not timm.is_model(architecture):  # (with a tag: the close ARCH.TAG names)
        raise unknown_error("timm model", name,
                            list(timm.list_pretrained() if tag else timm.list_models()))
    pretrained = tag is not None and not pretrained_skipped()  # ARCH.TAG: that tag's weights
    if pretrained:
        timm_cache(f"timm:{name}")  # an unknown tag: the error lists the known ones
    from e2mc.hub import cache_if_offline

    # any image size for a ViT (position embedding resampled): DINOv2's 518 px models on 224 px
    extra = {"dynamic_img_size": True} if architecture in _timm_vits() else {}
    extra.update(arguments)
    create = f"{architecture}.{tag}" if tag else architecture
    with cache_if_offline() if pretrained else contextlib.nullcontext() as offline:
        try:
            model = timm.create_model(create, pretrained=pretrained, num_classes=0,
                                      in_chans=in_channels, **extra)
        except OSError as err:  # not in the hub's cache (LocalEntryNotFoundError), URLError
            raise fetch_failed(f"timm:{name}", err, offline) from None
        except TypeError as err:  # an argument the model does not take
            raise ValueError(f"timm:{name}: {err}") from None
    return model, int(model.num_features)


@functools.lru_cache(maxsize=1)
def _timm_vits() -> frozenset[str]:
    """timm's ``VisionTransformer`` architectures (``dynamic_img_size`` is theirs)."""
    import timm

    return frozenset(timm.list_models(module="vision_transformer"))


class HFBackbone(nn.Module):
    """A Hugging Face vision model's ``pooler_output``, else its mean ``last_hidden_state``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.model(pixel_values=x)
        pooled = getattr(out, "pooler_output", None)
        if pooled is None:
            hidden = out.last_hidden_state
            pooled = hidden.mean(dim=1) if hidden.ndim == 3 else hidden.mean(dim=(2, 3))
        return pooled.flatten(1)


def _hf_backbone(repo: str, in_channels: int) -> tuple[nn.Module, int]:
    try:
        import transformers
    except ImportError:
        raise missing_extra("transformers", "hf", f"hf:{repo}") from None
    from e2mc.hub import cache_if_offline

    local = os.path.isdir(repo)
    with contextlib.nullcontext() if local else cache_if_offline() as offline:
        try:
            config = transformers.AutoConfig.from_pretrained(repo, num_channels=in_channels)
            if pretrained_skipped():
                model = transformers.AutoModel.from_config(config)
            else:
                model = transformers.AutoModel.from_pretrained(repo, config=config)
        except OSError as err:  # not a folder, not on the hub (or offline): the library's say
            unreachable = f"; the hub is unreachable ({offline})" if offline else ""
            raise ValueError(f"cannot load Hugging Face model {repo!r} (cache {hf_cache()})"
                             f"{unreachable}: {' '.join(str(err).split())}") from None
    dim = getattr(config, "hidden_size", None)
    if dim is None and getattr(config, "hidden_sizes", None):
        dim = config.hidden_sizes[-1]
    if dim is None:
        raise ValueError(f"hf:{repo}: cannot tell the feature size from its configuration")
    return HFBackbone(model), int(dim)


@functools.lru_cache(maxsize=32)
def classifier_keys(name: str) -> frozenset[str]:
    """The state-dict keys of the classifier :func:`build_backbone` drops from the model
    ``name`` (empty for the package's own backbones and Hugging Face models)."""
    source, model_name, _ = parse_backbone_name(name)
    if source == "hf" or model_name in SMALL_CNNS or model_name in SMALL_VITS:
        return frozenset()
    return build_on_meta(lambda: _built_classifier_keys(source, model_name))


def build_on_meta(build: Callable[[], Any]) -> Any:
    """``build()`` on the meta device (no memory, no initialisation); on the CPU for a
    constructor that computes on tensors (torchvision's RegNets read their widths off one)."""
    try:
        with torch.device("meta"):
            return build()
    except NotImplementedError:  # "Cannot copy out of meta tensor": built for real
        return build()


def _built_classifier_keys(source: str, model_name: str) -> frozenset[str]:
    if source == "timm":
        try:
            import timm
        except ImportError:
            return frozenset()
        architecture, _, arguments = timm_parts(model_name)
        if not timm.is_model(architecture):
            raise unknown_error("timm model", model_name, list(timm.list_models()))
        full = set(timm.create_model(architecture, pretrained=False, **arguments).state_dict())
        kept = set(timm.create_model(architecture, pretrained=False, num_classes=0,
                                     **arguments).state_dict())
    else:
        import torchvision.models as tvm

        if model_name not in torchvision_names():
            return frozenset()
        full = set(tvm.get_model(model_name, weights=None).state_dict())
        kept = set(_torchvision_backbone(model_name, None, False, 3)[0].state_dict())
    return frozenset(full - kept)
