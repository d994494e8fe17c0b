"""What binding results to their bytes costs: the content identity of a data set
(:func:`e2mc.data.identity.data_identity`, recorded by every run, evaluation and search)
against the feature extraction of the same images, measured in one invocation; and what
checking a checkpoint's bytes costs (``--checkpoint``): loading a ResNet-50 state dict with
:func:`e2mc.checkpoints.torch_load` (every zip member's CRC-32 read, then ``torch.load``) against
plain ``torch.load``, and the non-finite check of its tensors
(:func:`e2mc.checkpoints.strict.check_finite`), the file in the page cache.

Two layouts of the same images: the IDX arrays (hashed whole) and an image folder of PNG files
(each file's bytes and label: the first time every file is read and hashed, later the table
of file hashes is read, :mod:`e2mc.data.file_hashes`). The reference is the extraction of every
image's backbone features by the demo's base model (``builtin:demo-vicreg``), the work an
evaluation does anyway.

    python benchmarks/fingerprint_cost.py --data PATH/TO/fashion-mnist \\
        --out benchmarks/out/fingerprint_cost.json
    python benchmarks/fingerprint_cost.py --checkpoint --out benchmarks/out/checkpoint_check.json
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from e2mc.checkpoints import load_backbone
from e2mc.data import build_dataset, eval_transform
from e2mc.data.identity import data_identity
from e2mc.demo import BASE_CHECKPOINT
from e2mc.evaluation.features import extract_features
from run_meta import run_meta


def timed(fn, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def as_folder(dataset, root: Path, n: int) -> Path:
    """The first ``n`` images of ``dataset`` as ``root/train/<class>/<i>.png``."""
    from PIL import Image

    for i in range(n):
        image, label = dataset[i]
        folder = root / "train" / str(int(label))
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.asarray(image, dtype=np.uint8)).save(folder / f"{i:05d}.png")
    return root


def checkpoint_check(repeats: int) -> dict:
    """Seconds (best of ``repeats``) to load a torchvision ResNet-50 state dict saved by
    ``torch.save``: plain ``torch.load``, the CRC-32 check alone, ``torch_load`` (both), and
    the non-finite check of the loaded tensors."""
    from torchvision.models import resnet50

    from e2mc.checkpoints import io
    from e2mc.checkpoints.strict import check_finite

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "resnet50.pt"
        torch.save(resnet50().state_dict(), path)

        def checked() -> None:
            io._VERIFIED.clear()  # a new process: the check is not remembered
            io.torch_load(path)

        def crc() -> None:
            io._VERIFIED.clear()
            io.check_torch_file(path)

        state = torch.load(path, map_location="cpu", weights_only=True)
        row = {"file_mb": path.stat().st_size / 2**20,
               "torch_load_s": timed(lambda: torch.load(path, map_location="cpu",
                                                       weights_only=True), repeats),
               "crc_s": timed(crc, repeats), "checked_load_s": timed(checked, repeats),
               "finite_s": timed(lambda: check_finite(state), repeats)}
    row["checked_over_plain"] = row["checked_load_s"] / row["torch_load_s"]
    print(f"{'ResNet-50 file MB':>18} {'torch.load s':>13} {'CRC s':>7} {'torch_load s':>13} "
          f"{'ratio':>6} {'finite s':>9}")
    print(f"{row['file_mb']:>18.1f} {row['torch_load_s']:>13.3f} {row['crc_s']:>7.3f} "
          f"{row['checked_load_s']:>13.3f} {row['checked_over_plain']:>6.2f} "
          f"{row['finite_s']:>9.3f}")
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="builtin", help="an IDX folder (Fashion-MNIST)")
    parser.add_argument("--folder-images", type=int, default=10000,
                        help="images written as PNG files for the image-folder row")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--checkpoint", action="store_true",
                        help="measure the checkpoint check instead of the data identity")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/fingerprint_cost.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.checkpoint:
        record = {"checkpoint": checkpoint_check(args.repeats), "threads": args.threads,
                  "repeats": args.repeats, **run_meta()}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {args.out}")
        return
    backbone, _, _ = load_backbone(str(BASE_CHECKPOINT))
    raw = build_dataset(args.data, "train")
    images = build_dataset(args.data, "train", eval_transform(28, 1))
    rows = []
    identity_s = timed(lambda: data_identity(raw))
    extract_s = timed(lambda: extract_features(backbone, images, batch_size=512,
                                               num_workers=0, progress=False), repeats=1)
    rows.append({"layout": "IDX arrays", "images": len(raw), "identity_s": identity_s,
                 "extraction_s": extract_s})
    with tempfile.TemporaryDirectory() as tmp:
        n = min(args.folder_images, len(raw))
        folder = as_folder(raw, Path(tmp), n)
        files = build_dataset(str(folder), "train")
        on_files = build_dataset(str(folder), "train", eval_transform(28, 1))
        # the first identity reads and hashes every file (an empty table of file hashes);
        # later ones read the table (e2mc.data.file_hashes)
        os.environ["E2MC_HASH_CACHE"] = str(Path(tmp) / "file-hashes.sqlite3")
        first_s = timed(lambda: data_identity(files), repeats=1)
        identity_s = timed(lambda: data_identity(files))
        extract_s = timed(lambda: extract_features(backbone, on_files, batch_size=512,
                                                   num_workers=0, progress=False), repeats=1)
        rows.append({"layout": "image folder (PNG)", "images": n, "identity_s": identity_s,
                     "first_identity_s": first_s, "extraction_s": extract_s})
    for row in rows:
        row["identity_over_extraction"] = row["identity_s"] / row["extraction_s"]
    print(f"{'layout':<20} {'images':>7} {'identity s':>11} {'first s':>8} "
          f"{'extraction s':>13} {'ratio':>7}")
    for r in rows:
        first = f"{r['first_identity_s']:8.2f}" if "first_identity_s" in r else f"{'-':>8}"
        print(f"{r['layout']:<20} {r['images']:>7} {r['identity_s']:>11.3f} {first} "
              f"{r['extraction_s']:>13.2f} {r['identity_over_extraction']:>7.3f}")
    record = {"rows": rows, "threads": args.threads, "data": args.data, **run_meta()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
