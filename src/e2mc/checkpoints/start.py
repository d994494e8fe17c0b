"""The starting model of a run (:func:`load_start_model`): a project checkpoint of the run's
method, an exported backbone (built as its sidecar says), a backbone's plain state dict, or an
official file."""

from __future__ import annotations

from typing import Any

from e2mc.checkpoints.api import (
    PROJECT_FORMAT,
    load_backbone_into_method,
    official_from_object,
)
from e2mc.checkpoints.export import exported_hparams, read_sidecar
from e2mc.checkpoints.official import Detected, bare_backbone, known_layout
from e2mc.checkpoints.sources import PathOrState, load_file
from e2mc.checkpoints.strict import load_strict, rebuild
from e2mc.methods.base import SSLMethod


def load_start_model(path: PathOrState, method: str, trust: bool = False,
                      new_heads: bool = False,
                      **method_hparams: Any) -> tuple[SSLMethod, dict[str, Any]]:
    """The starting model of a run of ``method`` built with ``method_hparams`` (the run's
    configuration): a project checkpoint of that method, loaded strictly into the configured
    model, or an official file (:func:`load_official`; a backbone-only file needs
    ``new_heads=True``). ``path`` may be a URL. A backbone written by :func:`export_backbone`
    is built as its sidecar says (a run configured with another architecture is a
    ``ValueError`` naming both); a plain state dict whose names no layout explains (a
    torchvision ViT's ``encoder.*``) is taken for a backbone of the configured architecture.

    ``info`` holds ``epoch``, ``optimizer`` (a state dict or None), ``source`` and
    ``optimizer_layout``: ``"project"`` (written by this package's optimizer: load it as is) or
    ``"official"`` (apply it with :func:`restore_optimizer_state`).
    """
    obj, source, local = load_file(path, trust)
    if isinstance(obj, dict) and obj.get("format") == PROJECT_FORMAT:
        if obj.get("method") != method:
            raise ValueError(f"{source or 'the checkpoint'} holds a {obj.get('method')!r} model; "
                             f"this run trains {method!r}")
        model = load_strict(lambda: rebuild(method, method_hparams), obj["model"],
                            f"e2mc ({method})")
        info = {k: v for k, v in obj.items() if k != "model"}
        info.update(source=source, optimizer_layout="project")
        return model, info  # type: ignore[return-value]
    exported = read_sidecar(local, obj)
    bare = bare_backbone(obj)
    if exported is not None:  # export-backbone's file: its sidecar names the architecture
        hparams = {**exported_hparams(exported, method_hparams, source or str(local)),
                   **method_hparams}
        model, info = _start_from_backbone(bare, method, hparams, new_heads,  # type: ignore[arg-type]
                                           source)
        info["exported"] = exported
    elif bare is not None and not known_layout(bare):
        # a backbone's bare state dict whose names are like a method's (a torchvision ViT's
        # encoder.*): the run's configuration names its architecture
        model, info = _start_from_backbone(bare, method, dict(method_hparams), new_heads,
                                           source)
    else:
        model, info = official_from_object(obj, source, method, new_heads, method_hparams)
    info.update(optimizer_layout="official")
    return model, info


def _start_from_backbone(det: Detected, method: str, method_hparams: dict[str, Any],
                         new_heads: bool, source: str | None
                         ) -> tuple[SSLMethod, dict[str, Any]]:
    """The method ``method`` around the backbone-only state dict ``det`` (new heads), as
    :func:`load_official` starts from a backbone-only file."""
    model, dropped, hp, heads = load_backbone_into_method(det, method, method_hparams,
                                                          new_heads, source)
    return model, {"format": "backbone", "epoch": None, "optimizer": None, "source": source,
                   "hparams": hp, "dropped_keys": dropped, "new_heads": heads}
