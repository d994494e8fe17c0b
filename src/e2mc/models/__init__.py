"""Backbones by name: torchvision, timm and Hugging Face models as pooled-feature extractors.

Names (``model.backbone`` in a config, ``--backbone`` on the command line):

* ``resnet50`` or ``torchvision:resnet50``: a torchvision classification model, randomly
  initialised; ``torchvision:resnet50:IMAGENET1K_V2`` loads that torchvision weights enum
  (downloaded once into torch.hub's cache, hash-checked);
* ``timm:resnet50``: a timm model (the ``[timm]`` extra), randomly initialised;
  ``timm:resnet50.a1_in1k`` (a pretrained tag after the dot) loads that tag's pretrained weights
  (``timm.create_model(..., pretrained=True)``: the Hugging Face hub's cache, or torch.hub's
  for the tags timm downloads by URL);
* ``hf:<repo id or local folder>``: a Hugging Face vision model (the ``[hf]`` extra) with its
  weights (``from_pretrained``, the Hugging Face hub's cache);
* ``cnn5`` / ``cnn5_small``: the package's small CNNs for 28-32 px images on a CPU;
  ``vit_tiny_p4_28``: its small vision transformer for 28 px images (patch 4, 4 layers, 96 wide).

Every backbone maps ``[B, C, H, W]`` images to ``[B, feature_dim]`` pooled features. Weights
for any of them can also come from a checkpoint (``--from FILE_OR_URL``). When a checkpoint
overwrites every weight anyway, :func:`weights_from_checkpoint` skips fetching pretrained ones.
:func:`pretrained_weights` says which pretrained weights a name loads; weights that are neither
in the cache nor downloadable (offline) are a ``ValueError`` naming the cache directory and the
file or tag it looked for.
"""

from __future__ import annotations

import contextlib
import contextvars
import difflib
import functools
import os
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from e2mc.models.small import SMALL_CNNS, SMALL_VITS, SmallConvNet, small_vit
from e2mc.models.surgery import input_channels as input_channels  # (re-exported)
from e2mc.models.surgery import replace_first_conv, strip_classifier

#: Backbones whose pooled feature is unambiguous: classifier attribute and how to reach it.
#: ResNets end in ``fc`` after global average pooling; the others below end in ``classifier``
#: (a Sequential whose Linear layers are dropped) after their own pooling.
RESNETS = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "wide_resnet50_2",
           "resnext50_32x4d")
OTHERS = ("convnext_tiny", "efficientnet_b0", "mobilenet_v3_small", "mobilenet_v3_large",
          "regnet_y_400mf", "densenet121")
SUPPORTED_BACKBONES = RESNETS + OTHERS + tuple(SMALL_CNNS) + tuple(SMALL_VITS)
#: Prefixes of backbone names and the optional extra each needs.
SOURCES = {"torchvision": None, "timm": "timm", "hf": "hf"}

_SKIP_PRETRAINED: contextvars.ContextVar[bool] = contextvars.ContextVar("e2mc_skip_pretrained",
                                                                        default=False)


@contextlib.contextmanager
def weights_from_checkpoint() -> Iterator[None]:
    """Inside this block, named backbones are built without fetching pretrained weights (a
    checkpoint is about to overwrite all of them); a Hugging Face model is built from its
    configuration alone."""
    token = _SKIP_PRETRAINED.set(True)
    try:
        yield
    finally:
        _SKIP_PRETRAINED.reset(token)


def parse_backbone_name(name: str) -> tuple[str, str, str | None]:
    """``(source, model, weights)`` of a backbone name: ``"resnet50"`` and
    ``"torchvision:resnet50"`` -> ``("torchvision", "resnet50", None)``,
    ``"torchvision:resnet50:IMAGENET1K_V2"`` -> ``(..., "IMAGENET1K_V2")``, ``"timm:NAME"``,
    ``"hf:REPO_ID"`` (a repository id or a local folder, kept whole)."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"a backbone name must be a non-empty string, got {name!r}")
    source, sep, rest = name.partition(":")
    if not sep:
        return "torchvision", name, None
    if source not in SOURCES:
        close = difflib.get_close_matches(source, list(SOURCES), n=1)
        hint = f" (did you mean {close[0]}:{rest}?)" if close else ""
        raise ValueError(f"unknown backbone source {source!r} in {name!r}{hint}; names look like "
                         "resnet50, torchvision:resnet50[:WEIGHTS], timm:NAME or hf:REPO_ID")
    if not rest:
        raise ValueError(f"backbone name {name!r} names no model after {source}:")
    if source == "torchvision":
        model, _, weights = rest.partition(":")
        return source, model, weights or None
    return source, rest, None


def pretrained_weights(name: str) -> dict[str, Any] | None:
    """The pretrained weights the backbone ``name`` loads when it is built, None for a random
    initialisation: ``{"backbone", "library", "weights", "cache", "file"}``, where ``weights``
    is the torchvision weights enum, the timm tag (``ARCH.TAG``) or the Hugging Face repository,
    ``cache`` the directory the library's loader looks in and ``file`` what it looks for there
    (the torchvision file name, the timm hub id or file name; None where the library decides).
    An unknown weights name is a ``ValueError``. Nothing is downloaded."""
    source, model_name, weights = parse_backbone_name(name)
    if source == "torchvision":
        if weights is None:
            return None
        import torch.hub
        import torchvision.models as tvm

        url = _torchvision_weights(model_name, weights, tvm).url
        return {"backbone": name, "library": "torchvision", "weights": weights,
                "cache": os.path.join(torch.hub.get_dir(), "checkpoints"),
                "file": os.path.basename(url)}
    if source == "timm":
        if "." not in model_name:
            return None
        return {"backbone": name, "library": "timm", "weights": model_name, **_timm_cache(name)}
    return {"backbone": name, "library": "transformers", "weights": model_name,
            "cache": _hf_cache(), "file": None}


def _hf_cache() -> str:
    try:
        from huggingface_hub import constants
    except ImportError:  # (the hf / timm extras bring it)
        return "the Hugging Face hub cache"
    return str(constants.HF_HUB_CACHE)


def _timm_cache(name: str) -> dict[str, Any]:
    """Where ``timm.create_model(name, pretrained=True)`` looks: the Hugging Face hub's cache
    for a tag published there, else torch.hub's ``checkpoints`` (a tag downloaded by URL)."""
    import torch.hub

    try:
        import timm
    except ImportError:
        raise _missing_extra("timm", "timm", name) from None
    tagged = name.partition(":")[2]
    try:
        cfg = timm.models.get_pretrained_cfg(tagged)
    except RuntimeError:  # timm's "Invalid pretrained tag"
        cfg = None
    if cfg is None:
        same_arch = timm.list_pretrained(f"{tagged.split('.', 1)[0]}.*")
        raise _unknown("timm pretrained tag", tagged, list(same_arch or timm.list_pretrained()),
                       "; timm:ARCH without a tag is randomly initialised")
    if cfg.hf_hub_id:
        return {"cache": _hf_cache(), "file": cfg.hf_hub_id}
    url = cfg.url or ""
    return {"cache": os.path.join(torch.hub.get_dir(), "checkpoints"),
            "file": os.path.basename(url) or None}


def _fetch_failed(name: str, err: BaseException, offline: str | None = None) -> ValueError:
    """The one-line error of pretrained weights that could not be loaded (offline, a missing
    file in the cache, a download that failed); ``offline``: why the hub was not asked."""
    where = pretrained_weights(name) or {}
    wanted = f"{where.get('file')} " if where.get("file") else ""
    reason = " ".join(str(getattr(err, "reason", None) or err).split())
    if offline is not None:
        return ValueError(f"cannot load the pretrained weights of {name}: {wanted}is not in the "
                          f"cache {where.get('cache')} and the hub is unreachable ({offline}); "
                          "download it where there is a network (the same cache directory: "
                          "TORCH_HOME / HF_HOME), or start from a checkpoint with --from")
    return ValueError(f"cannot load the pretrained weights of {name}: {wanted}is not in the "
                      f"cache {where.get('cache')} and fetching it failed ({type(err).__name__}: "
                      f"{reason}); download it where there is a network (the same cache "
                      "directory: TORCH_HOME / HF_HOME), or start from a checkpoint with --from")


def build_backbone(
    name: str, small_images: bool = False, in_channels: int = 3
) -> tuple[nn.Module, int]:
    """Return ``(backbone, feature_dim)``: the model ``name`` (see the module docstring) without
    its classifier, mapping ``[B, C, H, W]`` images to ``[B, feature_dim]`` pooled features.

    ``small_images=True`` (ResNets only) replaces the stem with a 3x3 stride-1 convolution and no
    max-pool, for 28-32 px images. ``in_channels`` changes the first convolution (1 = grayscale).
    The parameter names are the library's own (torchvision's for official checkpoints, which
    load strictly). The ``cnn5`` family (:class:`SmallConvNet`) is built for small images already.
    An unknown name is a ``ValueError`` listing the close matches.
    """
    if in_channels < 1:
        raise ValueError(f"in_channels must be >= 1, got {in_channels}")
    source, model_name, weights = parse_backbone_name(name)
    if source == "timm":
        return _timm_backbone(model_name, small_images, in_channels)
    if source == "hf":
        return _hf_backbone(model_name, small_images, in_channels)
    if model_name in SMALL_CNNS and weights is None:
        return SmallConvNet(SMALL_CNNS[model_name], in_channels), SMALL_CNNS[model_name][-1]
    if model_name in SMALL_VITS and weights is None:
        return small_vit(model_name, small_images, in_channels)
    return _torchvision_backbone(model_name, weights, small_images, in_channels)


def _unknown(kind: str, name: str, known: list[str], extra: str = "") -> ValueError:
    close = difflib.get_close_matches(name, known, n=5, cutoff=0.6)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    return ValueError(f"unknown {kind} {name!r}{hint}{extra}")


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
        raise _unknown("backbone", name, known, f"; supported: {', '.join(SUPPORTED_BACKBONES)}, "
                       "any torchvision classification model, timm:NAME or hf:REPO_ID")
    if small_images and name not in RESNETS:
        raise ValueError(f"small_images=True is only supported for ResNets, not {name!r}")
    weight_enum = None
    if weights is not None:
        weight_enum = _torchvision_weights(name, weights, tvm)
        if in_channels != 3 or small_images:
            raise ValueError(f"the {name} {weights} weights expect 3-channel images and the "
                             "standard stem: drop small_images / in_channels, or the weights")
    model = tvm.get_model(name, weights=None)
    if weight_enum is not None and not _SKIP_PRETRAINED.get():
        # torch.hub's download and cache, with the hash check of the file name's hash prefix
        try:
            state = weight_enum.get_state_dict(progress=True, check_hash=True)
        except OSError as err:  # URLError (offline), HTTP errors, disk errors
            raise _fetch_failed(f"torchvision:{name}:{weights}", err) from None
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


def _torchvision_weights(name: str, weights: str, tvm: Any) -> Any:
    """The torchvision weights enum member ``weights`` of the model ``name``."""
    enum = tvm.get_model_weights(name)
    if weights not in enum.__members__:
        raise _unknown(f"{name} weights", weights, list(enum.__members__),
                       f"; available: {', '.join(enum.__members__)}")
    return enum[weights]


def _missing_extra(package: str, extra: str, name: str) -> ValueError:
    return ValueError(f"backbone {name!r} needs the {package} package: "
                      f"pip install 'e2mc[{extra}]' (or pip install {package})")


def _timm_backbone(name: str, small_images: bool, in_channels: int) -> tuple[nn.Module, int]:
    try:
        import timm
    except ImportError:
        raise _missing_extra("timm", "timm", f"timm:{name}") from None
    if small_images:
        raise ValueError("small_images=True is only supported for torchvision ResNets, "
                         f"not timm:{name}")
    architecture = name.split(".", 1)[0]
    if not timm.is_model(architecture):  # (with a tag: the close ARCH.TAG names)
        raise _unknown("timm model", name,
                       list(timm.list_pretrained() if "." in name else timm.list_models()))
    pretrained = "." in name and not _SKIP_PRETRAINED.get()  # ARCH.TAG: that tag's weights
    if pretrained:
        _timm_cache(f"timm:{name}")  # an unknown tag: the error lists the known ones
    from e2mc.hub import cache_if_offline

    # any image size for a ViT (position embedding resampled): DINOv2's 518 px models on 224 px
    extra = {"dynamic_img_size": True} if architecture in _timm_vits() else {}
    with cache_if_offline() if pretrained else contextlib.nullcontext() as offline:
        try:
            model = timm.create_model(name, pretrained=pretrained, num_classes=0,
                                      in_chans=in_channels, **extra)
        except OSError as err:  # not in the hub's cache (LocalEntryNotFoundError), URLError
            raise _fetch_failed(f"timm:{name}", err, offline) from None
    return model, int(model.num_features)


@functools.lru_cache(maxsize=1)
def _timm_vits() -> frozenset[str]:
    """timm's ``VisionTransformer`` architectures (``dynamic_img_size`` is theirs)."""
    import timm

    return frozenset(timm.list_models(module="vision_transformer"))


class HFBackbone(nn.Module):
    """A Hugging Face vision model as a pooled-feature extractor: its ``pooler_output`` when it
    has one, else the mean of ``last_hidden_state`` over tokens (or over the spatial grid)."""

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


def _hf_backbone(repo: str, small_images: bool, in_channels: int) -> tuple[nn.Module, int]:
    try:
        import transformers
    except ImportError:
        raise _missing_extra("transformers", "hf", f"hf:{repo}") from None
    if small_images:
        raise ValueError(f"small_images=True is only supported for torchvision ResNets, "
                         f"not hf:{repo}")
    from e2mc.hub import cache_if_offline

    local = os.path.isdir(repo)
    with contextlib.nullcontext() if local else cache_if_offline() as offline:
        try:
            config = transformers.AutoConfig.from_pretrained(repo, num_channels=in_channels)
            if _SKIP_PRETRAINED.get():
                model = transformers.AutoModel.from_config(config)
            else:
                model = transformers.AutoModel.from_pretrained(repo, config=config)
        except OSError as err:  # not a folder, not on the hub (or offline): the library's say
            unreachable = f"; the hub is unreachable ({offline})" if offline else ""
            raise ValueError(f"cannot load Hugging Face model {repo!r} (cache {_hf_cache()})"
                             f"{unreachable}: {' '.join(str(err).split())}") from None
    dim = getattr(config, "hidden_size", None)
    if dim is None and getattr(config, "hidden_sizes", None):
        dim = config.hidden_sizes[-1]
    if dim is None:
        raise ValueError(f"hf:{repo}: cannot tell the feature size from its configuration")
    return HFBackbone(model), int(dim)


def classifier_keys(name: str) -> frozenset[str]:
    """State-dict keys of the full classification model ``name`` that :func:`build_backbone`
    drops (its classifier): a checkpoint of the full model loads into the backbone without them.
    Empty for the package's own backbones and for Hugging Face models."""
    source, model_name, _ = parse_backbone_name(name)
    if source == "hf" or model_name in SMALL_CNNS or model_name in SMALL_VITS:
        return frozenset()
    return _classifier_keys(source, model_name)


@functools.lru_cache(maxsize=32)
def _classifier_keys(source: str, model_name: str) -> frozenset[str]:
    try:
        with torch.device("meta"):  # no memory, no initialisation
            return _built_classifier_keys(source, model_name)
    except NotImplementedError:  # a constructor that computes on tensors (RegNets): built
        return _built_classifier_keys(source, model_name)


def _built_classifier_keys(source: str, model_name: str) -> frozenset[str]:
    """:func:`classifier_keys` of the full model built on the current default device."""
    if source == "timm":
        try:
            import timm
        except ImportError:
            return frozenset()
        if not timm.is_model(model_name.split(".", 1)[0]):
            raise _unknown("timm model", model_name, list(timm.list_models()))
        full = set(timm.create_model(model_name, pretrained=False).state_dict())
        kept = set(timm.create_model(model_name, pretrained=False,
                                     num_classes=0).state_dict())
    else:
        import torchvision.models as tvm

        if model_name not in torchvision_names():
            return frozenset()
        full = set(tvm.get_model(model_name, weights=None).state_dict())
        kept = set(_torchvision_backbone(model_name, None, False, 3)[0].state_dict())
    return frozenset(full - kept)


def fixed_image_size(module: nn.Module) -> int | None:
    """The one image size ``module`` takes, where it declares one: a torchvision
    ``VisionTransformer`` (:data:`SMALL_VITS` included; its position embeddings are fixed) or a
    timm patch embedding with a strict size; else ``None`` (any size its layers allow)."""
    from torchvision.models.vision_transformer import VisionTransformer

    for m in module.modules():
        if isinstance(m, VisionTransformer):
            return int(m.image_size)
        if _is_timm_patch_embed(m):
            size = getattr(m, "img_size", None)
            if getattr(m, "strict_img_size", False) and size is not None and size[0] == size[1]:
                return int(size[0])
            return None
    return None


def _is_timm_patch_embed(m: nn.Module) -> bool:
    return type(m).__name__ == "PatchEmbed" and hasattr(m, "patch_size") \
        and hasattr(m, "strict_img_size")


def _declared_size_problem(module: nn.Module, size: int) -> str | None:
    """What the layers ``module`` is made of say about the image size (a ViT's fixed size, a
    patch size that must divide it), without running anything; None when nothing is declared."""
    from torchvision.models.vision_transformer import VisionTransformer

    for m in module.modules():
        if isinstance(m, VisionTransformer):
            if int(m.image_size) != size:
                return (f"it takes {m.image_size} px images only (a vision transformer with "
                        f"{m.patch_size} px patches and position embeddings of that size)")
            return None
        if _is_timm_patch_embed(m):
            fixed = getattr(m, "img_size", None)
            if getattr(m, "strict_img_size", False) and fixed is not None \
                    and tuple(fixed) != (size, size):
                return f"it takes {fixed[0]}x{fixed[1]} px images only"
            patch = tuple(int(p) for p in m.patch_size)
            if not getattr(m, "dynamic_img_pad", False) and any(size % p for p in patch):
                shown = patch[0] if patch[0] == patch[1] else f"{patch[0]}x{patch[1]}"
                return (f"its patch size {shown} does not divide the image size {size} (a "
                        f"multiple of {shown} does, e.g. {_multiple(size, max(patch))})")
            return None
    return None


def _multiple(size: int, step: int) -> int:
    """The multiple of ``step`` nearest to ``size`` (at least ``step``)."""
    return max(step, round(size / step) * step)


def _meta_forward_error(module: nn.Module, size: int, channels: int) -> BaseException | None:
    """The error of ``module``'s forward pass on ``[2, channels, size, size]`` images, run on
    the meta device (shapes only: no memory, no arithmetic; the module's own tensors are left
    alone), or None when it passes."""
    from torch.func import functional_call

    tensors = {n: torch.empty_like(t, device="meta")
               for n, t in [*module.named_parameters(remove_duplicate=False),
                            *module.named_buffers(remove_duplicate=False)]}
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
    return None


#: The image size every backbone whose size is not declared is expected to take.
_USUAL_SIZE = 224


def input_size_problem(module: nn.Module, image_size: int, channels: int) -> str | None:
    """Why ``module`` cannot take ``[N, channels, image_size, image_size]`` images, in words,
    or None when it can (or when that cannot be told without running it). The layers' declared
    sizes first (:func:`fixed_image_size`, a timm patch size that must divide the size), then a
    forward pass on the meta device: a failure there counts only when the usual 224 px pass
    (of the same channels) does not fail too, so that an operation the meta device lacks is
    never taken for a wrong size."""
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


def check_backbone_input(name: str, image_size: int, in_channels: int = 3,
                         small_images: bool = False, option: str = "data.image_size") -> None:
    """:func:`check_input_size` of the backbone ``name``, built on the meta device without
    weights (nothing downloaded, no memory), before any work starts: a configuration whose
    images the model cannot take is refused at once, not after the data are read. A name
    that cannot be built here (a Hugging Face repository, a missing extra, a model whose
    constructor computes on its tensors) is left to the run, which reports it."""
    if parse_backbone_name(name)[0] == "hf":
        return
    try:
        with weights_from_checkpoint(), torch.device("meta"):
            module, _ = build_backbone(name, small_images, in_channels)
    except Exception:  # (the run builds it again and says what is wrong)
        return
    check_input_size(module, image_size, in_channels, name, option)


def describe(name: str) -> dict[str, Any]:
    """``{"source", "model", "weights"}`` of a backbone name (for messages and run records)."""
    source, model, weights = parse_backbone_name(name)
    return {"source": source, "model": model, "weights": weights}
