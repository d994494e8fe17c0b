"""The declared ranges of the builders' parameters: each method declares ``{name: bound}`` tables
of its constructor's (``param_ranges``) and its optimizer's (``optimizer_ranges``) parameters,
each add-on of its constructor's; the configuration (each section's ``RANGES``) and the builders
check against them with one message, e.g. ``method.params.out_dim must be >= 2, got 0``. A bound
accepts ``None`` (the type decides). Torch-free."""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from e2mc.errors import InputError


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


class Bound:
    """The range of one parameter: :meth:`problem` is ``None`` for a value inside it, else the
    range in words (what follows "must be")."""

    def problem(self, value: Any, values: Mapping[str, Any]) -> str | None:
        """``values``: every parameter of the builder (for a range that depends on another)."""
        raise NotImplementedError

    @property
    def text(self) -> str:
        """The range in words."""
        raise NotImplementedError


@dataclass(frozen=True)
class Interval(Bound):
    """A finite number between ``low`` and ``high`` (either may be open or absent)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    @property
    def text(self) -> str:
        low, high = self.low, self.high
        if low is not None and high is not None:
            return (f"in {'(' if self.low_open else '['}{_num(low)}, {_num(high)}"
                    f"{')' if self.high_open else ']'}")
        if low is not None:
            return f"{'>' if self.low_open else '>='} {_num(low)}"
        if high is not None:
            return f"{'<' if self.high_open else '<='} {_num(high)}"
        return "a finite number"

    def contains(self, value: Any) -> bool:
        if not _number(value) or not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def problem(self, value: Any, values: Mapping[str, Any]) -> str | None:
        if value is None or self.contains(value):
            return None
        if _number(value) and math.isfinite(value):
            return self.text
        return "a finite number" + ("" if self.low is None and self.high is None
                                    else f" {self.text}")


def at_least(low: float) -> Interval:
    """``>= low``: a size (1), a count (0), a coefficient that may be off (0)."""
    return Interval(low=low)


def above(low: float) -> Interval:
    """``> low``: a temperature, an epsilon, a learning rate."""
    return Interval(low=low, low_open=True)


def between(low: float, high: float, high_open: bool = False) -> Interval:
    """``[low, high]`` (``[low, high)`` with ``high_open``): a momentum, a probability."""
    return Interval(low=low, high=high, high_open=high_open)


@dataclass(frozen=True)
class OneOf(Bound):
    """One of ``choices``."""

    choices: tuple[Any, ...]

    @property
    def text(self) -> str:
        return "one of " + ", ".join(repr(c) for c in self.choices)

    def problem(self, value: Any, values: Mapping[str, Any]) -> str | None:
        fits = any(value == c and type(value) is type(c) for c in self.choices)
        return None if value is None or fits else self.text


def parse_widths(spec: Any) -> list[int] | None:
    """``"8192-8192-8192"`` -> ``[8192, 8192, 8192]``; ``None`` unless every width >= 1."""
    try:
        sizes = [int(s) for s in str(spec).split("-")]
    except ValueError:
        return None
    return sizes if sizes and all(s >= 1 for s in sizes) else None


@dataclass(frozen=True)
class Widths(Bound):
    """A layer-size spec: widths >= 1 joined by ``-`` (``"8192-8192-8192"``)."""

    @property
    def text(self) -> str:
        return "layer widths >= 1 joined by '-' (e.g. '8192-8192-8192')"

    def problem(self, value: Any, values: Mapping[str, Any]) -> str | None:
        fits = isinstance(value, str) and parse_widths(value) is not None
        return None if value is None or fits else self.text


@dataclass(frozen=True)
class Each(Bound):
    """A list (of ``length`` items, else non-empty) whose every item is in ``item``, summing to
    at least ``min_sum`` when given."""

    item: Interval
    length: int | None = None
    min_sum: float | None = None

    @property
    def text(self) -> str:
        size = "non-empty list of" if self.length is None else f"list of {self.length}"
        total = "" if self.min_sum is None else f" that sum to >= {_num(self.min_sum)}"
        return f"a {size} values {self.item.text}{total}"

    def problem(self, value: Any, values: Mapping[str, Any]) -> str | None:
        if value is None:
            return None
        fits = (isinstance(value, (list, tuple)) and len(value) >= 1
                and (self.length is None or len(value) == self.length)
                and all(self.item.contains(v) for v in value)
                and (self.min_sum is None or sum(value) >= self.min_sum))
        return None if fits else self.text


@dataclass(frozen=True)
class IndicesOf(Bound):
    """Distinct indices (a non-empty list) of the items counted by the list parameter
    ``counts`` (SwAV's ``crops_for_assign`` of the ``sum(n_crops)`` crops)."""

    counts: str

    @property
    def text(self) -> str:
        return f"a non-empty list of distinct indices in [0, sum({self.counts}))"

    def problem(self, value: Any, values: Mapping[str, Any]) -> str | None:
        if value is None:
            return None
        counts = values.get(self.counts)
        total = sum(counts) if isinstance(counts, (list, tuple)) \
            and all(_number(c) for c in counts) else None
        fits = (total is not None and isinstance(value, (list, tuple)) and len(value) >= 1
                and len(set(value)) == len(value)
                and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < total
                        for v in value))
        if fits:
            return None
        if total is None:
            return self.text
        return (f"a non-empty list of distinct indices in [0, {_num(total)}) "
                f"(sum({self.counts}) = {_num(total)})")


def check_values(ranges: Mapping[str, Bound], values: Mapping[str, Any],
                 prefix: str = "") -> None:
    """Raise :class:`~e2mc.errors.InputError` ``"<prefix><name> must be <range>, got
    <value>"`` for the first of ``values`` outside its range in ``ranges``."""
    for name, bound in ranges.items():
        if name in values:
            wrong = bound.problem(values[name], values)
            if wrong is not None:
                raise InputError(f"{prefix}{name} must be {wrong}, got {values[name]!r}")


def checked(builder: Callable[..., Any], table: str, skip: type | tuple[type, ...] = (),
            keep: str | None = None) -> Callable[..., Any]:
    """``builder`` (a constructor or ``build_optimizer``) first checking its arguments,
    defaults included, against the class's table ``table``; values of the types ``skip`` are not.
    ``keep``: the attribute of ``self`` that gets those arguments before ``builder`` runs."""
    signature = inspect.signature(builder)

    @functools.wraps(builder)
    def checking(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(self, *args, **kwargs)
        except TypeError:
            return builder(self, *args, **kwargs)
        bound.apply_defaults()
        if keep is not None:
            object.__setattr__(self, keep, dict(list(bound.arguments.items())[1:]))
        check_values(getattr(self, table), {k: v for k, v in bound.arguments.items()
                                            if not isinstance(v, skip)})
        return builder(self, *args, **kwargs)

    return checking
