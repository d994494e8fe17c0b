"""``e2mc continue``: the paper's step 2, continue training a pre-trained model with its own loss
plus an add-on criterion (E2MC, or ``none`` for the "continued" baseline)."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    from e2mc.commands._run_options import register_run_command

    register_run_command(
        subparsers, "continue",
        help="continue training a pre-trained SSL model with its loss plus an add-on (E2MC)",
        description="Continue training an official checkpoint (VICReg, SwAV, SimSiam, DINO), "
                    "a backbone by name (timm:NAME, with --new-heads) or an e2mc checkpoint of any "
                    "method for --epochs more epochs with the preset's base loss and add-on.")
