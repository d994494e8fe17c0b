"""The ``e2mc`` command line: each subcommand is a module of :mod:`e2mc.commands` with
``register(subparsers)``, setting ``func(args) -> exit code``. Errors have one path
(docs/cli.md): :func:`main` prints one ``e2mc COMMAND: error: ...`` line with the exit code of
:func:`e2mc.errors.describe`; ``--debug`` or ``E2MC_DEBUG=1`` shows the traceback instead."""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
from collections.abc import Sequence

from e2mc import __version__
from e2mc.errors import describe


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="e2mc",
        description=(
            "Continue training a pre-trained self-supervised model with the E2MC criterion "
            "and measure whether its embeddings improved."
        ),
    )
    parser.add_argument("--version", action="version", version=f"e2mc {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of an error (also E2MC_DEBUG=1); accepted "
                             "anywhere on the command line")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    import e2mc.commands as commands

    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):  # shared helpers of several commands
            continue
        module = importlib.import_module(f"e2mc.commands.{info.name}")
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; returns its exit code (see :mod:`e2mc.errors`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    _print_unencodable_as_text()
    debug = "--debug" in argv or os.environ.get("E2MC_DEBUG", "") not in ("", "0")
    argv = [a for a in argv if a != "--debug"]
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 0 if args.command is None else 2
    try:
        _load(getattr(args, "libraries", ()))
        return int(args.func(args) or 0)
    except (Exception, KeyboardInterrupt) as error:
        if debug:
            raise
        code, message = describe(error)
        print(f"e2mc {args.command}: error: {message}", file=sys.stderr)
        return code


def _load(modules: Sequence[str]) -> None:
    """Import the command's heavy modules (``set_defaults(libraries=...)``) first, with a
    line every 10 s while that takes."""
    if modules:
        from e2mc.progress import heartbeat

        with heartbeat("loading PyTorch and e2mc's modules"):
            for name in modules:
                importlib.import_module(name)


def _print_unencodable_as_text() -> None:
    """Show a non-UTF-8 name (a lone surrogate) as ``\\xff``, as the files do, instead of ending
    a finished command with a ``UnicodeEncodeError``."""
    import contextlib

    from e2mc.files import UNENCODABLE_AS_TEXT

    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:  # (a TextIOWrapper; not a test's capture)
            with contextlib.suppress(ValueError, OSError):  # (a closed or detached stream)
                reconfigure(errors=UNENCODABLE_AS_TEXT)
