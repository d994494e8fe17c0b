"""Loading a configuration: a preset or YAML file with its ``base:`` chain merged and
``key.sub=value`` overrides set (OmegaConf), after :func:`_prepared` has done what OmegaConf
does not (comma strings, ``none``, integral ``1e3``, one-line errors, ``???`` refused); and
:func:`config_differences` between two configurations."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
import typing
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from e2mc.config.fields import comma_list, load_yaml_text, number_value
from e2mc.config.schema import RunConfig


def _prepared(data: Any, cls: type, prefix: str = "", missing_ok: bool = False
              ) -> dict[str, Any]:
    """``data`` as OmegaConf can merge it into ``cls``: what OmegaConf does not convert itself
    (a comma string for a list, ``none`` for null, a YAML mapping as text, null ``params``)."""
    if not isinstance(data, Mapping):
        raise ValueError(f"config section {prefix.rstrip('.') or '<root>'!r} must be a mapping")
    hints, out = typing.get_type_hints(cls), {}
    for key, value in data.items():
        full, tp = f"{prefix}{key}", hints.get(key)
        if tp is None:
            raise ValueError(_unknown(full, hints))
        args, origin = typing.get_args(tp), typing.get_origin(tp)
        if not missing_ok:
            _refuse_missing(full, value)
        if dataclasses.is_dataclass(tp):
            value = _prepared(value, tp, f"{full}.", missing_ok)
        elif isinstance(value, str) and value.lower() in ("null", "none", "~") \
                and type(None) in args:
            value = None
        elif origin is list and (value is None or isinstance(value, str)):
            value = [] if value is None else load_yaml_text(value, f"config key {full!r}") \
                if value.strip().startswith("[") else comma_list(value)
        elif (tp is int or int in args) and isinstance(value, (str, float)):
            value = number_value(full, value, int)  # OmegaConf refuses "1e3" and 3.0
        elif tp is bool and str(value).strip().lower() not in ("true", "yes", "on", "1",
                                                               "false", "no", "off", "0"):
            raise ValueError(f"config key {full!r} expects a boolean, got {value!r}")
        elif origin is list and isinstance(value, Mapping):
            raise ValueError(f"config key {full!r} expects a list, got {value!r}")
        elif origin is dict:
            value = load_yaml_text(value, f"config key {full!r}") \
                if isinstance(value, str) else value or {}
        out[key] = value
    return out


def _without_missing(data: Any) -> Any:
    if isinstance(data, Mapping):
        return {k: _without_missing(v) for k, v in data.items()
                if not (isinstance(v, str) and v.strip() == "???")}
    return data


def _refuse_missing(key: str, value: Any) -> None:
    """OmegaConf's ``???`` is an error naming the key (OmegaConf would silently keep the
    default in its place)."""
    if isinstance(value, str) and value.strip() == "???":
        raise ValueError(f"config key {key!r} is ??? (a value still to be given): set it in "
                         f"the file or with --set {key}=VALUE")
    if isinstance(value, Mapping) and not dataclasses.is_dataclass(value):
        for k, v in value.items():
            if not isinstance(v, Mapping):
                _refuse_missing(f"{key}.{k}", v)


@functools.cache
def _schema() -> DictConfig:
    """OmegaConf's structured config of :class:`RunConfig`, made once (it is slow; ``merge``
    copies it, so it is never changed)."""
    return OmegaConf.structured(RunConfig)


def _build(data: Mapping[str, Any], missing_ok: bool = False) -> RunConfig:
    """The defaults with ``data`` laid over them (OmegaConf's structured config converts and
    refuses unknown keys); ``missing_ok``: a ``???`` is allowed (one file of a ``base:`` chain)."""
    try:
        prepared = _prepared(data, RunConfig, missing_ok=missing_ok)
        if missing_ok:  # checked for the rest; ??? stays in the data for the final build
            prepared = _without_missing(prepared)
        merged = OmegaConf.merge(_schema(), _literal(prepared))
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:
        raise ValueError(f"config key {err.full_key!r}: {str(err.msg).splitlines()[0]}") from None


def _literal(value: Any) -> Any:
    """``value`` as OmegaConf holds it as given: ``${`` escaped in every string (text, not an
    interpolation; escaping twice changes nothing), a scalar it cannot hold (a YAML date) as
    text."""
    if isinstance(value, Mapping):
        return {k: _literal(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_literal(v) for v in value]
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return re.sub(r"(?<!\\)\$\{", r"\\${", str(value))


def _unknown(full: str, hints: Mapping[str, Any]) -> str:
    section = full.rsplit(".", 1)[0] if "." in full else "the top level"
    return (f"unknown config key {full!r}; valid keys in {section}: "
            f"{', '.join(sorted(hints))}")


def _overridden(data: Mapping[str, Any], assignments: Iterable[str]) -> dict[str, Any]:
    """``data`` with ``key.sub=value`` overrides set (``OmegaConf.update``); a value inside
    ``params`` is read as YAML (:func:`load_yaml_text`); a field's stays text for
    :func:`_prepared`."""
    conf = OmegaConf.create(dict(data))
    for assignment in assignments:
        if "=" not in assignment:
            raise ValueError(f"override {assignment!r} must look like key.sub=value")
        key, raw = (part.strip() for part in assignment.split("=", 1))
        try:
            value = _literal(load_yaml_text(raw, f"--set {key}") if ".params." in key else raw)
            OmegaConf.update(conf, key, value, merge=False)  # a field's text: _prepared
        except OmegaConfBaseException as err:
            raise ValueError(f"--set {key}: {str(err).splitlines()[0]}") from None
    return OmegaConf.to_container(conf)


# ``base: <preset or YAML file>`` (relative to the file naming it), then only what changes
BASE_KEY = "base"


def preset_names() -> list[str]:
    """Names of the presets shipped in ``e2mc/configs``."""
    root = resources.files("e2mc") / "configs"
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".yaml"))


def _locate(ref: str, folder: Path | None,
            preset_only: bool = False) -> tuple[str, Any, Path | None]:
    """``(identity, readable source, folder for its relative bases)`` of a preset or file;
    ``folder`` is None for a shipped preset (whose bases are presets too)."""
    path = Path(ref)
    if folder is not None and not path.is_absolute():
        path = folder / path
    # a folder named like a preset (a run directory) does not hide the preset
    if not preset_only and (path.suffix in (".yaml", ".yml") or path.is_file()):
        if not path.is_file():
            raise ValueError(f"config file {ref!r} does not exist")
        path = path.resolve()
        return str(path), path, path.parent
    resource = resources.files("e2mc") / "configs" / f"{ref}.yaml"
    if not resource.is_file():
        renamed = _renamed(ref)
        if renamed:
            raise ValueError(f"preset {ref!r} was renamed to {renamed!r}")
        names = preset_names()
        close = difflib.get_close_matches(ref, names, n=3)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise ValueError(f"unknown preset {ref!r}; {hint}presets: {', '.join(names)}")
    return ref, resource, None


def _renamed(ref: str) -> str | None:
    """The name a preset of the first naming scheme has now (``fmnist-X-continue`` ->
    ``fmnist-X-continued``, ``fmnist-X-continue-e2mc`` -> ``fmnist-X-e2mc``), or None."""
    match = re.fullmatch(r"fmnist-([a-z0-9]+)-continue(-e2mc)?", ref)
    if match is None:
        return None
    new = f"fmnist-{match[1]}-{'e2mc' if match[2] else 'continued'}"
    return new if new in preset_names() else None


def merge_config(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``override`` laid over ``base`` (``OmegaConf.merge``: mappings merge key by key, anything
    else is replaced). A section whose ``name`` changes (another method or add-on) drops the
    base's ``params``, which belong to the other builder; ``params: null`` clears them."""
    base = {key: {k: v for k, v in section.items() if k != "params"}
            if isinstance(section, Mapping) and isinstance(override.get(key), Mapping)
            and override[key].get("name", section.get("name")) != section.get("name")
            else section for key, section in base.items()}
    merged = OmegaConf.to_container(OmegaConf.merge(base, _swap(override, "???", _MISSING)))
    return _swap(merged, _MISSING, "???")  # (merging ??? would keep the base's value)


_MISSING = "\0e2mc-missing\0"


def _swap(data: Any, old: str, new: str) -> Any:
    """``data`` with every string ``old`` replaced by ``new``, at any depth."""
    if isinstance(data, Mapping):
        return {k: _swap(v, old, new) for k, v in data.items()}
    if isinstance(data, list):
        return [_swap(v, old, new) for v in data]
    return new if isinstance(data, str) and data.strip() == old else data


def _resolve(ref: str, folder: Path | None, chain: tuple[str, ...]) -> dict[str, Any]:
    ident, source, own_folder = _locate(ref, folder, preset_only=bool(chain) and folder is None)
    if ident in chain:
        raise ValueError(f"config inheritance cycle: {' -> '.join((*chain, ident))}")
    data = load_yaml_text(source.read_text(encoding="utf-8"), ident) or {}
    if not isinstance(data, Mapping):
        raise ValueError(f"{ident}: a config file must be a mapping of sections")
    data = _literal(data)
    base = data.pop(BASE_KEY, None)
    try:  # strict per file, so that an unknown key is reported with the file that has it
        _build(data, missing_ok=True)
    except ValueError as err:
        raise ValueError(f"{ident}: {err}") from None
    if base is None:
        return data
    if not isinstance(base, str):
        raise ValueError(f"{ident}: {BASE_KEY!r} must be a preset name or a YAML file, "
                         f"got {base!r}")
    return merge_config(_resolve(base, own_folder, (*chain, ident)), data)


def preset_summary(name: str) -> tuple[str | None, str]:
    """``(base, description)`` of a shipped preset; the description is its first comment line."""
    _, resource, _ = _locate(name, None, preset_only=True)
    text = resource.read_text()
    description = ""
    for line in text.splitlines():
        if line.strip():
            if line.lstrip().startswith("#"):
                description = line.lstrip().lstrip("#").strip()
            break
    base = (load_yaml_text(text, name) or {}).get(BASE_KEY)
    return base, description


def load_config(name_or_path: str | None = None, overrides: Iterable[str] = ()) -> RunConfig:
    """A :class:`RunConfig` of a preset or YAML file (its ``base`` chain), with ``overrides``."""
    data = _resolve(name_or_path, None, ()) if name_or_path is not None else {}
    cfg = _build(_overridden(data, overrides))
    cfg.validate()
    return cfg


def flatten_config(data: Mapping[str, Any], whole_params: bool = False,
                   prefix: str = "") -> dict[str, Any]:
    """``{"training.epochs": 10, ...}``: a nested configuration mapping by dotted key (an empty
    mapping has no keys); with ``whole_params`` a ``params`` section is one value."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        full = f"{prefix}{key}"
        if isinstance(value, Mapping) and not (whole_params and full.endswith("params")):
            out.update(flatten_config(value, whole_params, f"{full}."))
        else:
            out[full] = value
    return out


def config_differences(config: Mapping[str, Any], base: Mapping[str, Any] | None = None,
                       whole_params: bool = False
                       ) -> tuple[str, list[tuple[str, Any, Any]]]:
    """The keys where ``config`` (``RunConfig.to_dict()``) differs from ``base``, as
    ``(base name, [(dotted key, base value, value)])``. Without ``base``: the shipped preset of
    ``config``'s ``name``, else the defaults; a key ``config`` lacks is left out, one the base
    lacks shows ``None``. A given ``base`` counts a key it lacks as its default and compares every
    key of either side. ``whole_params``: compare the ``params`` sections whole."""
    if base is None:
        name = config.get("name")
        if isinstance(name, str) and name in preset_names():
            base_name, base = f"preset {name}", load_config(name).to_dict()
        else:
            base_name, base = "the defaults", RunConfig().to_dict()
        only_config_keys = True
    else:
        base_name, only_config_keys = "the given configuration", False
        base = _typed(base)
    flat, flat_base = flatten_config(config, whole_params), flatten_config(base, whole_params)
    typed = flatten_config(_typed(config), whole_params)  # an older comma string as its list
    flat = {k: typed.get(k, v) for k, v in flat.items()}
    keys = [k for k in dict.fromkeys([*flat_base, *flat]) if k in flat or not only_config_keys]
    return base_name, [(k, flat_base.get(k), flat.get(k)) for k in keys
                       if flat_base.get(k) != flat.get(k)]


def _typed(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """``data`` coerced to its fields' types with defaults (as ``RunConfig.to_dict``), unchanged
    when it has a key this version does not know."""
    try:
        return _build(data).to_dict()
    except ValueError:
        return data
