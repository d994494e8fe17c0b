"""``e2mc pretrain``: train a base SSL model from scratch (the small-scale benchmarks need base
models, since the official checkpoints cannot be downloaded everywhere)."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    from e2mc.commands._run_options import register_run_command

    register_run_command(
        subparsers, "pretrain", help="train a base SSL model from scratch",
        description="Train a model of any method (vicreg, swav, simsiam, barlowtwins, simclr, "
                    "byol, mocov3, dino) from random weights with the preset's settings (usually "
                    "a warm-up + cosine learning rate).")
