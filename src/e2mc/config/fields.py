"""Typed parsers of configuration values, used by the schema, the loader and the commands:
comma lists, metric names (:func:`resolve_metric`), signal names (:func:`resolve_signals`),
YAML read strictly (:func:`load_yaml_text`: duplicate keys and alias bombs refused) and the
free-form ``params`` checked against a builder's signature (:func:`check_params`)."""

from __future__ import annotations

import difflib
import signal
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

#: The monitor's label-free metrics (``e2mc.training.monitor``).
LABEL_FREE = ("val/rankme", "val/entropy")


def comma_list(text: Any, cast: Any = str) -> list[Any]:
    """``"a, b,,c"`` -> ``[cast("a"), cast("b"), cast("c")]`` (stripped, empty ones dropped)."""
    return [cast(item) for item in (t.strip() for t in str(text).split(",")) if item]


def check_distinct(key: str, values: Sequence[Any], valid: Any, what: str) -> None:
    """Refuse an empty list, a repeated value or one that does not pass ``valid``."""
    if not values or not all(valid(v) for v in values) or len(set(values)) != len(values):
        raise ValueError(f"{key} must be a list of distinct {what}, got {list(values)}")


def metric_names(fractions: Sequence[float]) -> list[str]:
    """Every metric the monitor logs, for ``monitor.fractions``."""
    from e2mc.data.subsets import fraction_label

    probes = [f"val/linear_{fraction_label(f)}" for f in fractions]
    return ["val/knn", *probes, *LABEL_FREE]


def resolve_metric(name: str, fractions: Sequence[float]) -> str:
    """The full name of a monitor metric (``knn`` and ``val/knn`` both name ``val/knn``); an
    unknown name is a ``ValueError`` that lists the metrics and the close matches."""
    names = metric_names(fractions)
    full = name if name.startswith("val/") else f"val/{name}"
    if full in names:
        return full
    close = difflib.get_close_matches(full, names, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise ValueError(f"unknown monitor metric {name!r}: the monitor logs {', '.join(names)}"
                     f"{hint}")


def resolve_signals(spec: Sequence[str | signal.Signals] | None) -> tuple[signal.Signals, ...]:
    """``["SIGTERM", "usr1", "10"]`` -> signals (``[]``, ``["none"]``, ``None``: none);
    ``ValueError`` naming an unknown signal or one that cannot be caught."""

    if isinstance(spec, str):
        raise TypeError(f"a list of signal names, not the string {spec!r}")
    names = [s if isinstance(s, signal.Signals) else str(s).strip() for s in spec or ()]
    names = [n for n in names if isinstance(n, signal.Signals) or (n and n.lower() != "none")]
    out = []
    for name in names:
        if isinstance(name, signal.Signals):
            out.append(name)
            continue
        try:
            sig = signal.Signals(int(name)) if name.isdigit() else signal.Signals[
                name.upper() if name.upper().startswith("SIG") else "SIG" + name.upper()]
        except (KeyError, ValueError):
            raise ValueError(f"unknown signal {name!r} in training.preempt_signals "
                             f"(e.g. SIGTERM,SIGUSR1)") from None
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            raise ValueError(f"{sig.name} cannot be caught; use e.g. SIGTERM or SIGUSR1")
        out.append(sig)
    return tuple(dict.fromkeys(out))


#: The most nodes a YAML text may stand for with its aliases expanded (refuses alias bombs).
YAML_MAX_NODES = 100_000


class _DuplicateKeyError(yaml.YAMLError):
    def __init__(self, key: Any, first: yaml.Mark, again: yaml.Mark) -> None:
        super().__init__(f"duplicate key {key!r} at line {again.line + 1} (first given at line "
                         f"{first.line + 1}); a mapping names each key once")


class _StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` refusing a key given twice in one mapping (``<<`` may be overridden)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark)
            except TypeError:  # an unhashable key: SafeLoader's own error follows
                continue
            if first is not key_node.start_mark:
                raise _DuplicateKeyError(key, first, key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def _check_expansion(root: yaml.Node, where: str) -> None:
    """Refuse a node graph with an alias inside its own anchor, or one that stands for more
    than :data:`YAML_MAX_NODES` nodes once its aliases are expanded. Each node is counted
    once (its expanded size is remembered), so a bomb is refused without being expanded."""
    expanded: dict[int, int] = {}  # id(node) -> nodes it stands for, once finished
    counts = {id(root): 1}  # nodes counted so far under each node of the current path
    stack = [(root, iter(_children(root)))]
    while stack:
        node, children = stack[-1]
        child = next(children, None)
        if child is not None and id(child) in counts:
            raise ValueError(f"{where}: recursive YAML alias (the anchor at line "
                             f"{child.start_mark.line + 1} holds an alias to itself)")
        if child is not None and id(child) not in expanded:
            counts[id(child)] = 1
            stack.append((child, iter(_children(child))))
            continue
        if child is None:  # node finished: hand its size to its parent
            stack.pop()
            expanded[id(node)] = counts.pop(id(node))
            if not stack:
                return
            child, node = node, stack[-1][0]
        counts[id(node)] += expanded[id(child)]
        if counts[id(node)] > YAML_MAX_NODES:
            raise ValueError(f"{where}: the YAML aliases expand to more than "
                             f"{YAML_MAX_NODES:,} values; a config this large is refused "
                             "(an alias bomb?)")


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def load_yaml_text(text: str, where: str) -> Any:
    """One YAML document of user input, read by ``yaml.safe_load`` that also refuses duplicate
    keys, recursive aliases, alias bombs (:data:`YAML_MAX_NODES`) and too deep nesting, each a
    one-line ``ValueError`` beginning with ``where``."""
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(node, where)
        return loader.construct_document(node)
    except _DuplicateKeyError as err:
        raise ValueError(f"{where}: {err}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ValueError(f"{where}: not valid YAML ({getattr(err, 'problem', None) or err}"
                         f"{at})") from None
    except RecursionError:
        raise ValueError(f"{where}: the YAML is nested too deeply") from None
    finally:
        loader.dispose()


def read_yaml(path: str | Path) -> Any:
    """:func:`load_yaml_text` of a file; a missing file is a ``FileNotFoundError``."""
    return load_yaml_text(Path(path).read_text(encoding="utf-8"), str(path))


def number_value(key: str, value: Any, tp: type) -> Any:
    """``value`` (a number or its text) as ``tp`` (int or float); ``ValueError`` naming ``key``."""
    try:
        if isinstance(value, bool):
            raise ValueError
        as_float = float(value)
        if tp is int and not as_float.is_integer():
            raise ValueError
        return int(as_float) if tp is int else as_float
    except (TypeError, ValueError):
        raise ValueError(f"config key {key!r} expects {tp.__name__}, got {value!r}") from None


_NO_CHECK = object()


def _param_value(key: str, value: Any, tp: Any) -> Any:
    """``value`` if it is of the annotated type ``tp`` (text numbers converted), else a
    ``ValueError`` naming ``key``; a type this cannot tell accepts anything."""
    origin = typing.get_origin(tp)
    if tp is Any or tp is _NO_CHECK:
        return value
    if origin in (typing.Union, types.UnionType):
        arms = typing.get_args(tp)
        if value is None and type(None) in arms:
            return None
        for arm in (a for a in arms if a is not type(None)):
            try:
                return _param_value(key, value, arm)
            except ValueError:
                continue
    elif origin is typing.Literal:
        if value in typing.get_args(tp):
            return value
    elif tp is bool:
        if isinstance(value, bool):
            return value
    elif tp in (int, float):
        if isinstance(value, tp if tp is int else (int, float)) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            return number_value(key, value, tp)
    elif tp is str:
        if isinstance(value, str):
            return value
    elif origin in (list, tuple, Sequence, Iterable):
        if isinstance(value, (list, tuple)):
            args = [a for a in typing.get_args(tp) if a is not Ellipsis]
            inner = args[0] if len(set(args)) == 1 else Any
            return type(value)(_param_value(f"{key}[{i}]", v, inner)
                               for i, v in enumerate(value))
    elif origin in (dict, Mapping) or tp is dict:
        if isinstance(value, Mapping):
            return value
    elif isinstance(tp, type):
        if isinstance(value, tp):
            return value
    else:
        return value
    raise ValueError(f"config key {key!r} expects {_type_text(tp)}, got {value!r}")


def _type_text(tp: Any) -> str:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join(_type_text(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) is typing.Literal:
        return " or ".join(repr(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def check_params(builder: Any, params: dict[str, Any], section: str,
                 ranges: Mapping[str, Any], skip: Iterable[str] = ()) -> None:
    """Check the ``params`` handed to ``builder`` against its signature: unknown names and
    values of another type are a ``ValueError`` naming ``section.name``; text numbers (``1e3``) are
    converted in place. ``ranges`` (:mod:`e2mc.ranges`) are checked with the signature's defaults
    for the rest; ``skip``: parameters the caller fills itself."""
    import inspect

    from e2mc.ranges import check_values

    signature = inspect.signature(builder)
    try:
        hints = typing.get_type_hints(builder)
    except Exception:  # an annotation that cannot be resolved: names only  # noqa: BLE001
        hints = {}
    takes = {n: p for n, p in signature.parameters.items()
             if n != "self" and n not in skip
             and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    for name, value in params.items():
        if name not in takes:
            raise ValueError(f"unknown config key {section}.{name}; "
                             f"{section} takes: {', '.join(sorted(takes)) or 'nothing'}")
        params[name] = _param_value(f"{section}.{name}", value, hints.get(name, _NO_CHECK))
    defaults = {n: p.default for n, p in takes.items() if p.default is not p.empty}
    check_values(ranges, {**defaults, **params}, prefix=f"{section}.")


