"""``e2mc pretrain``: train a base SSL model from scratch (the small-scale benchmarks need base
models, since the official checkpoints cannot be downloaded everywhere)."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    from e2mc.commands._run_options import add_run_arguments

    parser = subparsers.add_parser(
        "pretrain", help="train a base SSL model from scratch",
        description="Train a model of any method (vicreg, swav, simsiam, barlowtwins, simclr, "
                    "byol, mocov3, dino) from random weights with the preset's settings (usually "
                    "a warm-up + cosine learning rate).")
    add_run_arguments(parser, "pretrain")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from e2mc.commands._run_options import run_command

    return run_command(args, "pretrain")
