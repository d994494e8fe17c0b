"""Backbones: torchvision classification models as pooled-feature extractors."""

from __future__ import annotations

from torch import nn

#: Backbones whose pooled feature is unambiguous: classifier attribute and how to reach it.
#: ResNets end in ``fc`` after global average pooling; the others below end in ``classifier``
#: (a Sequential whose Linear layers are dropped) after their own pooling.
RESNETS = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "wide_resnet50_2",
           "resnext50_32x4d")
OTHERS = ("convnext_tiny", "efficientnet_b0", "mobilenet_v3_small", "mobilenet_v3_large",
          "regnet_y_400mf", "densenet121")
#: Small convolutional networks of this package for 28-32 px images on a CPU (not torchvision):
#: five 3x3 conv-BN-ReLU layers (strides 1, 2, 1, 2, 1) and global average pooling.
SMALL_CNNS: dict[str, tuple[int, ...]] = {
    "cnn5": (32, 64, 128, 128, 256),
    "cnn5_small": (16, 32, 64, 64, 128),
}
SUPPORTED_BACKBONES = RESNETS + OTHERS + tuple(SMALL_CNNS)


class SmallConvNet(nn.Sequential):
    """Five 3x3 conv-BN-ReLU layers with strides (1, 2, 1, 2, 1), then global average pooling.

    About 10 (``cnn5_small``) or 40 (``cnn5``) million multiply-adds per 28 px image: small
    enough to pre-train and continue on Fashion-MNIST with a 2-core CPU.
    """

    def __init__(self, widths: tuple[int, ...], in_channels: int = 1) -> None:
        layers: list[nn.Module] = []
        channels = in_channels
        for i, width in enumerate(widths):
            layers += [nn.Conv2d(channels, width, 3, stride=2 if i % 2 else 1, padding=1,
                                 bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True)]
            channels = width
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        super().__init__(*layers)


def build_backbone(
    name: str, small_images: bool = False, in_channels: int = 3
) -> tuple[nn.Module, int]:
    """Return ``(backbone, feature_dim)``: a randomly initialised torchvision model without its
    classifier, mapping ``[B, C, H, W]`` images to ``[B, feature_dim]`` pooled features.

    ``small_images=True`` (ResNets only) replaces the stem with a 3x3 stride-1 convolution and no
    max-pool, for 28-32 px images. ``in_channels`` changes the first convolution (1 = grayscale).
    The parameter names are torchvision's, so official checkpoints load strictly. The ``cnn5``
    family (:class:`SmallConvNet`, not torchvision) is built for small images already.
    """
    if name in SMALL_CNNS:
        if in_channels < 1:
            raise ValueError(f"in_channels must be >= 1, got {in_channels}")
        return SmallConvNet(SMALL_CNNS[name], in_channels), SMALL_CNNS[name][-1]
    import torchvision.models as tvm

    if name not in SUPPORTED_BACKBONES:
        raise ValueError(
            f"unknown backbone {name!r}; supported: {', '.join(SUPPORTED_BACKBONES)}"
        )
    if small_images and name not in RESNETS:
        raise ValueError(f"small_images=True is only supported for ResNets, not {name!r}")
    if in_channels < 1:
        raise ValueError(f"in_channels must be >= 1, got {in_channels}")
    model = getattr(tvm, name)(weights=None)
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
    feature_dim = _strip_classifier(model)
    if in_channels != 3:
        _replace_first_conv(model, in_channels)
    return model, feature_dim


def _strip_classifier(model: nn.Module) -> int:
    head = model.classifier if hasattr(model, "classifier") else model.fc
    if isinstance(head, nn.Linear):
        dim = head.in_features
        new_head: nn.Module = nn.Identity()
    else:  # Sequential: keep non-Linear layers before the first Linear (e.g. ConvNeXt's norm)
        layers = list(head)
        first_linear = next(i for i, m in enumerate(layers) if isinstance(m, nn.Linear))
        dim = layers[first_linear].in_features
        kept = [m for m in layers[:first_linear] if not isinstance(m, nn.Dropout)]
        new_head = nn.Sequential(*kept) if kept else nn.Identity()
    if hasattr(model, "classifier"):
        model.classifier = new_head
    else:
        model.fc = new_head
    return dim


def _replace_first_conv(model: nn.Module, in_channels: int) -> None:
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
