"""``e2mc convert OFFICIAL_FILE OUT [--method NAME]``: official checkpoint -> e2mc."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "convert",
        help="convert an official (VICReg/SwAV/SimSiam/DINO/MoCo v3/Barlow Twins) or "
             "solo-learn/lightly checkpoint to the e2mc format",
        description="Load an official checkpoint strictly (every tensor must match) and write it "
                    "in the e2mc format, keeping its epoch and optimizer state.")
    p.add_argument("official_file", help="official checkpoint (.pth / .pth.tar)")
    p.add_argument("out", help="output e2mc checkpoint")
    p.add_argument("--method", default=None, metavar="METHOD",
                   choices=["vicreg", "swav", "simsiam", "barlowtwins", "simclr", "byol",
                            "mocov3", "dino"],
                   help="expected method: vicreg, swav, simsiam, barlowtwins, simclr, byol, "
                        "mocov3 or dino (default: detected from the keys; required for a "
                        "backbone-only file)")
    p.add_argument("--backbone", default=None, metavar="NAME",
                   help="the backbone's architecture where the keys do not tell it (a ViT: "
                        "e.g. timm:vit_small_patch16_224); default: read off the shapes")
    p.add_argument("--new-heads", action="store_true",
                   help="for a backbone-only file, or a file whose heads are another "
                        "architecture than the method's: its backbone with the method's heads "
                        "from random weights")
    p.add_argument("--trust-checkpoint", action="store_true",
                   help="allow full unpickling (runs code stored in the file; trusted files only)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from e2mc.checkpoints import load_official, save_checkpoint

    hparams = {} if args.backbone is None else {"backbone": args.backbone}
    method, info = load_official(args.official_file, method=args.method,
                                 trust=args.trust_checkpoint, new_heads=args.new_heads, **hparams)
    extra = {"source_format": info["format"], "source": info["source"]}
    if info.get("epoch") is not None:
        extra["epoch"] = info["epoch"]
    if info.get("optimizer") is not None:
        extra["official_optimizer"] = info["optimizer"]
    save_checkpoint(args.out, method, **extra)
    n = sum(t.numel() for t in method.state_dict().values())
    kind = info["format"] if info["format"] in ("solo-learn", "lightly") \
        else f"official {info['format']}"
    print(f"{args.official_file}: {kind} checkpoint, epoch "
          f"{info.get('epoch')}, {n:,} values -> {args.out} ({method.name}, {method.hparams})")
    return 0
