"""argparse types and actions shared by the subcommands: a bad value is an argparse error (one
``e2mc COMMAND: error: argument --X: ...`` line, exit 2)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable


def at_least(low: int) -> Callable[[str], int]:
    """An integer >= ``low``."""
    def check(text: str) -> int:
        try:
            value = int(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from exc
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    check.__name__ = f"integer >= {low}"
    return check


class Renamed(argparse.Action):
    """The old spelling of a renamed option, kept so that scripts keep working: it stores into
    the new option's ``dest`` and prints one line, ``note: COMMAND OLD is now NEW``, on stderr.
    ``add_argument("--seed", dest=..., action=Renamed, new="--resample-seed", command="compare",
    type=int)``."""

    def __init__(self, option_strings: list[str], dest: str, new: str, command: str,
                 **kwargs: object) -> None:
        kwargs.setdefault("help", f"the old spelling of {new}")
        kwargs.setdefault("default", argparse.SUPPRESS)  # the new option's default counts
        super().__init__(option_strings, dest, **kwargs)  # type: ignore[arg-type]
        self.new, self.command = new, command

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        print(f"note: {self.command} {option_string} is now {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)
