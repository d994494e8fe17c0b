"""Pretrained weights of a backbone name: which, where the library looks for them, the error
when they cannot be had, and :func:`weights_from_checkpoint`."""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator
from typing import Any

from e2mc.models.names import missing_extra, parse_backbone_name, timm_parts, unknown_error

_SKIP_PRETRAINED: contextvars.ContextVar[bool] = contextvars.ContextVar("e2mc_skip_pretrained",
                                                                        default=False)


@contextlib.contextmanager
def weights_from_checkpoint() -> Iterator[None]:
    """Inside this block backbones are built without pretrained weights (a checkpoint is about
    to set them all)."""
    token = _SKIP_PRETRAINED.set(True)
    try:
        yield
    finally:
        _SKIP_PRETRAINED.reset(token)


def pretrained_skipped() -> bool:
    """Whether the backbone being built is inside :func:`weights_from_checkpoint`."""
    return _SKIP_PRETRAINED.get()


def pretrained_weights(name: str) -> dict[str, Any] | None:
    """``{"backbone", "library", "weights", "cache", "file"}`` of the pretrained weights the
    backbone ``name`` loads (None: random), ``cache`` the directory the library looks in for
    ``file``; an unknown weights name is a ``ValueError``. Nothing is downloaded."""
    source, model_name, weights = parse_backbone_name(name)
    if source == "torchvision":
        if weights is None:
            return None
        import torch.hub
        import torchvision.models as tvm

        url = torchvision_weights(model_name, weights, tvm).url
        return {"backbone": name, "library": "torchvision", "weights": weights,
                "cache": os.path.join(torch.hub.get_dir(), "checkpoints"),
                "file": os.path.basename(url)}
    if source == "timm":
        architecture, tag, _ = timm_parts(model_name)
        if tag is None:
            return None
        tagged = f"{architecture}.{tag}"
        return {"backbone": name, "library": "timm", "weights": tagged,
                **timm_cache(f"timm:{tagged}")}
    return {"backbone": name, "library": "transformers", "weights": model_name,
            "cache": hf_cache(), "file": None}


def hf_cache() -> str:
    try:
        from huggingface_hub import constants
    except ImportError:  # (the hf / timm extras bring it)
        return "the Hugging Face hub cache"
    return str(constants.HF_HUB_CACHE)


def timm_cache(name: str) -> dict[str, Any]:
    """``{"cache", "file"}`` where ``timm.create_model(name, pretrained=True)`` looks."""
    import torch.hub

    try:
        import timm
    except ImportError:
        raise missing_extra("timm", "timm", name) from None
    architecture, tag, _ = timm_parts(name.partition(":")[2])
    tagged = f"{architecture}.{tag}" if tag else architecture
    try:
        cfg = timm.models.get_pretrained_cfg(tagged)
    except RuntimeError:  # timm's "Invalid pretrained tag"
        cfg = None
    if cfg is None:
        same_arch = timm.list_pretrained(f"{architecture}.*")
        raise unknown_error("timm pretrained tag", tagged,
                            list(same_arch or timm.list_pretrained()),
                            "; timm:ARCH without a tag is randomly initialised")
    if cfg.hf_hub_id:
        return {"cache": hf_cache(), "file": cfg.hf_hub_id}
    url = cfg.url or ""
    return {"cache": os.path.join(torch.hub.get_dir(), "checkpoints"),
            "file": os.path.basename(url) or None}


def fetch_failed(name: str, err: BaseException, offline: str | None = None) -> ValueError:
    """The error of pretrained weights that could not be loaded; ``offline``: why the hub was
    not asked."""
    where = pretrained_weights(name) or {}
    wanted = f"{where.get('file')} " if where.get("file") else ""
    reason = " ".join(str(getattr(err, "reason", None) or err).split())
    why = (f"the hub is unreachable ({offline})" if offline is not None
           else f"fetching it failed ({type(err).__name__}: {reason})")
    return ValueError(f"cannot load the pretrained weights of {name}: {wanted}is not in the "
                      f"cache {where.get('cache')} and {why}; download it where there is a "
                      "network (the same cache directory: TORCH_HOME / HF_HOME), or start from "
                      "a checkpoint with --from")


def torchvision_weights(name: str, weights: str, tvm: Any) -> Any:
    """The torchvision weights enum member ``weights`` of the model ``name``."""
    enum = tvm.get_model_weights(name)
    if weights not in enum.__members__:
        raise unknown_error(f"{name} weights", weights, list(enum.__members__),
                            f"; available: {', '.join(enum.__members__)}")
    return enum[weights]
