"""The package's own small backbones for 28-32 px images on a CPU."""

from __future__ import annotations

from torch import nn

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
