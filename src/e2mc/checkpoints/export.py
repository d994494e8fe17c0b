"""The exported backbone (:func:`export_backbone`): a plain state dict and its ``<file>.json``
sidecar (architecture, image size, SHA-256); :func:`read_sidecar` reads it."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

from torch import nn

from e2mc.checkpoints.api import (
    PROJECT_FORMAT,
    load_backbone_into_method,
    load_checkpoint,
    official_from_object,
    project_from_object,
    unwrap,
)
from e2mc.checkpoints.io import UntrustedCheckpointError, atomic_save, torch_load
from e2mc.checkpoints.official import bare_backbone, is_state_dict, known_layout
from e2mc.checkpoints.remote import PathOrState, is_url, load_file, local_checkpoint
from e2mc.checkpoints.summary import recorded_image_size
from e2mc.files import atomic_write_json, refuse_link, sha256_file
from e2mc.methods.base import SSLMethod
from e2mc.models import check_backbone_input, parse_backbone_name, timm_parts


def sidecar_path(path: str | os.PathLike[str]) -> Path:
    """Where :func:`export_backbone` writes the architecture of ``path``: ``<path>.json``."""
    return Path(f"{os.fspath(path)}.json")


EXPORT_FORMAT = "e2mc-backbone"  # the sidecar's ``format``


def read_sidecar(path: str | os.PathLike[str] | None, obj: Any = None) -> dict[str, Any] | None:
    """The sidecar :func:`export_backbone` wrote beside ``path``; None without one, for the
    export of a user's module (no architecture), or when ``obj`` is not a plain state dict. An
    unreadable sidecar, or one recording the SHA-256 of other bytes, is a ``ValueError``."""
    if path is None or (obj is not None and bare_backbone(obj) is None):
        return None
    side = sidecar_path(path)
    if not side.is_file():
        return None
    try:
        meta = json.loads(side.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{side} (the architecture of {path}, written by export-backbone) "
                         f"cannot be read: {' '.join(str(err).split())}; export the backbone "
                         "again, or delete it and pass --arch") from None
    if not isinstance(meta, dict) or meta.get("format") != EXPORT_FORMAT:
        return None  # not export-backbone's record: some other file of the user's
    if not isinstance(meta.get("arch"), str) or not meta["arch"]:
        return None  # the export of a module of the user's own: no architecture to build
    recorded = meta.get("sha256")
    if isinstance(recorded, str) and recorded != sha256_file(path):
        raise ValueError(f"{side} describes other bytes than {path} (sha256 {recorded[:12]}..., "
                         "the file was replaced after export-backbone wrote it): export the "
                         "backbone again, or delete the .json and pass --arch")
    return meta


def check_model_input(cfg: Any, start: str | os.PathLike[str] | None) -> None:
    """Before the data or any checkpoint is read: the backbone of ``cfg`` (a ``RunConfig``)
    takes images of ``data.image_size``, and is the architecture the sidecar of an exported
    starting backbone ``start`` records (:func:`exported_hparams`)."""
    model = cfg.model
    check_backbone_input(model.backbone, cfg.data.image_size, model.in_channels,
                         model.small_images, option="--set data.image_size=N")
    if start is None or is_url(start) or not Path(start).is_file():
        return
    exported = read_sidecar(start)
    if exported is not None:
        exported_hparams(exported, {"backbone": model.backbone, "small_images":
                                    model.small_images, "in_channels": model.in_channels},
                         os.fspath(start))


def exported_arch(exported: dict[str, Any]) -> dict[str, Any]:
    """``{"backbone", "small_images", "in_channels"}`` a sidecar records."""
    return {"backbone": exported["arch"],
            "small_images": bool(exported.get("small_images", False)),
            "in_channels": int(exported.get("in_channels", 3))}


def exported_hparams(exported: dict[str, Any], method_hparams: dict[str, Any],
                     where: str) -> dict[str, Any]:
    """The architecture an export's sidecar records (``backbone``, ``small_images``,
    ``in_channels``), refused (one line naming both) where the run configures another."""
    recorded = exported_arch(exported)
    options = {"backbone": "--backbone {}", "small_images": "--set model.small_images={}",
               "in_channels": "--set model.in_channels={}"}
    for key, value in recorded.items():
        given = method_hparams.get(key)
        if given is None:
            continue
        same = (_same_architecture(given, value) if key == "backbone"
                else type(value)(given) == value)
        if not same:
            option = options[key].format(str(value).lower() if isinstance(value, bool)
                                         else value)
            raise ValueError(f"{where} is a backbone exported with {key}={value} (its "
                             f"{sidecar_path(where).name} says so), the run's model.{key} is "
                             f"{given}: start it with {option}")
    return recorded


def _same_architecture(a: Any, b: Any) -> bool:
    """Whether two backbone names build the same architecture (weights and timm tags aside:
    ``resnet50`` and ``torchvision:resnet50:IMAGENET1K_V2``)."""
    if not isinstance(a, str) or not isinstance(b, str):
        return a == b
    (sa, ma, _), (sb, mb, _) = parse_backbone_name(a), parse_backbone_name(b)
    if sa == sb == "timm":  # the tag aside, the arguments kept
        (aa, _, ka), (ab, _, kb) = timm_parts(ma), timm_parts(mb)
        return (aa, ka) == (ab, kb)
    return (sa, ma) == (sb, mb)


def teacher_backbone(method: nn.Module) -> nn.Module:
    """The EMA teacher's backbone of ``method``; ``ValueError`` for a method without one or
    whose teacher was never set (started with new heads and not trained)."""
    method = unwrap(method)
    teacher = getattr(method, "teacher", None)
    if not isinstance(teacher, nn.ModuleDict) or "backbone" not in teacher:
        raise ValueError(f"a {getattr(method, 'name', type(method).__name__)} model has no "
                         "teacher (EMA target): --teacher is for dino, byol and mocov3")
    if not bool(getattr(method, "teacher_initialized", True)):
        raise ValueError("this model's teacher was never set (it was started with new heads and "
                         "not trained: the teacher becomes a copy of the student at the first "
                         "step); export the student's backbone")
    return teacher["backbone"]


def _same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one does not exist
        return Path(a).resolve() == Path(b).resolve()


def _check_export_target(checkpoint: PathOrState | None, out_path: str | os.PathLike[str]
                         ) -> None:
    """Refuse an export that would overwrite its input or another checkpoint, or could write
    one of its two files and not the other (a link or a folder at either path)."""
    out = Path(out_path)
    for target in (out, sidecar_path(out)):
        refuse_link(target)
        if target.is_dir():
            raise IsADirectoryError(errno.EISDIR, "is a directory, not a file", str(target))
    if checkpoint is not None and not isinstance(checkpoint, dict):
        source = local_checkpoint(checkpoint)
        for target in (out, sidecar_path(out)):
            if _same_file(source, target):
                raise ValueError(f"{target} is the checkpoint it reads ({checkpoint}): the export "
                                 "would overwrite it; give another output path")
    if not out.is_file():
        return
    try:
        existing = torch_load(out)
    except UntrustedCheckpointError:
        existing = None
    except Exception:  # not a checkpoint (an unreadable or text file): the user's to replace
        return
    if is_state_dict(existing):
        return  # a plain state dict (an earlier export): replaced
    if isinstance(existing, dict) and existing.get("format") == PROJECT_FORMAT:
        step = f", step {existing['step']}" if "step" in existing else ""
        what = f"an e2mc checkpoint ({existing.get('method')}{step})"
    else:
        what = "a checkpoint with more than a plain state dict"
    raise ValueError(f"{out} already exists and is {what}, not an exported backbone: "
                     "export-backbone does not overwrite it; give another output path or "
                     "delete the file first")


def export_backbone(method_or_checkpoint: SSLMethod | PathOrState, out_path: str | os.PathLike[str],
                    trust: bool = False, last: bool = False,
                    teacher: bool = False) -> dict[str, Any]:
    """Write the backbone's plain state dict (the library's names without the classifier, as
    :func:`e2mc.models.build_backbone` builds it) to ``out_path`` atomically and its sidecar
    (returned) to ``<out_path>.json`` (docs/checkpoints.md). Refused, nothing written: a target
    that is the input, a link or a folder, or an existing file holding more than a plain state
    dict. A run directory stands for its model (``last``: its last step), recorded under
    ``model``; ``teacher``: the EMA teacher's backbone, recorded as ``"part": "teacher"``."""
    from e2mc.artifacts import run_model

    model = None
    if isinstance(method_or_checkpoint, nn.Module):
        _check_export_target(None, out_path)
        method = unwrap(method_or_checkpoint)
        source = None
    else:
        if not isinstance(method_or_checkpoint, dict):
            model = run_model(method_or_checkpoint, last)
            if model is not None:
                method_or_checkpoint = model.path
        _check_export_target(method_or_checkpoint, out_path)
        method, info = load_checkpoint(method_or_checkpoint, trust=trust)
        source = info.get("source")
    hp = getattr(method, "hparams", {})
    backbone = teacher_backbone(method) if teacher else method.backbone
    state = {k: v.detach().cpu().clone() for k, v in backbone.state_dict().items()}
    meta = {"format": EXPORT_FORMAT, "arch": hp.get("backbone"),
            "small_images": bool(hp.get("small_images", False)),
            "in_channels": int(hp.get("in_channels", 3)),
            "feature_dim": int(method.feature_dim), "method": getattr(method, "name", None),
            "source": None if source is None else str(source),
            "image_size": None if isinstance(method_or_checkpoint, nn.Module)
            else recorded_image_size(info)}
    if hp.get("backbone") is None and hp.get("backbone_class"):  # a module of the user's
        meta["backbone_class"] = hp["backbone_class"]
    if model is not None:
        meta["model"] = model.record(info.get("step"))
    if teacher:
        meta["part"] = "teacher"
    atomic_save(state, out_path)
    meta["sha256"] = sha256_file(out_path)  # the sidecar belongs to these bytes only
    atomic_write_json(meta, sidecar_path(out_path))
    return meta


def load_start_model(path: PathOrState, method: str, trust: bool = False,
                      new_heads: bool = False,
                      **method_hparams: Any) -> tuple[SSLMethod, dict[str, Any]]:
    """The starting model of a run of ``method`` configured with ``method_hparams``: a project
    checkpoint of that method, an exported backbone (as its sidecar says; another configured
    architecture is a ``ValueError``), a plain state dict no layout explains (a backbone of the
    configured architecture), or an official file (:func:`load_official`). ``info``:
    ``epoch``, ``optimizer``, ``source``, ``optimizer_layout`` (``"project"``: load as is;
    ``"official"``: :func:`restore_optimizer_state`)."""
    obj, source, local = load_file(path, trust)
    if isinstance(obj, dict) and obj.get("format") == PROJECT_FORMAT:
        if obj.get("method") != method:
            raise ValueError(f"{source or 'the checkpoint'} holds a {obj.get('method')!r} model; "
                             f"this run trains {method!r}")
        model, info = project_from_object(obj, source, dict(method_hparams))
        info.update(optimizer_layout="project")
        return model, info
    exported = read_sidecar(local, obj)
    bare = bare_backbone(obj)
    if exported is not None:  # export-backbone's file: its sidecar names the architecture
        hparams = {**exported_hparams(exported, method_hparams, source or str(local)),
                   **method_hparams}
        model, info = load_backbone_into_method(bare, method, hparams, new_heads, source)
        info["exported"] = exported
    elif bare is not None and not known_layout(bare):
        # a backbone whose names look like a method's (a torchvision ViT's encoder.*)
        model, info = load_backbone_into_method(bare, method, dict(method_hparams),
                                                new_heads, source)
    else:
        model, info = official_from_object(obj, source, method, new_heads, method_hparams)
    info.update(optimizer_layout="official")
    return model, info
