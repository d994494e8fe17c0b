"""``e2mc demo``: base model -> continued vs E2MC -> probes, kNN, paired tests, figures."""

from __future__ import annotations

import argparse

from e2mc.commands._types import at_least

#: What the demo's stages import (loaded first, with a line every 10 s while that takes).
DEMO_LIBRARIES = ("e2mc.training.run", "e2mc.evaluation.workflow", "e2mc.diagnostics.analyze")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run the whole path on the shipped Fashion-MNIST subset and base model",
        description="Continue the shipped VICReg base model with and without E2MC, evaluate "
        "all three with linear probes (1%, 10%, 100% labels) and kNN, test the differences, "
        "draw the diagnostics, print the answer (a headline per run) and write the page with "
        "it, OUT/comparison.html (verdicts, table, chart, diagnostics). About a minute "
        "on a 2-core CPU.",
    )
    parser.add_argument("--out", default="e2mc-demo", metavar="DIR",
                        help="output directory; the page with the answer: DIR/comparison.html "
                             "(default: %(default)s)")
    parser.add_argument("--quick", action="store_true",
                        help="a reduced run (well under a minute) that only checks the "
                             "installation: its numbers and verdicts mean nothing")
    parser.add_argument("--epochs", type=at_least(1), default=None, metavar="N",
                        help="continued epochs (default: 1; the paper's ratio would be 10%% of "
                        "the base's 16)")
    parser.add_argument("--from", dest="base", default=None, metavar="CHECKPOINT",
                        help="a VICReg checkpoint to start from (default: the shipped "
                             "builtin:demo-vicreg)")
    parser.add_argument("--device", default="cpu", metavar="DEVICE",
                        help="device of training and evaluation: cpu, cuda, cuda:1 "
                             "(default: %(default)s)")
    parser.add_argument("--quiet", "-q", action="store_true",
                        help="no progress bars (the stages and the answer are still printed)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE",
                        help="override a key of both continued runs' config, e.g. --set "
                             "optim.base_lr=0.01 (repeatable)")
    parser.set_defaults(func=run, libraries=DEMO_LIBRARIES)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from e2mc.demo import BASE_CHECKPOINT, DemoSettings, run_demo
    from e2mc.errors import InputError

    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise InputError(f"--out {args.out} is an existing file; give a directory")
    settings = DemoSettings.quick() if args.quick else DemoSettings()
    if args.epochs is not None:
        settings.continued_epochs = args.epochs
    settings.overrides = list(args.overrides)
    settings.progress = not args.quiet
    run_demo(args.out, settings, base_checkpoint=args.base or BASE_CHECKPOINT, device=args.device)
    return 0
