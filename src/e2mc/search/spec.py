"""What a search is: its trials (a grid or a file), the declared selection rule, the identity
a search directory must match to be resumed, and the rule itself (:func:`select`)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from e2mc.config import comma_list

RULE = ("largest paired validation difference (trial minus its control) in {metric} at the "
        "last step, if positive; otherwise none")
CONTROL_ADDON = "none"
#: Differences within this many points of the largest tie (the earliest trial wins): float32
#: rounding (about 1e-5 points) must not pick between trials that scored the same images.
TIE_POINTS = 1e-4


@dataclass
class Trial:
    """One setting: its name and the config overrides it adds to the search's own."""

    name: str
    overrides: list[str]

    @property
    def control_overrides(self) -> list[str]:
        """The overrides of its control: those that do not configure the add-on."""
        return [o for o in self.overrides if not o.split("=", 1)[0].startswith("addon.")]


def grid_trials(grid: Sequence[str]) -> list[Trial]:
    """``["a=1,2", "b=3,4"]`` -> the 4 trials of the product (first key slowest)."""
    axes: list[list[str]] = []
    for item in grid:
        if "=" not in item:
            raise ValueError(f"--grid {item!r} must look like key=value1,value2,...")
        key, values = item.split("=", 1)
        choices = comma_list(values)
        if not choices:
            raise ValueError(f"--grid {item!r} lists no values")
        axes.append([f"{key.strip()}={v}" for v in choices])
    return [Trial(" ".join(point), list(point)) for point in itertools.product(*axes)]


def file_trials(path: str | Path) -> list[Trial]:
    """Trials from a YAML file: a list of mappings ``{name: ..., set: {key: value, ...}}`` (or
    a plain mapping of overrides), or ``{grid: {key: [values]}}``."""
    from e2mc.config import read_yaml

    path = Path(path)
    try:
        data = read_yaml(path)  # duplicate keys, recursive aliases and alias bombs refused
    except OSError as err:
        raise ValueError(f"cannot read the trials file {path}: {err}") from err
    if isinstance(data, dict) and isinstance(data.get("grid"), dict):
        return grid_trials([f"{k}={','.join(str(v) for v in vs)}"
                            for k, vs in data["grid"].items()])
    if not isinstance(data, list) or not data:
        raise ValueError(f"{path}: expected a list of trials or a 'grid:' mapping")
    trials = []
    for i, item in enumerate(data):
        if not isinstance(item, dict):
            raise ValueError(f"{path}: trial {i} is not a mapping")
        sets = item.get("set", {k: v for k, v in item.items() if k != "name"})
        overrides = [f"{k}={_yaml_value(v)}" for k, v in sets.items()]
        trials.append(Trial(str(item.get("name", " ".join(overrides))), overrides))
    return trials


def _yaml_value(value: Any) -> str:
    """A value of a trials file as the text of a ``key=value`` override."""
    if isinstance(value, dict | list):
        return json.dumps(value)  # JSON is YAML: the override parser reads it back
    return str(value)


def run_dir_name(label: str, overrides: Sequence[str]) -> str:
    """A directory name injective in ``overrides``: a readable slug of ``label`` and a short
    hash of the overrides (:func:`~e2mc.artifacts.slug_dir_name`)."""
    from e2mc.artifacts import slug_dir_name

    return slug_dir_name(label, json.dumps(list(overrides)), "default")


@dataclass
class SearchSpec:
    """What a search is: everything that must match for a search directory to be resumed."""

    config: str
    checkpoint: str
    checkpoint_sha256: str
    data: str
    val_split: float
    seed: int
    metric: str
    common: list[str]
    trials: list[Trial]
    #: the content identity of the training images (:func:`e2mc.data.identity.data_identity`)
    data_identity: dict[str, Any] | None = None
    rule: str = field(init=False)

    def __post_init__(self) -> None:
        self.rule = RULE.format(metric=self.metric)

    def identity(self) -> dict[str, Any]:
        """What a search directory records and must match: all but the path and the trials."""
        return {k: v for k, v in asdict(self).items() if k not in ("checkpoint", "trials")}


def make_spec(config: str, checkpoint: str, data: str, val_split: float, seed: int,
              metric: str, common: Sequence[str], trials: list[Trial]) -> SearchSpec:
    """The spec of ``e2mc search``'s arguments: the starting ``checkpoint`` (a file or
    ``builtin:NAME``) resolved and hashed, ``metric`` resolved against the config's monitor."""
    from e2mc.artifacts import builtin_checkpoint
    from e2mc.config import load_config, resolve_metric
    from e2mc.files import sha256_file

    path = builtin_checkpoint(checkpoint) or Path(checkpoint)
    if not path.is_file():
        raise ValueError(f"starting checkpoint {path} does not exist or is not a file")
    from e2mc.data.identity import data_identity
    from e2mc.training.build import training_images

    cfg = load_config(config, [*common, f"data.val_split={val_split}", f"data.dataset={data}"])
    from e2mc.checkpoints import check_model_input

    check_model_input(cfg, path)  # before any run
    return SearchSpec(config=config, checkpoint=str(path.resolve()),
                      checkpoint_sha256=sha256_file(path), data=data, val_split=val_split,
                      seed=seed, metric=resolve_metric(metric, cfg.monitor.fractions),
                      common=list(common), trials=trials,
                      data_identity=data_identity(training_images(cfg)[0]))


def select(trials: list[dict[str, Any]]) -> str | None:
    """The declared rule (:data:`RULE`): the largest positive paired difference, else None;
    ties (within :data:`TIE_POINTS`) go to the earliest trial."""
    scored = [t for t in trials if t.get("difference") is not None]
    if not scored:
        return None
    top = max(t["difference"] for t in scored)
    if top <= TIE_POINTS:
        return None
    return next(t["name"] for t in scored if t["difference"] >= top - TIE_POINTS)
