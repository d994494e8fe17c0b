"""Loading official checkpoints, the project's format, backbones, and exporting backbones."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from e2mc.checkpoints.io import UntrustedCheckpointError, atomic_save, torch_load
from e2mc.checkpoints.layouts import load_layout
from e2mc.checkpoints.official import (
    LAYOUT_FORMATS,
    METHOD_FORMATS,
    Detected,
    detect,
    infer_hparams,
    infer_resnet,
)
from e2mc.checkpoints.official_dino import is_dino_checkpoint, load_dino
from e2mc.checkpoints.remote import fetch, is_url
from e2mc.checkpoints.strict import check_keys, load_strict
from e2mc.files import atomic_write_json, sha256_file
from e2mc.methods.base import SSLMethod
from e2mc.methods.registry import build_method
from e2mc.models import (
    build_backbone,
    classifier_keys,
    parse_backbone_name,
    weights_from_checkpoint,
)

PROJECT_FORMAT = "e2mc"
PROJECT_VERSION = 1
_RESERVED = ("format", "version", "method", "hparams", "model")

PathOrState = str | os.PathLike[str] | dict[str, Any]


def _load_obj(path_or_state: PathOrState, trust: bool) -> tuple[Any, str | None]:
    """The loaded object and its source; a URL (``#sha256=`` checked) is fetched into torch.hub's
    cache first, a training run directory stands for its model (:func:`checkpoint_of`)."""
    obj, source, _ = _load_file(path_or_state, trust)
    return obj, source


def _load_file(path_or_state: PathOrState, trust: bool) -> tuple[Any, str | None, str | None]:
    """:func:`_load_obj` plus the local file that was read (None for a loaded object)."""
    if isinstance(path_or_state, dict):
        return path_or_state, None, None
    if is_url(path_or_state):
        local = str(fetch(str(path_or_state)))
        return torch_load(local, trust=trust), str(path_or_state), local
    path = checkpoint_of(path_or_state)  # a run directory stands for its model (best.pt)
    return torch_load(path, trust=trust), path, path


def _rebuild(name: str, hparams: dict[str, Any]) -> SSLMethod:
    """``build_method`` for a model whose every weight a checkpoint is about to set (no
    pretrained backbone weights are fetched)."""
    with weights_from_checkpoint():
        return build_method(name, **hparams)


def _unwrap(method: nn.Module) -> nn.Module:
    return method.module if isinstance(method, nn.parallel.DistributedDataParallel) else method


def load_official(path_or_state_dict: PathOrState, method: str | None = None,
                  trust: bool = False, new_heads: bool = False,
                  **method_hparams: Any) -> tuple[SSLMethod, dict[str, Any]]:
    """Load an official VICReg / SwAV / SimSiam checkpoint (detected, or checked against
    ``method``) strictly into the method with the official layout.

    ``path_or_state_dict``: a file, a URL (see :mod:`e2mc.checkpoints.remote`) or a loaded
    object. Head sizes and the ResNet are read off the tensor shapes; ``method_hparams``
    override them (and then must still match the file). A backbone-only file (VICReg
    ``resnet50.pth``, torchvision or timm weights; a classifier is dropped) needs ``method`` (any
    method, ``generic`` included) and ``new_heads=True``: its projector (and predictor,
    prototypes) start from random weights, which must be asked for. Returns ``(method,
    info)``; ``info`` holds ``format``, ``epoch``, ``optimizer`` (the official optimizer state,
    to be applied with :func:`restore_optimizer_state`), ``hparams``, ``source`` and, for a
    backbone-only file, ``new_heads`` (the names of the randomly initialised modules).
    """
    obj, source = _load_obj(path_or_state_dict, trust)
    return _official(obj, source, method, new_heads, method_hparams)


def _official(obj: Any, source: str | None, method: str | None, new_heads: bool,
              method_hparams: dict[str, Any]) -> tuple[SSLMethod, dict[str, Any]]:
    """:func:`load_official` of a loaded object."""
    if isinstance(obj, dict) and obj.get("format") == PROJECT_FORMAT:
        raise ValueError("this is an e2mc checkpoint, not an official one: use load_checkpoint")
    if is_dino_checkpoint(obj):  # student, teacher and DINO's centre
        return load_dino(obj, source, method, method_hparams)
    det = detect(obj, method if method in METHOD_FORMATS else None)
    name = method or det.format
    info: dict[str, Any] = {"format": det.format, "epoch": det.epoch,
                            "optimizer": det.optimizer, "source": source, **det.extra}
    if det.format == "backbone":
        if method is None:
            raise ValueError("this file holds a backbone only (torchvision names); say which "
                             f"method's heads to build: method= one of {METHOD_FORMATS}")
        model, dropped, hp, heads = _load_backbone_into_method(det, name, method_hparams,
                                                               new_heads, source)
        info.update(hparams=hp, dropped_keys=dropped, new_heads=heads, optimizer=None)
        return model, info
    if method is not None and method not in METHOD_FORMATS:
        raise ValueError(f"the file has the official {det.format} layout; a {method} model can "
                         "start from a backbone-only file or an e2mc checkpoint of its own")
    if det.format in LAYOUT_FORMATS:  # MoCo v3, Barlow Twins, solo-learn, lightly
        return load_layout(det, source, new_heads, method_hparams)
    state, unmapped = det.mapped()
    hp = {**infer_hparams(det.format, state), **method_hparams}
    model = load_strict(lambda: _rebuild(name, hp), state, det.format, det.to_file_key,
                        unmapped)
    info["hparams"] = model.hparams
    return model, info  # type: ignore[return-value]


class NewHeadsRequiredError(ValueError):
    """A backbone-only file would start a method with random heads, which was not asked for."""


def _load_backbone_into_method(det: Any, name: str, method_hparams: dict[str, Any],
                               new_heads: bool, source: str | None
                               ) -> tuple[SSLMethod, list[str], dict[str, Any], list[str]]:
    hp = {**(infer_resnet(det.state_dict) or {}), **method_hparams}
    arch = hp.get("backbone", "resnet50")
    classifier = classifier_keys(arch) if isinstance(arch, str) else frozenset()
    dropped = sorted(k for k in det.state_dict if k in classifier)
    sd = {k: v for k, v in det.state_dict.items() if k not in dropped}
    model = _rebuild(name, hp)
    heads = sorted(n for n, m in model.named_children()
                   if n not in ("backbone", "teacher") and any(True for _ in m.parameters()))
    if not new_heads:
        raise NewHeadsRequiredError(
            f"{source or 'the checkpoint'} holds only a {arch} backbone, no {name} "
            f"{'/'.join(heads) or 'heads'}: continuing would start them from random weights. "
            "Pass --new-heads (init.new_heads: true; new_heads=True in Python) if that is what "
            "you want, or start from a checkpoint that has them")
    check_keys(model.backbone.state_dict(), sd, f"backbone only ({arch})",
               lambda k: det.prefix + k)
    model.backbone.load_state_dict(sd, strict=True)
    return model, dropped, model.hparams, heads


def restore_optimizer_state(optimizer: torch.optim.Optimizer, method: nn.Module,
                            state: dict[str, Any]) -> int:
    """Apply an official optimizer state (VICReg LARS, SwAV LARC/SGD, SimSiam SGD) to
    ``optimizer``, which :meth:`SSLMethod.build_optimizer` made: the per-parameter buffers
    (momentum) are restored, the optimizer's own hyperparameters (lr, wd) are kept.

    The official runs listed their parameters in the model's ``parameters()`` order (SimSiam:
    encoder group then predictor group), which the method classes reproduce, so the ``k``-th saved
    parameter is ``list(method.parameters())[k]``. Momentum buffers are renamed between LARS's
    ``mu`` and SGD's ``momentum_buffer`` as needed. Returns the number of parameters restored.
    """
    method = _unwrap(method)
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


def save_checkpoint(path: str | os.PathLike[str], method: SSLMethod, **extra: Any) -> None:
    """Write the project format atomically: ``{"format": "e2mc", "version": 1, "method",
    "hparams", "model", **extra}`` (see ``docs/checkpoints.md``)."""
    method = _unwrap(method)  # type: ignore[assignment]
    clash = sorted(set(extra) & set(_RESERVED))
    if clash:
        raise ValueError(f"extra keys {clash} are reserved by the checkpoint format")
    obj = {"format": PROJECT_FORMAT, "version": PROJECT_VERSION, "method": method.name,
           "hparams": dict(method.hparams), "model": method.state_dict(), **extra}
    atomic_save(obj, path)


def _from_project(obj: dict[str, Any], source: str | None) -> tuple[SSLMethod, dict[str, Any]]:
    if obj.get("version") != PROJECT_VERSION:
        raise ValueError(f"e2mc checkpoint version {obj.get('version')!r} is not supported "
                         f"(expected {PROJECT_VERSION})")
    name, hp = obj["method"], obj["hparams"]
    model = load_strict(lambda: _rebuild(name, hp), obj["model"], f"e2mc ({name})")
    info = {k: v for k, v in obj.items() if k != "model"}
    info["source"] = source
    return model, info  # type: ignore[return-value]


def load_checkpoint(path: PathOrState, trust: bool = False) -> tuple[SSLMethod, dict[str, Any]]:
    """Load a project checkpoint (method rebuilt from its ``hparams``, strict); an official file
    is passed to :func:`load_official`. ``info`` is everything in the file except ``model``."""
    obj, source = _load_obj(path, trust)
    if isinstance(obj, dict) and obj.get("format") == PROJECT_FORMAT:
        return _from_project(obj, source)
    return _official(obj, source, None, False, {})


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
    obj, source, local = _load_file(path, trust)
    if isinstance(obj, dict) and obj.get("format") == PROJECT_FORMAT:
        if obj.get("method") != method:
            raise ValueError(f"{source or 'the checkpoint'} holds a {obj.get('method')!r} model; "
                             f"this run trains {method!r}")
        model = load_strict(lambda: _rebuild(method, method_hparams), obj["model"],
                            f"e2mc ({method})")
        info = {k: v for k, v in obj.items() if k != "model"}
        info.update(source=source, optimizer_layout="project")
        return model, info  # type: ignore[return-value]
    exported = read_sidecar(local, obj)
    bare = _bare_backbone(obj)
    if exported is not None:  # export-backbone's file: its sidecar names the architecture
        hparams = {**_exported_hparams(exported, method_hparams, source or str(local)),
                   **method_hparams}
        model, info = _start_from_backbone(bare, method, hparams, new_heads,  # type: ignore[arg-type]
                                           source)
        info["exported"] = exported
    elif bare is not None and not _known_layout(bare):
        # a backbone's bare state dict whose names are like a method's (a torchvision ViT's
        # encoder.*): the run's configuration names its architecture
        model, info = _start_from_backbone(bare, method, dict(method_hparams), new_heads,
                                           source)
    else:
        model, info = _official(obj, source, method, new_heads, method_hparams)
    info.update(optimizer_layout="official")
    return model, info


def check_exported_start(path: str | os.PathLike[str], **method_hparams: Any) -> None:
    """Refuse (``ValueError``, one line naming both) to start a run configured with
    ``method_hparams`` (``backbone``, ``small_images``, ``in_channels``) from a backbone that
    :func:`export_backbone` wrote with another architecture, as :func:`load_start_model`
    would, but from the sidecar alone: before the data or the checkpoint are read. Anything
    but a local file with a sidecar passes."""
    if is_url(path) or not Path(path).is_file():
        return
    exported = read_sidecar(path)
    if exported is not None:
        _exported_hparams(exported, method_hparams, os.fspath(path))


def _start_from_backbone(det: Detected, method: str, method_hparams: dict[str, Any],
                         new_heads: bool, source: str | None
                         ) -> tuple[SSLMethod, dict[str, Any]]:
    """The method ``method`` around the backbone-only state dict ``det`` (new heads), as
    :func:`load_official` starts from a backbone-only file."""
    model, dropped, hp, heads = _load_backbone_into_method(det, method, method_hparams,
                                                           new_heads, source)
    return model, {"format": "backbone", "epoch": None, "optimizer": None, "source": source,
                   "hparams": hp, "dropped_keys": dropped, "new_heads": heads}


def _exported_hparams(exported: dict[str, Any], method_hparams: dict[str, Any],
                      where: str) -> dict[str, Any]:
    """The architecture an export's sidecar records (``backbone``, ``small_images``,
    ``in_channels``), refused (one line naming both) where the run configures another."""
    recorded = {"backbone": exported["arch"],
                "small_images": bool(exported.get("small_images", False)),
                "in_channels": int(exported.get("in_channels", 3))}
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
    if sa == sb == "timm":
        ma, mb = ma.split(".", 1)[0], mb.split(".", 1)[0]
    return (sa, ma) == (sb, mb)


def _known_layout(bare: Detected) -> bool:
    """Whether :func:`detect` tells the layout of a plain state dict (an official method's or
    a backbone's names), rather than refusing it as ambiguous."""
    try:
        detect(bare.state_dict)
    except ValueError:
        return False
    return True


def _bare_backbone(obj: Any) -> Detected | None:
    """``obj`` as the backbone-only layout when it is a plain state dict (a ``module.``
    prefix on every key dropped), else None."""
    if not (isinstance(obj, dict) and obj and all(isinstance(k, str) and isinstance(
            v, torch.Tensor) for k, v in obj.items())):
        return None
    prefix = "module." if all(k.startswith("module.") for k in obj) else ""
    return Detected("backbone", {k[len(prefix):]: v for k, v in obj.items()}, prefix)


def checkpoint_of(path_or_run_dir: str | os.PathLike[str], last: bool = False) -> str:
    """A checkpoint file, a URL, a shipped checkpoint (``builtin:NAME``) or a training run
    directory's model (:func:`e2mc.artifacts.run_model`: its kept ``best.pt`` when keep-best
    wrote one, else or with ``last`` its latest checkpoint): what the subcommands accept."""
    from e2mc.artifacts import run_model

    model = None if is_url(path_or_run_dir) else run_model(path_or_run_dir, last)
    if model is None or model.path == Path(path_or_run_dir):  # a URL, or the file itself
        return os.fspath(path_or_run_dir)
    return str(model.path)


def local_checkpoint(ref: str | os.PathLike[str], last: bool = False) -> str:
    """The local file ``ref`` stands for: a URL fetched into torch.hub's cache
    (:func:`e2mc.checkpoints.remote.fetch`), a run directory's model (:func:`checkpoint_of`),
    else ``ref`` itself (for callers that read the file's bytes, such as the feature cache's
    key)."""
    return str(fetch(str(ref))) if is_url(ref) else checkpoint_of(ref, last)


def sidecar_path(path: str | os.PathLike[str]) -> Path:
    """Where :func:`export_backbone` writes the architecture of ``path``: ``<path>.json``."""
    return Path(f"{os.fspath(path)}.json")


#: The ``format`` of :func:`export_backbone`'s sidecar.
EXPORT_FORMAT = "e2mc-backbone"


def read_sidecar(path: str | os.PathLike[str] | None, obj: Any = None) -> dict[str, Any] | None:
    """What :func:`export_backbone` recorded beside the file ``path`` (``<path>.json``: the
    architecture, ``small_images``, ``in_channels``, the training image size, the file's
    ``sha256``), or None when there is no sidecar, when it names no architecture (the export
    of a module of the user's own), or when the loaded ``obj`` given is not a plain state dict
    (an export is one; any other file's ``.json`` is not a sidecar). A sidecar that cannot be
    read, or that records the SHA-256 of other bytes (the file was replaced after the export),
    is a ``ValueError`` saying so."""
    if path is None or (obj is not None and _bare_backbone(obj) is None):
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


#: At most this many values (numbers, strings) per entry of :func:`checkpoint_summary`.
SUMMARY_MAX_VALUES = 256


def _plain_values(value: Any) -> tuple[Any, int] | None:
    """``(value as dicts, lists and scalars, number of values)``; None when it holds a tensor.
    Objects of other types become their ``repr``."""
    if isinstance(value, torch.Tensor):
        return None
    if isinstance(value, dict):
        out, count = {}, 0
        for k, v in value.items():
            plain = _plain_values(v)
            if plain is None:
                return None
            out[str(k)], n = plain
            count += n
        return out, count
    if isinstance(value, (list, tuple)):
        items = [_plain_values(v) for v in value]
        if any(item is None for item in items):
            return None
        return [item[0] for item in items], sum(item[1] for item in items)  # type: ignore[index]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value, 1
    return repr(value), 1


def checkpoint_summary(info: dict[str, Any], local_file: str | os.PathLike[str] | None = None
                       ) -> dict[str, Any]:
    """What identifies a loaded checkpoint, small enough to record with a result (the
    ``checkpoint_info`` of ``results.json``): the entries of a loader's ``info`` that hold no
    tensor and at most :data:`SUMMARY_MAX_VALUES` values (the optimizer state, generator states
    and state dicts of a training checkpoint are left out and named under ``omitted``), and the
    ``sha256`` of the file read."""
    out: dict[str, Any] = {}
    omitted = []
    for key, value in info.items():
        plain = _plain_values(value)
        if plain is None or plain[1] > SUMMARY_MAX_VALUES:
            omitted.append(str(key))
        else:
            out[str(key)] = plain[0]
    if omitted:
        out["omitted"] = sorted(omitted)
    if local_file is not None:
        out["sha256"] = sha256_file(local_file)
    return out


def recorded_image_size(info: dict[str, Any]) -> int | None:
    """The image size the model of a loaded checkpoint was trained at, from the configuration a
    project checkpoint records (``run_config``) or the sidecar of an exported backbone
    (``image_size``, :func:`load_backbone`'s info); ``None`` for official and plain files."""
    size = ((info.get("run_config") or {}).get("data") or {}).get("image_size")
    if size is None and info.get("format") == "backbone":
        size = info.get("image_size")
    return int(size) if isinstance(size, int) and not isinstance(size, bool) and size > 0 \
        else None


def load_backbone(path: PathOrState, arch: str | None = None, small_images: bool = False,
                  in_channels: int = 3, trust: bool = False
                  ) -> tuple[nn.Module, int, dict[str, Any]]:
    """``(backbone, feature_dim, info)`` from a project checkpoint, an official one, or a plain
    backbone state dict (exported, torchvision; a classifier is dropped). For a plain state dict
    the architecture comes from ``arch`` (with ``small_images``, ``in_channels``), else the
    ``<path>.json`` sidecar of :func:`export_backbone` (:func:`read_sidecar`; its
    ``image_size`` is in ``info``), else the ResNet read off the shapes. With ``arch`` or a
    sidecar, a plain state dict is the backbone's even where its names look like a method's
    (a torchvision ViT's ``encoder.*``).
    ``info`` is :func:`checkpoint_summary`'s: metadata without tensors, with the file's
    ``sha256`` and its ``source`` (the URL for a URL)."""
    obj, source, local = _load_file(path, trust)
    if isinstance(obj, dict) and obj.get("format") == PROJECT_FORMAT:
        method, info = _from_project(obj, source)
        return method.backbone, method.feature_dim, checkpoint_summary(info, local)
    exported = None if arch is not None else read_sidecar(local, obj)
    bare = _bare_backbone(obj)
    if exported is not None:  # export-backbone's file, whatever its names look like
        det: Detected = bare  # type: ignore[assignment]
    elif bare is not None and arch is not None and not _known_layout(bare):
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
        method, info = _official(obj, source, None, False, {})
        return method.backbone, method.feature_dim, checkpoint_summary(info, local)
    spec: dict[str, Any] | None = None
    if arch is not None:
        spec = {"backbone": arch, "small_images": small_images, "in_channels": in_channels}
    elif exported is not None:
        spec = {"backbone": exported["arch"],
                "small_images": bool(exported.get("small_images", False)),
                "in_channels": int(exported.get("in_channels", 3))}
    if spec is None:
        spec = infer_resnet(det.state_dict)
    if spec is None:
        raise ValueError("cannot tell the architecture of this backbone state dict: pass arch= "
                         "(CLI --arch), or keep the <file>.json written by export-backbone")
    classifier = classifier_keys(spec["backbone"])
    dropped = sorted(k for k in det.state_dict if k in classifier)
    sd = {k: v for k, v in det.state_dict.items() if k not in dropped}
    dims: list[int] = []

    def build() -> nn.Module:
        with weights_from_checkpoint():
            module, dim = build_backbone(spec["backbone"], spec["small_images"],
                                         spec["in_channels"])
        dims.append(dim)
        return module

    backbone = load_strict(build, sd, f"backbone ({spec['backbone']})", lambda k: det.prefix + k)
    feature_dim = dims[-1]
    info = {"format": "backbone", "arch": spec["backbone"], "small_images": spec["small_images"],
            "in_channels": spec["in_channels"], "dropped_keys": dropped, "source": source}
    if exported is not None:
        info.update(exported={k: v for k, v in exported.items() if k != "arch"},
                    image_size=exported.get("image_size"))
    return backbone, feature_dim, checkpoint_summary(info, local)


def _same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one does not exist
        return Path(a).resolve() == Path(b).resolve()


def _check_export_target(checkpoint: PathOrState | None, out_path: str | os.PathLike[str]
                         ) -> None:
    """Refuse an export that would overwrite its input or another checkpoint (see
    :func:`export_backbone`)."""
    out = Path(out_path)
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
    if isinstance(existing, dict) and all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                          for k, v in existing.items()):
        return  # a plain state dict (an earlier export): replaced
    if isinstance(existing, dict) and existing.get("format") == PROJECT_FORMAT:
        step = f", step {existing['step']}" if "step" in existing else ""
        what = f"an e2mc checkpoint ({existing.get('method')}{step})"
    else:
        what = "a checkpoint with more than a plain state dict"
    raise ValueError(f"{out} already exists and is {what}, not an exported backbone: "
                     "export-backbone does not overwrite it; give another output path or "
                     "delete the file first")


def teacher_backbone(method: nn.Module) -> nn.Module:
    """The EMA teacher's backbone of ``method`` (DINO's teacher, BYOL's target, MoCo v3's
    momentum encoder); ``ValueError`` for a method without one, or whose teacher was never set
    (a model started with new heads: its teacher becomes a copy of the student at the first
    training step)."""
    method = _unwrap(method)
    teacher = getattr(method, "teacher", None)
    if not isinstance(teacher, nn.ModuleDict) or "backbone" not in teacher:
        raise ValueError(f"a {getattr(method, 'name', type(method).__name__)} model has no "
                         "teacher (EMA target): --teacher is for dino, byol and mocov3")
    if not bool(getattr(method, "teacher_initialized", True)):
        raise ValueError("this model's teacher was never set (it was started with new heads and "
                         "not trained: the teacher becomes a copy of the student at the first "
                         "step); export the student's backbone")
    return teacher["backbone"]


def export_backbone(method_or_checkpoint: SSLMethod | PathOrState, out_path: str | os.PathLike[str],
                    trust: bool = False, last: bool = False,
                    teacher: bool = False) -> dict[str, Any]:
    """Write the backbone's plain state dict to ``out_path`` (atomically) and its architecture to
    ``<out_path>.json``; returns that description.

    The names are torchvision's without the classifier: ``torchvision.models.<arch>()`` with
    ``fc = nn.Identity()`` (ResNets; for the others the classifier is replaced as
    :func:`e2mc.models.build_backbone` does) loads it with ``strict=True``. With
    ``small_images`` or ``in_channels != 3`` it loads into ``build_backbone``'s model. The
    sidecar (:func:`read_sidecar`) also records the image size the checkpoint was trained at
    and the SHA-256 of ``out_path``: :func:`load_backbone` and :func:`load_start_model` read
    every architecture back through it.

    Refused (``ValueError``, nothing written): an ``out_path`` (or its ``.json``) that is the
    checkpoint being read, and an existing ``out_path`` that holds more than a plain state dict
    (a training, e2mc or official checkpoint); an earlier export is replaced. A run directory
    stands for its model (:func:`checkpoint_of`; ``last``: its last step), and the sidecar
    records under ``model`` which file and step that was and whether it was the kept model.
    ``teacher``: the EMA teacher's backbone (:func:`teacher_backbone`) instead of the
    student's, recorded as ``"part": "teacher"``.
    """
    from e2mc.artifacts import run_model

    model = None
    if isinstance(method_or_checkpoint, nn.Module):
        _check_export_target(None, out_path)
        method = _unwrap(method_or_checkpoint)
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
