"""What image sizes a backbone takes, checked before any work starts: a size a vision
transformer fixes, a patch size that must divide it, else a forward pass on the meta device."""

from __future__ import annotations

import torch
from torch import nn

from e2mc.models.build import build_backbone
from e2mc.models.names import parse_backbone_name
from e2mc.models.pretrained import weights_from_checkpoint


def fixed_image_size(module: nn.Module) -> int | None:
    """The one image size ``module`` takes, where it declares one (a torchvision
    ``VisionTransformer``, a timm patch embedding with a strict square size), else ``None``."""
    m = _size_layer(module)
    if m is None or hasattr(m, "image_size"):
        return None if m is None else int(m.image_size)
    size = getattr(m, "img_size", None)
    if getattr(m, "strict_img_size", False) and size is not None and size[0] == size[1]:
        return int(size[0])
    return None


def _size_layer(module: nn.Module) -> nn.Module | None:
    """The first torchvision ``VisionTransformer`` or timm ``PatchEmbed`` in ``module``."""
    from torchvision.models.vision_transformer import VisionTransformer

    return next((m for m in module.modules() if isinstance(m, VisionTransformer) or (
        type(m).__name__ == "PatchEmbed" and hasattr(m, "patch_size")
        and hasattr(m, "strict_img_size"))), None)


def _declared_size_problem(module: nn.Module, size: int) -> str | None:
    """What ``module``'s layers declare against the image size (a ViT's fixed size, a patch
    size that must divide it), without running anything; None when nothing is declared."""
    m = _size_layer(module)
    if m is None:
        return None
    if hasattr(m, "image_size"):  # torchvision's ViT: position embeddings of one size
        if int(m.image_size) != size:
            return (f"it takes {m.image_size} px images only (a vision transformer with "
                    f"{m.patch_size} px patches and position embeddings of that size)")
        return None
    fixed = getattr(m, "img_size", None)
    if getattr(m, "strict_img_size", False) and fixed is not None and tuple(fixed) != (size, size):
        return f"it takes {fixed[0]}x{fixed[1]} px images only"
    patch = tuple(int(p) for p in m.patch_size)
    if not getattr(m, "dynamic_img_pad", False) and any(size % p for p in patch):
        shown = patch[0] if patch[0] == patch[1] else f"{patch[0]}x{patch[1]}"
        step = max(patch)  # the nearest multiple, at least one patch
        return (f"its patch size {shown} does not divide the image size {size} (a "
                f"multiple of {shown} does, e.g. {max(step, round(size / step) * step)})")
    return None


def _meta_forward_error(module: nn.Module, size: int, channels: int,
                        seen: list[tuple[int, ...]] | None = None) -> BaseException | None:
    """The error of ``module``'s forward pass on ``[2, channels, size, size]`` images on the
    meta device (its own tensors left alone), or None; ``seen`` gets each Conv2d's output shape."""
    from torch.func import functional_call

    tensors = {n: torch.empty_like(t, device="meta")
               for n, t in [*module.named_parameters(remove_duplicate=False),
                            *module.named_buffers(remove_duplicate=False)]}
    hooks = [] if seen is None else [m.register_forward_hook(
        lambda _m, _i, out: seen.append(tuple(out.shape))) for m in module.modules()
        if isinstance(m, nn.Conv2d)]
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            functional_call(module, tensors,
                            (torch.empty(2, channels, size, size, device="meta"),))
    except Exception as err:  # (what a forward pass at this size raises: the answer)
        return err
    finally:
        module.train(was_training)
        for hook in hooks:
            hook.remove()
    return None


def last_feature_map(module: nn.Module, image_size: int, channels: int) -> tuple[int, int] | None:
    """Height and width of the last convolution's output of ``module`` on images of
    ``image_size`` (a CNN's last stage, which its pooling averages; a ViT's patch grid), from
    a pass on the meta device; None for a model without a convolution or a pass that fails."""
    seen: list[tuple[int, ...]] = []
    if _meta_forward_error(module, image_size, channels, seen) is not None:
        return None
    maps = [shape for shape in seen if len(shape) == 4]
    return (maps[-1][2], maps[-1][3]) if maps else None


_USUAL_SIZE = 224  # what every backbone that declares no size is expected to take


def input_size_problem(module: nn.Module, image_size: int, channels: int) -> str | None:
    """Why ``module`` cannot take ``[N, channels, image_size, image_size]`` images, or None.
    The layers' declared sizes first, then a meta-device forward pass, whose failure counts
    only where the usual 224 px pass succeeds (an operation the meta device lacks is not a
    wrong size)."""
    declared = _declared_size_problem(module, image_size)
    if declared is not None or fixed_image_size(module) is not None:
        return declared
    err = _meta_forward_error(module, image_size, channels)
    if err is None or isinstance(err, NotImplementedError):
        return None
    if image_size != _USUAL_SIZE and _meta_forward_error(module, _USUAL_SIZE, channels) is not None:
        return None
    reason = " ".join(str(err).split()) or type(err).__name__
    return f"its forward pass fails at this size ({type(err).__name__}: {reason[:200]})"


def check_input_size(module: nn.Module, image_size: int, channels: int, name: str,
                     option: str = "--image-size") -> None:
    """Raise ``ValueError`` (one line naming the backbone ``name`` and ``image_size``) when
    ``module`` cannot take images of that size (:func:`input_size_problem`); ``option`` is how
    the user sets the size."""
    problem = input_size_problem(module, image_size, channels)
    if problem is not None:
        raise ValueError(f"image size {image_size} px does not fit the backbone {name}: "
                         f"{problem}; set another size with {option}")


def one_pixel_note(module: nn.Module, image_size: int, channels: int, name: str) -> str | None:
    """A note when the last feature map of ``module`` on ``image_size`` px images is a single
    pixel: its last stages see no spatial structure (a ResNet's 32x reduction on 28 px)."""
    hw = last_feature_map(module, image_size, channels)
    if hw is None or hw[0] * hw[1] != 1 or image_size <= 1:
        return None
    return (f"note: at {image_size} px the last feature map of {name} is 1 x 1 pixel: its "
            "last stages see no spatial structure; it was made for larger images "
            "(data.image_size, with data of that size)")


def check_backbone_input(name: str, image_size: int | None, in_channels: int | None = 3,
                         small_images: bool = False, option: str = "data.image_size") -> None:
    """:func:`check_input_size` of the backbone ``name`` built on the meta device without
    weights, before any work starts. A name that cannot be built so (Hugging Face, a missing
    extra) and a size or channels left to the data (None) are left to the run."""
    if parse_backbone_name(name)[0] == "hf" or image_size is None or in_channels is None:
        return
    try:
        with weights_from_checkpoint(), torch.device("meta"):
            module, _ = build_backbone(name, small_images, in_channels)
    except Exception:  # (the run builds it again and says what is wrong)
        return
    check_input_size(module, image_size, in_channels, name, option)


def pooled_dim(module: nn.Module, channels: int, size: int) -> int:
    """The pooled output size of ``module`` on ``[2, channels, size, size]`` zeros (eval mode,
    no gradients); an output that is not ``[2, D]`` is a ``ValueError``."""
    was_training = module.training
    try:
        module.eval()
        with torch.no_grad():
            param = next(iter(module.parameters()), None)
            out = module(torch.zeros(2, channels, size, size,
                                     device=param.device if param is not None else "cpu"))
    finally:
        module.train(was_training)
    if not isinstance(out, torch.Tensor) or out.ndim != 2 or out.shape[0] != 2:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"the module maps [2, {channels}, {size}, {size}] images to {shape}, "
                         "not [2, feature_dim] pooled features: pool and flatten them, or pass "
                         "feature_dim")
    return int(out.shape[1])
