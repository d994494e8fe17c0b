"""A classification network made a backbone: its classifier dropped, its input channels set."""

from __future__ import annotations

from torch import nn


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
