"""argparse types and actions shared by the subcommands: a bad value is an argparse error (one
``e2mc COMMAND: error: argument --X: ...`` line, exit 2)."""

from __future__ import annotations

import argparse
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

