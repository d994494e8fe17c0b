"""Typed run configuration: dataclasses loaded from YAML presets with ``key.sub=value`` overrides.

Every field has a type; values from YAML files and from ``--set`` are converted to it by
OmegaConf's structured config of :class:`RunConfig` (``OmegaConf.merge``,
``OmegaConf.update``), after :func:`~e2mc.config.presets._prepared` has done what OmegaConf
does not (comma strings, ``none``, integral ``1e3``, one-line errors, ``???`` refused), and an
unknown key is a :class:`ValueError` that names it. The ``params`` sections are free-form
keyword arguments handed to the method, add-on or optimizer builder; :meth:`RunConfig.validate`
checks them against those builders' signatures (``e2mc.methods``, ``e2mc.addons``, a layer
below). List fields (``monitor.fractions``, ``monitor.label_seeds``,
``training.preempt_signals``) are typed lists; a YAML list, ``[a, b]`` or the comma string
``a,b`` all give the same list. Their ranges are checked here too (and
:func:`resolve_metric`, :func:`resolve_signals` give their meaning), so that the configuration
imports none of the modules that use it.

Three rooms: :mod:`~e2mc.config.schema` (the dataclasses and their checks),
:mod:`~e2mc.config.fields` (typed parsers: lists, metric and signal names, strict YAML,
``params`` against a signature) and :mod:`~e2mc.config.presets` (presets, ``base:`` chains,
overrides, differences).
"""

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
    merge_config,
    preset_names,
    preset_summary,
)
from e2mc.config.schema import PIPELINES, MonitorConfig, RunConfig

__all__ = [
    "PIPELINES", "MonitorConfig", "RunConfig", "comma_list", "config_differences",
    "flatten_config", "load_config", "load_yaml_text", "merge_config", "metric_names",
    "preset_names", "preset_summary", "read_yaml", "resolve_metric", "resolve_signals",
]
