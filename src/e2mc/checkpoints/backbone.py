"""A backbone from any checkpoint (:func:`load_backbone`): a project or official checkpoint's,
an exported backbone (its sidecar names the architecture), or a plain state dict."""

from __future__ import annotations

from typing import Any

from torch import nn

from e2mc.checkpoints.api import PROJECT_FORMAT, official_from_object, project_from_object
from e2mc.checkpoints.export import exported_arch, read_sidecar
from e2mc.checkpoints.layouts import UnknownArchitectureError, is_dino_checkpoint
from e2mc.checkpoints.official import Detected, bare_backbone, detect, infer_resnet, known_layout
from e2mc.checkpoints.remote import PathOrState, load_file
from e2mc.checkpoints.strict import load_strict
from e2mc.checkpoints.summary import checkpoint_summary
from e2mc.models import build_backbone, classifier_keys, weights_from_checkpoint
from e2mc.models.build import build_on_meta


def load_backbone(path: PathOrState, arch: str | None = None, small_images: bool = False,
                  in_channels: int = 3, trust: bool = False
                  ) -> tuple[nn.Module, int, dict[str, Any]]:
    """``(backbone, feature_dim, info)`` from a project or official checkpoint or a plain
    backbone state dict (a classifier dropped), whose architecture comes from ``arch`` (with
    ``small_images``, ``in_channels``), else its export sidecar, else the ResNet the shapes
    show; with either, its names are the backbone's even where they look like a method's.
    ``arch`` also names an official file's backbone its keys do not give (a MoCo v3 ViT).
    ``info``: :func:`checkpoint_summary` (with the file's ``sha256`` and ``source``)."""
    obj, source, local = load_file(path, trust)
    project = isinstance(obj, dict) and obj.get("format") == PROJECT_FORMAT
    if project or is_dino_checkpoint(obj):  # (detect does not tell DINO's layout)
        method, info = (project_from_object(obj, source) if project
                        else official_from_object(obj, source, None, False, {}))
        return method.backbone, method.feature_dim, checkpoint_summary(info, local)
    exported = None if arch is not None else read_sidecar(local, obj)
    bare = bare_backbone(obj)
    if exported is not None:  # export-backbone's file, whatever its names look like
        det: Detected = bare  # type: ignore[assignment]
    elif bare is not None and arch is not None and not known_layout(bare):
        det = bare  # a backbone whose names are like a method's (a torchvision ViT's encoder.*)
    else:
        try:
            det = detect(obj)
        except ValueError as err:
            if bare is None:
                raise
            raise ValueError(f"{err}; if it is a backbone's state dict, name its architecture "
                             "with --arch (arch=), or keep the <file>.json export-backbone "
                             "wrote beside it") from None
    if det.format != "backbone":
        try:
            method, info = official_from_object(obj, source, None, False, {})
        except UnknownArchitectureError:  # a MoCo v3 ViT: ``arch`` names it
            if arch is None:
                raise
            method, info = official_from_object(obj, source, None, False, {"backbone": arch})
        return method.backbone, method.feature_dim, checkpoint_summary(info, local)
    spec: dict[str, Any] | None = None
    if arch is not None:
        spec = {"backbone": arch, "small_images": small_images, "in_channels": in_channels}
    elif exported is not None:
        spec = exported_arch(exported)
    if spec is None:
        spec = infer_resnet(det.state_dict)
    if spec is None:
        raise ValueError("cannot tell the architecture of this backbone state dict: pass arch= "
                         "(CLI --arch), or keep the <file>.json written by export-backbone")
    classifier = classifier_keys(spec["backbone"])
    dropped = sorted(k for k in det.state_dict if k in classifier)
    sd = {k: v for k, v in det.state_dict.items() if k not in dropped}
    with weights_from_checkpoint():
        module, feature_dim = build_on_meta(lambda: build_backbone(
            spec["backbone"], spec["small_images"], spec["in_channels"]))
    backbone = load_strict(lambda: module, sd, f"backbone ({spec['backbone']})",
                           lambda k: det.prefix + k)
    info = {"format": "backbone", "arch": spec["backbone"], "small_images": spec["small_images"],
            "in_channels": spec["in_channels"], "dropped_keys": dropped, "source": source}
    if exported is not None:
        info.update(exported={k: v for k, v in exported.items() if k != "arch"},
                    image_size=exported.get("image_size"))
    return backbone, feature_dim, checkpoint_summary(info, local)
