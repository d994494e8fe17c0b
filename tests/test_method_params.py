"""Every parameter of every method, optimizer preset and add-on is checked at configuration time
against the range its builder declares next to its signature (``param_ranges``,
``optimizer_ranges``; :mod:`e2mc.ranges`).

The cases are made from the tables themselves: a parameter added to a builder without a range
fails :func:`test_every_parameter_has_a_declared_range`, and each declared range is walked with
values just outside it through the real command line (``e2mc config show``, and ``pretrain``,
``continue`` and ``search`` once each): exit 2, one ``error:`` line naming the key, the value
and the range, before anything is built. No training."""

from __future__ import annotations

import inspect
import json
import math
import typing
from pathlib import Path
from typing import Any

import pytest

from e2mc.addons import ADDONS, build_addon
from e2mc.cli import main
from e2mc.config import load_config, preset_names
from e2mc.errors import EXIT_INPUT
from e2mc.methods import METHODS, build_method
from e2mc.methods.base import VIEW_RECIPES
from e2mc.ranges import Bound, Each, IndicesOf, Interval, OneOf, Widths, check_values

#: The backbone's own parameters (``model.*``), and those the trainer fills.
BACKBONE = ("self", "backbone", "small_images", "in_channels")
OPTIMIZER = ("self", "lr", "weight_decay")

#: (section, builder name, builder, declared ranges, parameters the config does not hand it)
TABLES = (
    [("method", n, cls.__init__, cls.param_ranges, BACKBONE) for n, cls in METHODS.items()]
    + [("optim", n, cls.build_optimizer, cls.optimizer_ranges, OPTIMIZER)
       for n, cls in METHODS.items()]
    + [("addon", n, cls.__init__, cls.param_ranges, ("self",)) for n, cls in ADDONS.items()])


def _preset(section: str, name: str) -> list[str]:
    """``config show`` arguments of a preset that uses the method or add-on ``name``."""
    if section == "addon":
        if name == "e2mc":
            return ["fmnist-vicreg-e2mc"]
        return ["fmnist-vicreg-pretrain", "--set", f"addon.name={name}"]
    if name == "generic":  # vicreg's params are generic's too
        return ["fmnist-vicreg-pretrain", "--set", "method.name=generic"]
    return [f"fmnist-{name}-pretrain"]


def _hint(builder: Any, name: str) -> Any:
    return typing.get_type_hints(builder).get(name)


def _integral(builder: Any, name: str) -> bool:
    """Whether the parameter takes integers only (``int``, ``int | None``, ``Sequence[int]``)."""
    hint = _hint(builder, name)
    args = set(typing.get_args(hint)) | {hint}
    for arg in list(args):
        args |= set(typing.get_args(arg))
    return int in args and float not in args


def _declared(builder: Any, skip: tuple[str, ...]) -> set[str]:
    """The builder's parameters that need a range: every named one but ``skip`` and flags."""
    return {n for n, p in inspect.signature(builder).parameters.items()
            if n not in skip and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
            and _hint(builder, n) is not bool}


def _outside(bound: Interval, integral: bool) -> list[Any]:
    """Numbers just outside ``bound`` (and infinity where it has no upper end)."""
    step = 1 if integral else 0.5
    out: list[Any] = []
    if bound.low is not None:
        low = int(bound.low) if integral else float(bound.low)
        out.append(low if bound.low_open else low - step)
    if bound.high is not None:
        high = int(bound.high) if integral else float(bound.high)
        out.append(high if bound.high_open else high + step)
    if not integral and bound.high is None:
        out.append(math.inf)
    return out


def _bad_values(bound: Bound, integral: bool) -> list[Any]:
    if isinstance(bound, Interval):
        return _outside(bound, integral)
    if isinstance(bound, OneOf):
        return ["nonsense"]
    if isinstance(bound, Widths):
        return ["8-0-8", "8-x", "-8"]
    if isinstance(bound, Each):
        length = bound.length or 1
        bad = [[v] * length for v in _outside(bound.item, integral) if math.isfinite(v)]
        if bound.length is None:
            bad.append([])
        if bound.min_sum is not None:
            bad.append([int(bound.min_sum) - 1] if integral else [bound.min_sum - 0.5])
        return bad
    if isinstance(bound, IndicesOf):
        return [[0, 0], [-1], [0, 99], []]
    raise AssertionError(f"no bad values for {type(bound).__name__}: add them to this test")


CASES = [pytest.param(section, name, param, value, id=f"{section}-{name}-{param}={value}")
         for section, name, builder, ranges, _ in TABLES
         for param, bound in ranges.items()
         for value in _bad_values(bound, _integral(builder, param))]


def _error_line(err: str, command: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"e2mc {command}: error: "), err
    return lines[0]


def _yaml(value: Any) -> str:
    return ".inf" if value == math.inf else json.dumps(value)


def _assert_names_the_range(line: str, key: str, value: Any, bound: Bound) -> None:
    assert key in line, line
    assert repr(value) in line, line
    if isinstance(bound, OneOf):  # a Literal type says its choices in its own words
        assert all(repr(choice) in line for choice in bound.choices), line
    elif isinstance(bound, IndicesOf):
        assert "distinct indices in [0, " in line, line
    else:
        assert bound.text in line, line


def test_every_parameter_has_a_declared_range():
    """A parameter without a range (or a range of no parameter) is a failure here; flags and
    the backbone's own parameters need none."""
    for section, name, builder, ranges, skip in TABLES:
        declared = _declared(builder, skip)
        takes_kwargs = any(p.kind is p.VAR_KEYWORD
                           for p in inspect.signature(builder).parameters.values())
        assert set(ranges) == declared, (
            f"{section} {name}: parameters without a range {sorted(declared - set(ranges))}, "
            f"ranges of no parameter {sorted(set(ranges) - declared)}"
            + (" (**kwargs: name its options in the signature)" if takes_kwargs else ""))
    assert CASES and len({c.values[:3] for c in CASES}) >= sum(len(t[3]) for t in TABLES)


@pytest.mark.parametrize(("section", "name", "param", "value"), CASES)
def test_a_value_outside_its_range_is_refused_by_config_show(capsys, section, name, param,
                                                             value):
    key = f"{section}.params.{param}"
    code = main(["config", "show", *_preset(section, name), "--set", f"{key}={_yaml(value)}"])
    assert code == EXIT_INPUT
    bound = {(s, n): t for s, n, _, t, _ in TABLES}[section, name][param]
    _assert_names_the_range(_error_line(capsys.readouterr().err, "config"), key, value, bound)


def test_the_issue_examples(capsys):
    """The values that trained to nonsense (exit 0) or reached torch (exit 1)."""
    for preset, override, shown in [
            ("fmnist-dino-pretrain", "method.params.out_dim=0", "must be >= 2, got 0"),
            ("fmnist-dino-pretrain", "method.params.out_dim=1", "must be >= 2, got 1"),
            ("fmnist-dino-pretrain", "method.params.bottleneck_dim=0", "must be >= 1, got 0"),
            ("fmnist-dino-pretrain", "method.params.center_momentum=2",
             "must be in [0, 1], got 2"),
            ("fmnist-dino-pretrain", "method.params.hidden_dim=-5", "must be >= 1, got -5"),
            ("fmnist-simclr-pretrain", "method.params.dim=0", "must be >= 1, got 0"),
            ("fmnist-simclr-pretrain", "method.params.hidden_dim=0", "must be >= 1, got 0"),
            ("fmnist-mocov3-pretrain", "method.params.dim=0", "must be >= 1, got 0"),
            ("fmnist-mocov3-pretrain", "method.params.mlp_dim=0", "must be >= 1, got 0"),
            ("fmnist-byol-pretrain", "method.params.dim=0", "must be >= 1, got 0"),
            ("fmnist-byol-pretrain", "method.params.hidden_dim=0", "must be >= 1, got 0"),
            ("fmnist-barlowtwins-pretrain", "method.params.lambd=-1", "must be >= 0, got -1"),
            ("fmnist-swav-pretrain", "method.params.n_prototypes=1", "must be >= 2, got 1"),
            ("fmnist-swav-pretrain", "method.params.crops_for_assign=[0,2]",
             "must be a non-empty list of distinct indices in [0, 2) (sum(n_crops) = 2), "
             "got [0, 2]"),
            ("fmnist-vicreg-pretrain", "method.params.projector=512-0-512",
             "must be layer widths >= 1"),
            ("fmnist-vicreg-pretrain", "optim.params.momentum=1", "must be in [0, 1), got 1"),
            ("fmnist-vicreg-e2mc", "addon.params.eps=0", "must be > 0, got 0"),
            ("fmnist-dino-pretrain", "method.params.teacher_temp=.inf",
             "must be a finite number > 0, got inf"),
            ("fmnist-dino-pretrain", "method.params.student_temp=nan",
             "must be a finite number > 0, got nan")]:
        assert main(["config", "show", preset, "--set", override]) == EXIT_INPUT, override
        line = _error_line(capsys.readouterr().err, "config")
        key = override.split("=")[0]
        assert f"error: {key} {shown}" in line, line


def test_unknown_optimizer_options_are_refused_at_config_time(capsys):
    """The table names every option, so a builder's ``**kwargs`` (VICReg's, SwAV's, SimSiam's
    catch-all that refuses) no longer lets a misspelt name through to the optimizer."""
    for preset in ("fmnist-vicreg-pretrain", "fmnist-swav-pretrain", "fmnist-simsiam-pretrain"):
        assert main(["config", "show", preset, "--set", "optim.params.momentun=0.5"]) == 2
        assert "unknown config key optim.params.momentun" in _error_line(
            capsys.readouterr().err, "config")


def test_pretrain_and_continue_refuse_before_anything_is_built(tmp_path: Path, capsys):
    run = tmp_path / "run"
    code = main(["pretrain", "--config", "fmnist-dino-pretrain", "--data", "builtin",
                 "--out", str(run), "--set", "method.params.out_dim=0"])
    assert code == EXIT_INPUT
    line = _error_line(capsys.readouterr().err, "pretrain")
    assert "method.params.out_dim must be >= 2, got 0" in line
    assert not run.exists()
    code = main(["continue", "--config", "fmnist-mocov3-continued", "--data", "builtin",
                 "--from", str(tmp_path / "no-such-checkpoint.pt"), "--out", str(run),
                 "--set", "method.params.momentum=1.5"])
    assert code == EXIT_INPUT
    line = _error_line(capsys.readouterr().err, "continue")
    assert "method.params.momentum must be in [0, 1], got 1.5" in line
    assert not run.exists()


def test_search_refuses_before_anything_is_built(tmp_path: Path, capsys):
    out = tmp_path / "search"
    code = main(["search", "--config", "fmnist-vicreg-e2mc", "--from",
                 "builtin:demo-vicreg", "--data", "builtin", "--out", str(out), "--metric",
                 "val/knn", "--grid", "addon.params.beta=1", "--set", "addon.params.gamma=-1"])
    assert code == EXIT_INPUT
    assert "addon.params.gamma must be >= 0, got -1" in _error_line(capsys.readouterr().err,
                                                                     "search")
    assert not out.exists()


def test_every_preset_and_every_default_is_in_range():
    for name in preset_names():
        load_config(name)  # validates every params section against its ranges
    for section, name, builder, ranges, _ in TABLES:
        defaults = {n: p.default for n, p in inspect.signature(builder).parameters.items()
                    if p.default is not p.empty}
        check_values(ranges, defaults, prefix=f"{section} {name} default ")


def test_the_builders_check_their_own_arguments():
    """``build_method`` / ``build_addon`` (the Python API, a checkpoint's ``hparams``) apply the
    same tables."""
    with pytest.raises(ValueError, match=r"^out_dim must be >= 2, got 0$"):
        build_method("dino", backbone="cnn5_small", in_channels=1, out_dim=0)
    with pytest.raises(ValueError, match=r"^momentum must be in \[0, 1\], got 2$"):
        build_method("byol", backbone="cnn5_small", in_channels=1, momentum=2)
    with pytest.raises(ValueError, match=r"^hidden_dim must be >= 1, got 0$"):
        build_method("simclr", backbone="cnn5_small", in_channels=1, hidden_dim=0)
    with pytest.raises(ValueError, match=r"^eps must be > 0, got 0$"):
        build_addon("e2mc", eps=0)
    method = build_method("vicreg", backbone="cnn5_small", in_channels=1, projector="8-8")
    with pytest.raises(ValueError, match=r"^momentum must be in \[0, 1\), got 1\.0$"):
        method.build_optimizer(lr=0.1, weight_decay=0.0, momentum=1.0)


def test_method_md_lists_every_range():
    """docs/method.md's "Parameter ranges" table is the tables' own text, row for row."""
    def row(section: str, name: str, ranges: dict[str, Bound]) -> str:
        cells = "; ".join(f"`{p}` {b.text}" for p, b in ranges.items()) or "–"
        return f"| `{section}.params` | `{name}` | {cells} |"

    expected = [row(section, name, ranges) for section, name, _, ranges, _ in TABLES]
    page = (Path(__file__).resolve().parents[1] / "docs" / "method.md").read_text()
    head = "| section | name | ranges |\n|---|---|---|\n"
    assert head in page
    rows = page.split(head, 1)[1].split("\n\n", 1)[0].splitlines()
    assert rows == expected, "docs/method.md#parameter-ranges should read:\n" + "\n".join(
        expected)


def test_view_recipe_choices_are_the_data_recipes():
    from e2mc.data.views import RECIPES

    assert tuple(VIEW_RECIPES) == tuple(RECIPES)
    assert {cls.view_recipe for cls in METHODS.values()} <= set(VIEW_RECIPES)
