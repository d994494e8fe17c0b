"""Typed run configuration (:class:`RunConfig`): presets and YAML files with their ``base:``
chains and ``key.sub=value`` overrides, converted by OmegaConf's structured config; an unknown
key or a bad value is a one-line :class:`ValueError` naming it."""

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
