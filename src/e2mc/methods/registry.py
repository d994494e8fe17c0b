"""Build a method by name (used to rebuild a method from a checkpoint's ``hparams``)."""

from __future__ import annotations

from typing import Any

from e2mc.methods.base import SSLMethod
from e2mc.methods.simsiam import SimSiam
from e2mc.methods.swav import SwAV
from e2mc.methods.vicreg import VICReg

METHODS: dict[str, type[SSLMethod]] = {"vicreg": VICReg, "swav": SwAV, "simsiam": SimSiam}


def build_method(name: str, **hparams: Any) -> SSLMethod:
    """``build_method("vicreg", backbone="resnet18", projector="64-64")``; unknown names or
    arguments raise ``ValueError``. Keys of a saved ``hparams`` that only describe a user
    backbone (``backbone_class``) are not accepted: such models must be rebuilt in code."""
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; choose from {sorted(METHODS)}")
    if hparams.get("backbone", "resnet50") is None:
        raise ValueError(f"this {name} model was built around a user backbone "
                         f"({hparams.get('backbone_class', '?')}); rebuild it in code and load "
                         "the checkpoint's 'model' state dict")
    import inspect

    allowed = set(inspect.signature(METHODS[name].__init__).parameters) - {"self"}
    unknown = sorted(set(hparams) - allowed)
    if unknown:
        raise ValueError(f"unknown {name} hyperparameters {unknown}; allowed: {sorted(allowed)}")
    return METHODS[name](**hparams)
