"""Build a method by name (used to rebuild a method from a checkpoint's ``hparams``)."""

from __future__ import annotations

import difflib
from typing import Any

from e2mc.methods.barlowtwins import BarlowTwins
from e2mc.methods.base import SSLMethod
from e2mc.methods.byol import BYOL
from e2mc.methods.dino import DINO
from e2mc.methods.generic import Generic
from e2mc.methods.mocov3 import MoCoV3
from e2mc.methods.simclr import SimCLR
from e2mc.methods.simsiam import SimSiam
from e2mc.methods.swav import SwAV
from e2mc.methods.vicreg import VICReg

METHODS: dict[str, type[SSLMethod]] = {
    "vicreg": VICReg, "swav": SwAV, "simsiam": SimSiam, "barlowtwins": BarlowTwins,
    "simclr": SimCLR, "byol": BYOL, "mocov3": MoCoV3, "dino": DINO, "generic": Generic}


def build_method(name: str, **hparams: Any) -> SSLMethod:
    """``build_method("vicreg", backbone="resnet18", projector="64-64")``; unknown names or
    arguments raise ``ValueError`` (with the close matches). Keys of a saved ``hparams`` that
    only describe a user module (``backbone_class``, ``projector_class``) are not accepted: such
    models must be rebuilt in code."""
    if name not in METHODS:
        close = difflib.get_close_matches(str(name), list(METHODS), n=2)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise ValueError(f"unknown method {name!r}{hint}; choose from {sorted(METHODS)}")
    user = [k for k in ("backbone_class", "projector_class") if k in hparams]
    if hparams.get("backbone", "resnet50") is None or user:
        described = ", ".join(f"{hparams[k]}" for k in user) or "?"
        raise ValueError(f"this {name} model was built around user modules ({described}); "
                         "rebuild it in code and load the checkpoint's 'model' state dict")
    import inspect

    allowed = set(inspect.signature(METHODS[name].__init__).parameters) - {"self"}
    unknown = sorted(set(hparams) - allowed)
    if unknown:
        raise ValueError(f"unknown {name} hyperparameters {unknown}; allowed: {sorted(allowed)}")
    return METHODS[name](**hparams)
