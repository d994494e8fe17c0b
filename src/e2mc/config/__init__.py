"""Typed run configuration: dataclasses loaded from YAML presets with ``key.sub=value`` overrides.

:mod:`~e2mc.config.schema` (the dataclasses and their checks), :mod:`~e2mc.config.fields` (typed
parsers: lists, metric and signal names, strict YAML, ``params`` against a signature) and
:mod:`~e2mc.config.presets` (presets, ``base:`` chains, overrides, differences). Values are
converted by OmegaConf's structured config of :class:`RunConfig`; an unknown key is a
:class:`ValueError` naming it."""

from e2mc.config.fields import (
    comma_list,
    load_yaml_text,
    metric_names,
    read_yaml,
    resolve_metric,
    resolve_signals,
)
from e2mc.config.presets import (
    config_differences,
    flatten_config,
    load_config,
    preset_names,
    preset_summary,
)
from e2mc.config.schema import PIPELINES, MonitorConfig, RunConfig

__all__ = [
    "PIPELINES", "MonitorConfig", "RunConfig", "comma_list", "config_differences",
    "flatten_config", "load_config", "load_yaml_text", "metric_names", "preset_names",
    "preset_summary", "read_yaml", "resolve_metric", "resolve_signals",
]
