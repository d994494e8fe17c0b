"""The paper's diagnostic figures as PNG files (matplotlib, Agg backend): marginal pairs (Fig. 2),
NN-distance histograms (Fig. 3), accuracy curves (Fig. 4) and loss terms. Every function writes
``path`` at exactly ``figsize * dpi`` pixels (no tight bounding box) and returns the path."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from e2mc.artifacts import read_jsonl  # noqa: E402

_COORDINATES = ("step", "epoch", "batch")  # keys of a metrics record that are not terms
#: Up to this many points a line marks each of them (a short run's few logged steps).
FEW_POINTS = 30
#: What a panel of :func:`plot_loss_terms` shows, under its key (``val/...``: the validation
#: monitor's metrics, ``e2mc.config.metric_names``).
TERM_TITLES = {
    "loss": "total loss", "base/loss": "method's loss", "addon/loss": "add-on's loss (weighted)",
    "lr": "learning rate", "val/knn": "kNN top-1 (%)", "val/rankme": "RankMe (effective rank)",
    "val/entropy": "mean marginal entropy", "images_per_s": "throughput (images/s)",
    "skipped_steps": "skipped non-finite steps",
}


def term_title(name: str) -> str:
    """A panel title that says what the term is: ``val/linear_1%`` -> ``val/linear_1%: linear
    probe top-1 (%), 1% labels``; the key alone when it has no description."""
    if name in TERM_TITLES:
        return f"{name}: {TERM_TITLES[name]}"
    if name.startswith("val/linear_"):
        return f"{name}: linear probe top-1 (%), {name.removeprefix('val/linear_')} labels"
    return name


def draw_series(ax: object, xs: Sequence[float], ys: Sequence[float], **style: object) -> None:
    """``ax.plot`` with a marker on every point when there are at most :data:`FEW_POINTS`, and
    integer x ticks; a single x value gets the range x-1 .. x+1 (not matplotlib's +-0.2 of an
    empty panel)."""
    few = len(xs) <= FEW_POINTS
    ax.plot(list(xs), list(ys), marker="o" if few else None,  # type: ignore[attr-defined]
            markersize=4 if len(xs) > 1 else 6, **style)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # type: ignore[attr-defined]
    if xs and min(xs) == max(xs):
        ax.set_xlim(min(xs) - 1, max(xs) + 1)  # type: ignore[attr-defined]


def _as_numpy(a: object, name: str, ndim: int) -> np.ndarray:
    arr = np.asarray(a.detach().cpu() if hasattr(a, "detach") else a, dtype=np.float64)
    if arr.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {arr.shape}")
    return arr


def _save(fig: Figure, path: str | Path, dpi: int) -> Path:
    from e2mc.files import atomic_write

    path = Path(path)
    atomic_write(path, lambda f: fig.savefig(f, dpi=dpi, format="png"))
    plt.close(fig)
    return path


def choose_pair(dim: int, seed: int = 0) -> tuple[int, int]:
    """A seeded random pair of distinct dimensions out of ``dim``."""
    if dim < 2:
        raise ValueError(f"need at least 2 dimensions for a pair, got {dim}")
    i, j = np.random.default_rng(seed).choice(dim, size=2, replace=False)
    return int(i), int(j)


def position_colors(points: np.ndarray) -> np.ndarray:
    """RGB colours ``[n, 3]`` encoding a 2-D position: red grows with x, blue with y (each
    rescaled to its range), so that a point keeps its colour when it moves."""
    pts = _as_numpy(points, "points", 2)
    lo, hi = pts.min(0), pts.max(0)
    u = (pts - lo) / np.where(hi > lo, hi - lo, 1.0)
    return np.stack([u[:, 0], 0.35 + 0.3 * (1 - np.abs(u[:, 0] - u[:, 1])), u[:, 1]], axis=1)


def plot_marginal_pair(before: object, after: Mapping[str, object], path: str | Path, *,
                       before_name: str = "before", dims: tuple[int, int] | None = None,
                       seed: int = 0, figsize: tuple[float, float] | None = None,
                       dpi: int = 100) -> Path:
    """Scatter of compact dimensions ``dims`` (default: a seeded random pair) for ``before``
    ``[n, d]`` and each ``after[name]`` ``[n, d]`` (the same images, same order), one panel each;
    every point is coloured by its position *before*, so the panels show where points moved."""
    b = _as_numpy(before, "before", 2)
    runs = {name: _as_numpy(a, f"after[{name!r}]", 2) for name, a in after.items()}
    for name, a in runs.items():
        if a.shape != b.shape:
            raise ValueError(f"after[{name!r}] has shape {a.shape}, before has {b.shape}; "
                             "they must be the same images in the same order")
    i, j = dims if dims is not None else choose_pair(b.shape[1], seed)
    if not (0 <= i < b.shape[1] and 0 <= j < b.shape[1]) or i == j:
        raise ValueError(f"dims must be two distinct indices below {b.shape[1]}, got {(i, j)}")
    colors = position_colors(b[:, [i, j]])
    panels = {before_name: b, **runs}
    figsize = figsize or (4.0 * len(panels), 4.2)
    fig, axes = plt.subplots(1, len(panels), figsize=figsize, squeeze=False)
    size = max(1.0, 20.0 / math.sqrt(len(b) / 100))
    for ax, (name, z) in zip(axes[0], panels.items(), strict=True):
        ax.scatter(z[:, i], z[:, j], c=colors, s=size, linewidths=0)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel(f"dim {i}")
        ax.set_ylabel(f"dim {j}")
        if z[:, [i, j]].min() >= 0 and z[:, [i, j]].max() <= 1:
            ax.set_xlim(0, 1)
            ax.set_ylim(0, 1)
        ax.set_aspect("equal", adjustable="box")
    fig.tight_layout()
    return _save(fig, path, dpi)


def plot_nn_histograms(distances: Mapping[str, tuple[object, object]], path: str | Path, *,
                       k: int = 100, bins: int = 60, figsize: tuple[float, float] | None = None,
                       dpi: int = 100) -> Path:
    """Histograms of the 1st- and k-th-NN distances, one panel per run (``name -> (first,
    kth)``), with shared bins so panels compare directly; overlap means poor separability."""
    if not distances:
        raise ValueError("distances is empty")
    data = {name: (_as_numpy(f, f"{name} first", 1), _as_numpy(s, f"{name} kth", 1))
            for name, (f, s) in distances.items()}
    everything = np.concatenate([np.concatenate(pair) for pair in data.values()])
    lo, hi = float(everything.min()), float(everything.max())
    edges = np.linspace(lo, hi if hi > lo else lo + 1.0, bins + 1)
    figsize = figsize or (4.0 * len(data), 3.4)
    fig, axes = plt.subplots(1, len(data), figsize=figsize, squeeze=False, sharex=True)
    for ax, (name, (first, kth)) in zip(axes[0], data.items(), strict=True):
        ax.hist(first, bins=edges, alpha=0.6, color="tab:blue", label="1st NN")
        ax.hist(kth, bins=edges, alpha=0.6, color="tab:orange", label=f"{k}th NN")
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("distance")
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("points")
    fig.tight_layout()
    return _save(fig, path, dpi)


def plot_accuracy_curves(runs: Sequence[tuple[str, Sequence[float], Sequence[float]]],
                         path: str | Path, *, ylabel: str = "accuracy (%)",
                         figsize: tuple[float, float] = (6.0, 4.0), dpi: int = 100) -> Path:
    """Accuracy against continued epoch, one line per ``(run name, epochs, accuracies)``, a
    marker on every point; when every run has one epoch, one bar per run with its value
    written on it (a line of one point is a dot)."""
    if not runs:
        raise ValueError("runs is empty")
    for name, epochs, accs in runs:
        if len(epochs) != len(accs) or len(epochs) == 0:
            raise ValueError(f"run {name!r}: {len(epochs)} epochs but {len(accs)} accuracies")
    fig, ax = plt.subplots(figsize=figsize, layout="constrained")
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    if all(len(epochs) == 1 for _, epochs, _ in runs):
        names = [f"{name}\n(epoch {epochs[0]:g})" for name, epochs, _ in runs]
        values = [float(accs[0]) for _, _, accs in runs]
        bars = ax.bar(names, values, color=[colors[i % len(colors)] for i in range(len(runs))],
                      width=0.6)
        ax.bar_label(bars, [f"{v:.2f}" for v in values], fontsize=9)
        ax.set_ylim(0, max(100.0, max(values)) * 1.08)
        ax.grid(axis="y", alpha=0.3)
    else:
        for i, (name, epochs, accs) in enumerate(runs):
            draw_series(ax, epochs, accs, label=name, color=colors[i % len(colors)])
        ax.set_xlabel("continued epoch")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    ax.set_ylabel(ylabel)
    return _save(fig, path, dpi)


def loss_terms(records: Sequence[Mapping[str, object]]
               ) -> dict[str, tuple[list[float], list[float]]]:
    """``term -> (steps, values)`` for every numeric key other than ``step``/``epoch``, in the
    order terms first appear. Records without ``step`` use their index."""
    terms: dict[str, tuple[list[float], list[float]]] = {}
    for index, record in enumerate(records):
        step = record.get("step", index)
        for key, value in record.items():
            if key in _COORDINATES or isinstance(value, bool):
                continue
            if isinstance(value, int | float) and math.isfinite(value):
                steps, values = terms.setdefault(key, ([], []))
                steps.append(float(step))  # type: ignore[arg-type]
                values.append(float(value))
    return terms


def plot_loss_terms(metrics: str | Path | Sequence[Mapping[str, object]], path: str | Path, *,
                    title: str | None = None, keys: Sequence[str] | None = None,
                    kept_step: int | None = None, kept_by: str | None = None,
                    figsize: tuple[float, float] | None = None, dpi: int = 100) -> Path:
    """One small panel per logged term (their scales differ by orders of magnitude) against the
    step, from a ``metrics.jsonl`` path or its parsed records; ``keys``: only these terms, in
    this order (default: every term). Each panel is titled with what it shows
    (:func:`term_title`); few points carry markers (:func:`draw_series`); ``kept_step`` (chosen
    by ``kept_by``: keep-best's) is marked on every panel."""
    records = read_jsonl(metrics) if isinstance(metrics, str | Path) else list(metrics)
    terms = loss_terms(records)
    if keys is not None:
        terms = {k: terms[k] for k in keys if k in terms}
    if not terms:
        raise ValueError("no numeric loss terms found in the metrics")
    cols = min(len(terms), 3)
    rows = math.ceil(len(terms) / cols)
    figsize = figsize or (3.6 * cols, 2.6 * rows + (0.4 if title else 0.0))
    fig, axes = plt.subplots(rows, cols, figsize=figsize, squeeze=False, layout="constrained")
    flat = axes.ravel()
    for ax, (name, (steps, values)) in zip(flat, terms.items(), strict=False):
        draw_series(ax, steps, values, lw=1.2)
        if kept_step is not None:
            by = f" by {kept_by}" if kept_by else ""
            ax.axvline(kept_step, color="C3", ls="--", lw=1, label=f"kept{by}: step {kept_step}")
            ax.legend(fontsize=7)
        ax.set_title(term_title(name), fontsize=8)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in flat[len(terms):]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title, fontsize=10)
    return _save(fig, path, dpi)
