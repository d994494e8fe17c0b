"""Checkpoints of runs around your own backbone module (``continue_module``): the module is
handed in and the run's weights loaded strictly into a copy (:func:`load_into_module` for the
backbone, :func:`method_around` for the whole method)."""

from __future__ import annotations

import copy
import os
from typing import Any

from torch import nn

from e2mc.checkpoints.io import torch_load
from e2mc.checkpoints.official import is_state_dict
from e2mc.checkpoints.strict import load_strict
from e2mc.errors import InputError
from e2mc.methods.registry import build_method


def _project_file(path: str | os.PathLike[str], trust: bool) -> dict[str, Any]:
    obj = torch_load(path, trust=trust)
    if not (isinstance(obj, dict) and obj.get("format") == "e2mc" and "hparams" in obj):
        raise InputError(f"{path} is neither an e2mc checkpoint of a run (continue_module "
                         "writes them) nor a state dict of the module (module.state_dict() "
                         "saved)")
    if "projector_class" in obj["hparams"]:
        raise InputError(f"{path} was built around your own projector too "
                         f"({obj['hparams']['projector_class']}): rebuild it in code")
    return obj


def method_around(path: str | os.PathLike[str], module: nn.Module, trust: bool = False
                  ) -> tuple[nn.Module, dict[str, Any]]:
    """``(method, info)``: the checkpoint's method rebuilt around a copy of ``module`` (the
    run's backbone, any weights), every tensor from the file (strict); ``info``: the rest."""
    obj = _project_file(path, trust)
    hparams = {k: v for k, v in obj["hparams"].items() if k != "backbone_class"}
    recorded = obj["hparams"].get("backbone_class")
    if recorded is not None and recorded != type(module).__name__:
        raise InputError(f"{path} was trained around a {recorded}, not a "
                         f"{type(module).__name__}: hand in the module the run was built with")
    hparams["backbone"] = copy.deepcopy(module)
    method = load_strict(lambda: build_method(obj["method"], **hparams), obj["model"],
                         f"e2mc ({obj['method']} around {type(module).__name__})")
    return method, {k: v for k, v in obj.items() if k != "model"}


def load_into_module(path: str | os.PathLike[str], module: nn.Module, trust: bool = False
                     ) -> tuple[nn.Module, int | None, dict[str, Any]]:
    """``(backbone, feature_dim, info)``: a copy of ``module`` with the run's backbone weights
    (:func:`method_around`), or with a plain state dict of it (the starting weights;
    ``feature_dim`` None)."""
    obj = torch_load(path, trust=trust)
    if is_state_dict(obj):
        backbone = load_strict(lambda: copy.deepcopy(module), obj,
                               f"the state dict of a {type(module).__name__}")
        return backbone, None, {"format": "module", "module": type(module).__name__,
                                "starting_weights": True}
    method, info = method_around(path, module, trust)
    return method.backbone, int(method.feature_dim), info
