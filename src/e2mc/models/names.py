"""Backbone names (``resnet50``, ``torchvision:resnet50:WEIGHTS``, ``timm:NAME``, ``hf:REPO``):
what a name says, and the errors of a name that is not known or needs a missing extra."""

from __future__ import annotations

import difflib
from typing import Any

SOURCES = ("torchvision", "timm", "hf")


def parse_backbone_name(name: str) -> tuple[str, str, str | None]:
    """``(source, model, weights)`` of a backbone name: ``"resnet50"`` ->
    ``("torchvision", "resnet50", None)``, ``"torchvision:resnet50:IMAGENET1K_V2"`` -> ``(...,
    "IMAGENET1K_V2")``; a ``timm:`` or ``hf:`` model is kept whole."""
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


def unknown_error(kind: str, name: str, known: list[str], extra: str = "") -> ValueError:
    close = difflib.get_close_matches(name, known, n=5, cutoff=0.6)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    return ValueError(f"unknown {kind} {name!r}{hint}{extra}")


def missing_extra(package: str, extra: str, name: str) -> ValueError:
    return ValueError(f"backbone {name!r} needs the {package} package: "
                      f"pip install 'e2mc[{extra}]' (or pip install {package})")


def timm_parts(model: str) -> tuple[str, str | None, dict[str, Any]]:
    """``(architecture, tag, arguments)`` of a timm model name ``ARCH[.TAG][(KEY=LITERAL, ...)]``
    (arguments for ``timm.create_model``: moco-v3's ViT-S has 12 heads where timm's has 6)."""
    head, paren, rest = model.partition("(")
    arguments: dict[str, Any] = {}
    if paren:
        if not rest.endswith(")"):
            raise ValueError(f"timm:{model}: the arguments end in ')', e.g. "
                             "timm:vit_small_patch16_224(num_heads=12)")
        arguments = _keyword_literals(model, rest[:-1])
    architecture, dot, tag = head.partition(".")
    if not architecture or (dot and not tag):
        raise ValueError(f"timm:{model}: names no model (timm:ARCH, timm:ARCH.TAG or "
                         "timm:ARCH(KEY=VALUE, ...))")
    return architecture, tag or None, arguments


def _keyword_literals(model: str, text: str) -> dict[str, Any]:
    """``{"num_heads": 12}`` of ``"num_heads=12"``: keyword arguments whose values are literals."""
    import ast

    problem = f"timm:{model}: the arguments are KEY=VALUE pairs of Python literals"
    try:
        call = ast.parse(f"f({text})", mode="eval").body
    except SyntaxError:
        raise ValueError(problem) from None
    assert isinstance(call, ast.Call)
    if call.args or any(k.arg is None for k in call.keywords) or not call.keywords:
        raise ValueError(problem)
    try:
        return {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg}
    except ValueError:
        raise ValueError(problem) from None
