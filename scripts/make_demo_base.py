"""Make the base checkpoint that ``e2mc demo`` ships: ``src/e2mc/assets/demo_base_vicreg.pt``.

Step 1 is the project's own ``e2mc pretrain`` (resumes when the run directory exists):

    e2mc pretrain --config fmnist-vicreg-pretrain --out runs/demo-base-vicreg \\
        --set model.backbone=cnn5_small --set training.epochs=16 --set data.num_workers=1 \\
        --set training.cpu_threads=2

Step 2 keeps what a continued run needs (model, optimizer state, epoch, the resolved config)
and drops the resume-only state (RNG states, data position), so the file stays small:

    python scripts/make_demo_base.py runs/demo-base-vicreg
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from e2mc.checkpoints import load_checkpoint, save_checkpoint

ASSET = Path(__file__).resolve().parents[1] / "src" / "e2mc" / "assets" / "demo_base_vicreg.pt"
KEEP = ("optimizer", "epoch", "run_config")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="the finished 'e2mc pretrain' run directory")
    parser.add_argument("--out", type=Path, default=ASSET)
    args = parser.parse_args()
    source = args.run_dir / "checkpoint.pt"
    method, _ = load_checkpoint(source)
    raw = torch.load(source, map_location="cpu", weights_only=True)
    save_checkpoint(args.out, method, **{key: raw[key] for key in KEEP})
    print(f"wrote {args.out} ({args.out.stat().st_size / 2**20:.1f} MiB, epoch {raw['epoch']})")


if __name__ == "__main__":
    main()
