"""The ``e2mc`` command line.

Each subcommand lives in its own module under :mod:`e2mc.commands` and exposes
``register(subparsers) -> None``; the parser created there sets ``func`` (a callable taking the
parsed ``argparse.Namespace`` and returning an exit code). New commands need no change here.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
from collections.abc import Sequence

from e2mc import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="e2mc",
        description=(
            "Continue training a pre-trained self-supervised model with the E2MC criterion "
            "and measure whether its embeddings improved."
        ),
    )
    parser.add_argument("--version", action="version", version=f"e2mc {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    import e2mc.commands as commands

    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):  # shared helpers of several commands
            continue
        module = importlib.import_module(f"e2mc.commands.{info.name}")
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 0 if args.command is None else 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError) as error:
        # Bad input (a wrong path, an unknown key, a mismatched checkpoint): the message says
        # what is wrong; set E2MC_DEBUG=1 for the traceback.
        if os.environ.get("E2MC_DEBUG"):
            raise
        print(f"e2mc {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
