"""Make the Fashion-MNIST subset shipped in ``src/e2mc/assets/fashion_mnist_subset.npz``.

Exact command that produced the shipped file (from the repository root)::

    PYTHONPATH=src python scripts/make_fashion_mnist_subset.py \
        --src PATH/TO/fashion-mnist --out src/e2mc/assets/fashion_mnist_subset.npz

Steps: check the md5 of the four official Fashion-MNIST files (the published checksums), read them
with ``e2mc.data.load_idx``, draw 1,000 images per class from the training set and 200 per class
from the test set with ``e2mc.data.per_class_indices`` (``numpy.random.default_rng(seed)``, seed 0,
classes in ascending order, indices sorted), and write ``x_train``, ``y_train``, ``x_test``,
``y_test`` (uint8) plus ``source_index_train``/``source_index_test`` (int64 positions in the
official files) and ``classes``. The zip is written with fixed timestamps and DEFLATE level 9, so
the output is byte-for-byte reproducible; the script prints its sha256.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import zipfile
from pathlib import Path

import numpy as np

from e2mc.data import FASHION_MNIST_CLASSES, load_idx, per_class_indices

# Published md5 checksums (github.com/zalandoresearch/fashion-mnist; the same torchvision checks).
SOURCE_MD5 = {
    "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
    "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
    "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
    "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
}
PER_CLASS = {"train": 1000, "test": 200}
PREFIX = {"train": "train", "test": "t10k"}


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def check_sources(src: Path) -> None:
    for name, expected in SOURCE_MD5.items():
        got = md5(src / name)
        if got != expected:
            raise SystemExit(f"{src / name}: md5 {got} != published {expected}")


def write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """``numpy.savez_compressed`` equivalent with fixed zip timestamps (reproducible bytes)."""
    with zipfile.ZipFile(path, "w") as zf:
        for key, array in arrays.items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.ascontiguousarray(array), allow_pickle=False)
            info = zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, buf.getvalue(), compresslevel=9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--src", type=Path, required=True, help="folder of the 4 official .gz files"
    )
    parser.add_argument("--out", type=Path, required=True, help="output .npz")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    check_sources(args.src)
    arrays: dict[str, np.ndarray] = {}
    for split, prefix in PREFIX.items():
        images = load_idx(args.src / f"{prefix}-images-idx3-ubyte.gz")
        labels = load_idx(args.src / f"{prefix}-labels-idx1-ubyte.gz")
        index = per_class_indices(labels, PER_CLASS[split], seed=args.seed)
        arrays[f"x_{split}"] = images[index]
        arrays[f"y_{split}"] = labels[index].astype(np.uint8)
        arrays[f"source_index_{split}"] = index.astype(np.int64)
        counts = np.bincount(labels[index], minlength=10)
        print(f"{split}: {len(index)} images, per class {counts.tolist()}")
    arrays["classes"] = np.asarray(FASHION_MNIST_CLASSES)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_npz(args.out, arrays)
    digest = hashlib.sha256(args.out.read_bytes()).hexdigest()
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes), sha256 {digest}")


if __name__ == "__main__":
    main()
