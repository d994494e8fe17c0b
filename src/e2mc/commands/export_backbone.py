"""``e2mc export-backbone CHECKPOINT OUT``: the backbone as a torchvision-style state dict."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "export-backbone", help="write a checkpoint's backbone as a plain state dict",
        description="Write the backbone of an e2mc or official checkpoint as a state dict with "
                    "torchvision names (no classifier) and its architecture to OUT.json.")
    p.add_argument("checkpoint", help="e2mc or official checkpoint, or a training run directory "
                                      "(its kept model best.pt when it has one)")
    p.add_argument("out", help="output state dict (.pt)")
    p.add_argument("--trust-checkpoint", action="store_true",
                   help="allow full unpickling (runs code stored in the file; trusted files only)")
    p.add_argument("--teacher", action="store_true",
                   help="the EMA teacher's backbone (DINO's teacher, BYOL's target, MoCo v3's "
                        "momentum encoder) instead of the student's: evaluate it with e2mc eval "
                        "OUT")
    p.add_argument("--last", action="store_true",
                   help="of a run directory, the last step's checkpoint instead of the kept model "
                        "(best.pt, when the run was trained with e2mc continue --keep-best)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import sys

    from e2mc.artifacts import run_model
    from e2mc.checkpoints import export_backbone, sidecar_path

    model = run_model(args.checkpoint, args.last)
    meta = export_backbone(args.checkpoint, args.out, trust=args.trust_checkpoint,
                           last=args.last, teacher=args.teacher)
    if model is not None and model.from_directory:
        print(f"model: {model.describe()}", file=sys.stderr)
    which = "teacher's " if args.teacher else ""
    print(f"{args.checkpoint}: {which}{meta['arch']} backbone ({meta['feature_dim']}-d "
          f"features) -> {args.out} (+ {sidecar_path(args.out)})")
    return 0
