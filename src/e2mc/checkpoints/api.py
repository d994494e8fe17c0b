"""A method from a checkpoint: the official formats (:func:`load_official`), the project's own
(:func:`load_checkpoint`, :func:`save_checkpoint`), a run's start (:func:`load_start_model`)
and an official optimizer state (:func:`restore_optimizer_state`)."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from e2mc.checkpoints.io import atomic_save
from e2mc.checkpoints.layouts import (
    head_names,
    infer_hparams,
    is_dino_checkpoint,
    load_backbone_alone,
    load_dino,
    load_layout,
)
from e2mc.checkpoints.official import (
    LAYOUT_FORMATS,
    METHOD_FORMATS,
    detect,
    infer_resnet,
)
from e2mc.checkpoints.remote import PathOrState, load_file
from e2mc.checkpoints.strict import load_strict, rebuild
from e2mc.methods.base import SSLMethod
from e2mc.models import classifier_keys

PROJECT_FORMAT = "e2mc"
PROJECT_VERSION = 1
_RESERVED = ("format", "version", "method", "hparams", "model")


def unwrap(method: nn.Module) -> nn.Module:
    """The model inside a ``DistributedDataParallel`` wrapper, else ``method`` itself."""
    return method.module if isinstance(method, nn.parallel.DistributedDataParallel) else method


def load_official(path_or_state_dict: PathOrState, method: str | None = None,
                  trust: bool = False, new_heads: bool = False,
                  **method_hparams: Any) -> tuple[SSLMethod, dict[str, Any]]:
    """``(method, info)`` of an official checkpoint (a file, URL or loaded object; the layout
    detected, or checked against ``method``), loaded strictly. Sizes are read off the shapes;
    ``method_hparams`` override them and must still match. A backbone-only file needs
    ``method`` and ``new_heads=True`` (its heads start random). ``info``: ``format``, ``epoch``,
    ``optimizer`` (for :func:`restore_optimizer_state`), ``hparams``, ``source``, and for a
    backbone-only file ``new_heads`` (the randomly initialised modules)."""
    obj, source, _ = load_file(path_or_state_dict, trust)
    return official_from_object(obj, source, method, new_heads, method_hparams)


def official_from_object(obj: Any, source: str | None, method: str | None, new_heads: bool,
                         method_hparams: dict[str, Any]) -> tuple[SSLMethod, dict[str, Any]]:
    """:func:`load_official` of a loaded object."""
    if isinstance(obj, dict) and obj.get("format") == PROJECT_FORMAT:
        raise ValueError("this is an e2mc checkpoint, not an official one: use load_checkpoint")
    if is_dino_checkpoint(obj):  # student, teacher and DINO's centre
        return load_dino(obj, source, method, method_hparams)
    det = detect(obj, method if method in METHOD_FORMATS else None)
    if det.format == "backbone":
        if method is None:
            raise ValueError("this file holds a backbone only (torchvision names); say which "
                             f"method's heads to build: method= one of {METHOD_FORMATS}")
        return load_backbone_into_method(det, method, method_hparams, new_heads, source)
    if method is not None and method not in METHOD_FORMATS:
        raise ValueError(f"the file has the official {det.format} layout; a {method} model can "
                         "start from a backbone-only file or an e2mc checkpoint of its own")
    if det.format in LAYOUT_FORMATS:  # MoCo v3, Barlow Twins, solo-learn, lightly
        return load_layout(det, source, new_heads, method_hparams)
    name = method or det.format
    state, unmapped = det.mapped()
    hp = {**infer_hparams(det, state), **method_hparams}
    model = load_strict(lambda: rebuild(name, hp), state, det.format, det.to_file_key,
                        unmapped)
    return model, {"format": det.format, "epoch": det.epoch,  # type: ignore[return-value]
                   "optimizer": det.optimizer, "source": source, **det.extra,
                   "hparams": model.hparams}


def load_backbone_into_method(det: Any, name: str, method_hparams: dict[str, Any],
                              new_heads: bool, source: str | None
                              ) -> tuple[SSLMethod, dict[str, Any]]:
    """``(method, info)``: the method ``name`` around the backbone-only state dict ``det``, its
    heads new (only with ``new_heads``)."""
    hp = {**(infer_resnet(det.state_dict) or {}), **method_hparams}
    arch = hp.get("backbone", "resnet50")
    classifier = classifier_keys(arch) if isinstance(arch, str) else frozenset()
    dropped = sorted(k for k in det.state_dict if k in classifier)
    sd = {k: v for k, v in det.state_dict.items() if k not in dropped}
    model = rebuild(name, hp)
    heads = head_names(model)
    if not new_heads:
        raise ValueError(
            f"{source or 'the checkpoint'} holds only a {arch} backbone, no {name} "
            f"{'/'.join(heads) or 'heads'}: continuing would start them from random weights. "
            "Pass --new-heads (init.new_heads: true; new_heads=True in Python) if that is what "
            "you want, or start from a checkpoint that has them")
    load_backbone_alone(model, sd, f"backbone only ({arch})", lambda k: det.prefix + k)
    return model, {"format": "backbone", "epoch": det.epoch, "optimizer": None,
                   "source": source, **det.extra, "hparams": model.hparams,
                   "dropped_keys": dropped, "new_heads": heads}


def save_checkpoint(path: str | os.PathLike[str], method: SSLMethod, **extra: Any) -> None:
    """Write the project format (docs/checkpoints.md) atomically."""
    method = unwrap(method)  # type: ignore[assignment]
    clash = sorted(set(extra) & set(_RESERVED))
    if clash:
        raise ValueError(f"extra keys {clash} are reserved by the checkpoint format")
    obj = {"format": PROJECT_FORMAT, "version": PROJECT_VERSION, "method": method.name,
           "hparams": dict(method.hparams), "model": method.state_dict(), **extra}
    atomic_save(obj, path)


def project_from_object(obj: dict[str, Any], source: str | None,
                        hparams: dict[str, Any] | None = None) -> tuple[SSLMethod, dict[str, Any]]:
    """:func:`load_checkpoint` of a loaded project checkpoint; ``hparams``: a run's, which the
    tensors must fit, instead of the file's."""
    if obj.get("version") != PROJECT_VERSION:
        raise ValueError(f"e2mc checkpoint version {obj.get('version')!r} is not supported "
                         f"(expected {PROJECT_VERSION})")
    name, hp = obj["method"], obj["hparams"] if hparams is None else hparams
    model = load_strict(lambda: rebuild(name, hp), obj["model"], f"e2mc ({name})")
    info = {k: v for k, v in obj.items() if k != "model"}
    info["source"] = source
    return model, info  # type: ignore[return-value]


def load_checkpoint(path: PathOrState, trust: bool = False) -> tuple[SSLMethod, dict[str, Any]]:
    """``(method, info)`` of a project checkpoint (rebuilt from its ``hparams``, strict; ``info``
    all but ``model``) or of an official file (:func:`load_official`)."""
    obj, source, _ = load_file(path, trust)
    if isinstance(obj, dict) and obj.get("format") == PROJECT_FORMAT:
        return project_from_object(obj, source)
    return official_from_object(obj, source, None, False, {})


def restore_optimizer_state(optimizer: torch.optim.Optimizer, method: nn.Module,
                            state: dict[str, Any]) -> int:
    """Restore the per-parameter buffers (momentum; LARS's ``mu`` and SGD's
    ``momentum_buffer`` renamed as needed) of an official optimizer state into ``optimizer``,
    keeping its lr and wd; returns how many parameters were restored. The ``k``-th saved
    parameter is ``list(method.parameters())[k]``: the method classes keep the official order."""
    method = unwrap(method)
    try:
        saved_ids = [i for g in state["param_groups"] for i in g["params"]]
        per_param = state["state"]
    except (KeyError, TypeError) as err:
        raise ValueError("not an optimizer state dict (needs 'state' and 'param_groups')") from err
    params = list(method.parameters())
    if len(saved_ids) != len(params):
        raise ValueError(f"the optimizer state covers {len(saved_ids)} parameters, the model has "
                         f"{len(params)}")
    key = getattr(optimizer, "momentum_key", "momentum_buffer")
    in_optimizer = {id(p) for g in optimizer.param_groups for p in g["params"]}
    restored = 0
    for pos, sid in enumerate(saved_ids):
        saved = per_param.get(sid)
        p = params[pos]
        if not saved or id(p) not in in_optimizer:
            continue
        converted: dict[str, Any] = {}
        for k, v in saved.items():
            k = key if k in ("mu", "momentum_buffer") else k
            if isinstance(v, torch.Tensor) and v.ndim > 0:
                if v.shape != p.shape:
                    raise ValueError(f"optimizer state {k!r} of parameter {pos} has shape "
                                     f"{tuple(v.shape)}, the parameter {tuple(p.shape)}")
                v = v.to(device=p.device, dtype=p.dtype).contiguous()
            converted[k] = v
        optimizer.state[p] = converted
        restored += 1
    return restored
