"""The reproduction's figures (matplotlib, small PNGs for ``docs/figures/``)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

MAX_BYTES = 200_000


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_base_curves(curves: dict[str, list[dict[str, float]]], path: Path, k: int) -> Path:
    """kNN top-1 of each base model against its pre-training epoch (the plateau check)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 3.4), dpi=100)
    for method, points in curves.items():
        ax.plot([p["epoch"] for p in points], [p["knn"] for p in points], marker=".",
                label=method)
    ax.set_xlabel("base pre-training epoch")
    ax.set_ylabel(f"kNN top-1 (k={k}, %)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_epoch_curves(curves: dict[str, dict[str, list[dict[str, float]]]], path: Path,
                      k: int, fraction_label: str, default_epochs: int) -> Path:
    """kNN and linear-probe top-1 against continued epoch, ``continued`` vs ``+E2MC``, one
    column per method; a dotted line marks the default continued length."""
    plt = _plt()
    methods = list(curves)
    fig, axes = plt.subplots(2, len(methods), figsize=(3.2 * len(methods), 4.6), dpi=100,
                             squeeze=False)
    for col, method in enumerate(methods):
        for row, (key, label) in enumerate((("knn", f"kNN top-1 (k={k})"),
                                            ("linear", f"linear {fraction_label} top-1"))):
            ax = axes[row][col]
            for name, points in curves[method].items():
                pts = [p for p in points if key in p]
                ax.plot([p["epoch"] for p in pts], [p[key] for p in pts], marker=".",
                        label=name)
            ax.axvline(default_epochs, color="grey", linestyle=":", linewidth=1)
            ax.grid(alpha=0.3)
            if row == 0:
                ax.set_title(method)
            if row == 1:
                ax.set_xlabel("continued epoch")
            if col == 0:
                ax.set_ylabel(f"{label} (%)")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def copy_small(source: Path, target: Path, max_bytes: int = MAX_BYTES) -> Path:
    """Copy a PNG, downscaling it (Pillow) until it is under ``max_bytes``."""
    from PIL import Image

    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    scale = 0.8
    while target.stat().st_size > max_bytes and scale > 0.1:
        with Image.open(source) as image:
            size = (max(1, int(image.width * scale)), max(1, int(image.height * scale)))
            image.convert("RGB").resize(size, Image.LANCZOS).quantize(64).save(
                target, optimize=True)
        scale *= 0.8
    return target
