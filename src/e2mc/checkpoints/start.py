"""The starting model of a run (:func:`load_start_model`)."""

from __future__ import annotations

from typing import Any

from e2mc.checkpoints.api import (
    PROJECT_FORMAT,
    load_backbone_into_method,
    official_from_object,
)
from e2mc.checkpoints.export import exported_hparams, read_sidecar
from e2mc.checkpoints.official import bare_backbone, known_layout
from e2mc.checkpoints.sources import PathOrState, load_file
from e2mc.checkpoints.strict import load_strict, rebuild
from e2mc.methods.base import SSLMethod


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

