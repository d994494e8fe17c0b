"""The ``e2mc analyze`` workflow: checkpoints in, statistics + figures + report out. The first run
is *before*, the others *after*; all are evaluated on the same seeded sample of images, so the
paired figures show the same points moving."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from e2mc.artifacts import (
    CHECKPOINT,
    EPOCH_DIR,
    RunDir,
    RunModel,
    builtin_checkpoint,
    read_jsonl,
    run_model,
)
from e2mc.checkpoints.summary import recorded_image_size
from e2mc.config import config_differences
from e2mc.data.subsets import LabeledSubset, dataset_labels
from e2mc.diagnostics.embedding_stats import (
    embedding_statistics,
    marginal_values,
    nearest_neighbors,
)
from e2mc.diagnostics.figures import (
    loss_terms,
    plot_accuracy_curves,
    plot_loss_terms,
    plot_marginal_pair,
    plot_nn_histograms,
)
from e2mc.diagnostics.report import RunDiagnostics, loss_change, write_report
from e2mc.evaluation.features import features_and_embeddings
from e2mc.files import atomic_write, display_name, safe_name
from e2mc.models import check_input_size, fixed_image_size, input_channels
from e2mc.progress import progress_bar

FEATURES = "backbone features"
EMBEDDINGS = "projector embeddings"
#: The far neighbour of the NN-distance statistics unless told (fewer on a small test set).
DEFAULT_KNN_K = 100

#: ``path -> (backbone, method or None, info)``; the method is None for backbone-only files.
Loader = Callable[[Path], tuple[nn.Module, nn.Module | None, dict[str, Any]]]


@dataclass
class RunSource:
    """Where a run's files are: the checkpoint to analyse, its per-epoch checkpoints (for the
    accuracy curve), its ``metrics.jsonl`` (for the loss curves) and the validation monitor's
    figure, when present."""

    name: str
    checkpoint: Path
    metrics: Path | None = None
    epoch_checkpoints: list[tuple[int, Path]] = field(default_factory=list)
    model: RunModel | None = None
    monitor_plot: Path | None = None


def resolve_run(path: str | Path, last: bool = False) -> RunSource:
    """A run directory (its model, :meth:`~e2mc.artifacts.RunDir.model`: ``best.pt`` when
    keep-best wrote one, else or with ``last`` its latest checkpoint; plus ``metrics.jsonl`` and
    the per-epoch checkpoints), a checkpoint file or a shipped one (``builtin:NAME``)."""
    path = builtin_checkpoint(path) or Path(path)
    if path.is_file():
        return RunSource(display_name(path.stem), path, model=run_model(path))
    if not path.is_dir():
        raise ValueError(f"{path} is neither a run directory nor a checkpoint file")
    run = RunDir(path)
    if run.latest_checkpoint() is None:
        raise ValueError(f"run directory {path} has no {CHECKPOINT} and no "
                         f"{EPOCH_DIR}/epoch_XXXX.pt")
    model = run.model(last)
    print(f"model: {model.describe()}", file=sys.stderr)
    metrics = run.metrics if run.metrics.is_file() else None
    monitor = run.monitor_plot if run.monitor_plot.is_file() else None
    return RunSource(display_name(path.resolve().name), model.path, metrics,
                     run.epoch_checkpoints(), model, monitor)


def _unique_names(sources: Sequence[RunSource]) -> None:
    seen: dict[str, int] = {}
    for src in sources:
        count = seen.get(src.name, 0)
        seen[src.name] = count + 1
        if count:
            src.name = f"{src.name}-{count + 1}"


_STARTING_WEIGHTS = "note: {}: starting weights, a plain state dict (no heads)"


def _features_only(why: str) -> None:
    print(f"{why}; analysing backbone features only", file=sys.stderr)


def default_loader(trust: bool = False) -> Loader:
    """Load a full method with :func:`e2mc.checkpoints.load_checkpoint`; files that hold only a
    backbone fall back to :func:`e2mc.checkpoints.load_backbone` (features only)."""
    from e2mc.checkpoints import load_backbone, load_checkpoint, read_sidecar
    from e2mc.checkpoints.io import UntrustedCheckpointError
    from e2mc.checkpoints.strict import CheckpointMismatchError
    from e2mc.errors import CorruptFileError

    def load(path: Path) -> tuple[nn.Module, nn.Module | None, dict[str, Any]]:
        if read_sidecar(path) is not None:  # export-backbone's file: a backbone, no method
            _features_only(f"note: {path}: an exported backbone")
            backbone, _, info = load_backbone(path, trust=trust)
            return backbone, None, dict(info)
        try:
            method, info = load_checkpoint(path, trust=trust)
            return method.backbone, method, dict(info)
        except (UntrustedCheckpointError, CheckpointMismatchError, CorruptFileError):
            raise
        except ValueError as err:
            backbone, _, info = load_backbone(path, trust=trust)
            _features_only(_STARTING_WEIGHTS.format(path) if info.get("format") == "backbone"
                           else f"warning: {path}: no full method ({err})")
            return backbone, None, dict(info)

    return load


def module_loader(module: nn.Module, trust: bool = False) -> Loader:
    """The ``loader`` of :func:`analyze` for runs of ``e2mc.training.continue_module``: each
    checkpoint's method rebuilt around a copy of your backbone ``module``
    (:func:`e2mc.checkpoints.user_module.method_around`), so its embeddings and collapse checks
    are analysed as for a model built by name."""
    from e2mc.checkpoints.user_module import load_into_module, method_around

    def load(path: Path) -> tuple[nn.Module, nn.Module | None, dict[str, Any]]:
        backbone, dim, info = load_into_module(path, module, trust)
        if dim is None:  # the module's own state dict: your starting weights, no heads
            _features_only(_STARTING_WEIGHTS.format(path))
            return backbone, None, dict(info)
        method, info = method_around(path, module, trust)
        return method.backbone, method, dict(info)

    return load


def _without_fresh_heads(src: RunSource, backbone: nn.Module, method: nn.Module | None,
                         info: dict[str, Any]) -> tuple[nn.Module, nn.Module | None,
                                                        dict[str, Any]]:
    """A run's step 0 whose heads started new (``--new-heads``): its projector embeddings are
    those of random heads and mean nothing, so only its backbone features are analysed."""
    init = (info.get("run_config") or {}).get("init") or {}
    if method is not None and info.get("step") == 0 and init.get("new_heads"):
        print(f"note: {src.checkpoint}: step 0 of a run whose heads started new (random "
              "weights): analysing backbone features only", file=sys.stderr)
        return backbone, None, info
    return backbone, method, info


def _default_knn_k(samples: int, labels: torch.Tensor | None) -> int:
    """:data:`DEFAULT_KNN_K`, or fewer where the sampled images are few: less than the smallest
    class's images (a majority among more neighbours than a class has is never that class,
    and the chance signal would cry collapse), less than the images; said in a note."""
    k = samples - 1
    counts = None if labels is None else torch.bincount(labels[labels >= 0])
    if counts is not None and bool((counts > 0).any()):
        k = min(k, int(counts[counts > 0].min()) - 1)
    if k >= DEFAULT_KNN_K:
        return DEFAULT_KNN_K
    k = max(k, 1)
    print(f"note: {samples} images sampled: the far neighbour is the {k}-th, fewer than a "
          f"class's images, not the {DEFAULT_KNN_K}-th (--knn-k sets it)", file=sys.stderr)
    return k


def _sample(dataset: Dataset, num_samples: int | None, seed: int) -> Dataset:
    n = len(dataset)  # type: ignore[arg-type]
    if num_samples is None or num_samples >= n:
        return dataset
    gen = torch.Generator().manual_seed(seed)
    return LabeledSubset(dataset, torch.randperm(n, generator=gen)[:num_samples].sort().values)


def _collapse_signals(src: RunSource, method: nn.Module | None,
                      embeddings: torch.Tensor | None, labels: torch.Tensor | None,
                      neighbors: torch.Tensor) -> list[dict[str, Any]]:
    """:func:`e2mc.diagnostics.collapse.check_run` on the run's logged base loss (last 20
    records of ``metrics.jsonl``) and its projector embeddings, and the chance signal of its
    backbone features' ``neighbors`` among the analysed images (with ``labels``); each signal
    also printed."""
    from e2mc.diagnostics.collapse import chance_signal, check_run, collapse_value, read_term

    signals = []
    if method is not None:
        name, hparams = getattr(method, "name", ""), getattr(method, "hparams", {})
        target = collapse_value(name, hparams)
        losses = read_term(src.metrics, target.term) if target and src.metrics else None
        signals = check_run(name, hparams, losses, embeddings)
    if labels is not None and (found := chance_signal(labels, neighbors)) is not None:
        signals.append(found)
    for signal in signals:
        print(f"warning: {src.name}: possible collapse ({signal.kind} signal): "
              f"{signal.message}", file=sys.stderr)
    return [asdict(signal) for signal in signals]


#: Logged numbers that time the run rather than describe its training.
_TIMING = ("images_per_s", "val/seconds")


def _training_curves(run: RunDiagnostics, src: RunSource, records: list[dict[str, Any]],
                     out: Path) -> None:
    """The run's training loss terms and learning rate (``loss_NAME.png``) and its validation
    monitor (``monitor_NAME.png``: the run's own ``monitor.png``, which marks the kept step,
    else drawn from the ``val/`` records), each captioned with what it shows."""
    terms = loss_terms(records)
    run.loss_change = loss_change(terms)
    shown = [k for k in terms if k not in _TIMING
             and not (k == "skipped_steps" and not any(terms[k][1]))]
    training = [k for k in shown if not k.startswith("val/")]  # the monitor's metrics apart
    monitor = [k for k in shown if k.startswith("val/")]
    if training:
        logged = len({s for k in training for s in terms[k][0]})
        run.figures.append((f"training: loss terms and learning rate against step ({logged} "
                            "logged step(s))", plot_loss_terms(
                                records, out / f"loss_{src.name}.png", title=src.name,
                                keys=training)))
    caption = ("validation monitor (held-out training images): kNN and linear-probe top-1 (%), "
               "RankMe and marginal entropy against step")
    if src.monitor_plot is not None:
        copy = out / f"monitor_{src.name}.png"
        atomic_write(copy, lambda f, src=src: f.write(Path(src.monitor_plot).read_bytes()))
        run.figures.append((caption + ", the kept step marked", copy))
    elif monitor:
        run.figures.append((caption, plot_loss_terms(records, out / f"monitor_{src.name}.png",
                                                     title=src.name, keys=monitor)))
    if not terms and src.metrics is not None:  # a run stopped before its first logged step
        run.info["loss terms"] = "none logged yet (empty metrics.jsonl)"


def _knn_accuracy(backbone: nn.Module, train: Dataset, test: Dataset, k: int, batch_size: int,
                  device: str, progress: bool) -> float:
    from e2mc.evaluation import extract_features
    from e2mc.evaluation.knn import knn_classify

    tr_x, tr_y = extract_features(backbone, train, batch_size, device, progress=progress)
    te_x, te_y = extract_features(backbone, test, batch_size, device, progress=progress)
    classes = int(max(tr_y.max(), te_y.max())) + 1  # (labels: numpy arrays)
    result = knn_classify(tr_x, tr_y, te_x, te_y, ks=(min(k, len(tr_x)),), num_classes=classes)
    return float(result[0].top1)


def analyze(runs: Sequence[str | Path], data: str, out_dir: str | Path, *, split: str = "test",
            num_samples: int | None = 2048, image_size: int | None = None,
            batch_size: int = 256, device: str = "cpu", knn_k: int | None = None, seed: int = 0,
            accuracy_curve: bool = False, accuracy_train_samples: int = 5000,
            accuracy_knn_k: int = 20, loader: Loader | None = None, progress: bool = True,
            last: bool = False, names: Sequence[str] | None = None) -> tuple[Path, Path]:
    """Analyse ``runs`` (first = before) on ``num_samples`` seeded images of ``data``/``split``
    and write ``out_dir/{diagnostics.json, report.html, *.png}``; return the JSON and HTML paths.

    ``image_size`` defaults to the size the first model was trained at, else the images' own
    when at most 64 px, else 224. ``accuracy_curve``: kNN top-1 of every per-epoch checkpoint.
    ``last``: a run directory's last step, not its kept model (:func:`resolve_run`). ``names``:
    the runs' names in the report (default: their directory or file names)."""
    from e2mc.data import build_dataset, eval_transform

    if not runs:
        raise ValueError("analyze needs at least one run or checkpoint")
    sources = [resolve_run(r, last) for r in runs]
    if names is not None:
        if len(names) != len(sources) or len(set(names)) != len(names):
            raise ValueError(f"--names needs {len(sources)} distinct names, one per run; got "
                             f"{', '.join(names) or 'none'}")
        for src, name in zip(sources, names, strict=True):
            # it names the run's figures; shown (figures, report) as display_name shows it
            src.name = display_name(safe_name(name, "--names: run name"))
    _unique_names(sources)
    load = loader or default_loader()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    loaded = [_without_fresh_heads(src, *load(src.checkpoint)) for src in sources]
    channels = input_channels(loaded[0][0])
    if image_size is None:  # the size the first model was trained at (or the one it takes),
        image_size = recorded_image_size(loaded[0][2]) or fixed_image_size(loaded[0][0])
    if image_size is None:  # else the images' own
        first = build_dataset(data, split)[0][0]
        image_size = min(first.size) if max(first.size) <= 64 else 224
    for src, (backbone, _, info) in zip(sources, loaded, strict=True):  # before extracting
        arch = info.get("arch") or (info.get("hparams") or {}).get("backbone")
        check_input_size(backbone, image_size, channels,
                         f"{arch} ({src.name})" if isinstance(arch, str) else src.name,
                         "--image-size")
    dataset = _sample(build_dataset(data, split, eval_transform(image_size, channels)),
                      num_samples, seed)
    labels = dataset_labels(dataset, required=False)  # None: the data set has no labels
    labels = None if labels is None else torch.from_numpy(labels)
    if knn_k is None:  # 100, or fewer than a class's images on a small test set
        knn_k = _default_knn_k(len(dataset), labels)  # type: ignore[arg-type]
    if len(dataset) <= knn_k:  # type: ignore[arg-type]
        raise ValueError(f"{len(dataset)} samples are too few for the {knn_k}-th neighbour; "
                         "use more --num-samples or a smaller --knn-k")

    reports: list[RunDiagnostics] = []
    compact, standardized, nn_feat, nn_emb = {}, {}, {}, {}
    # a line as each run's statistics and curves are done, and the figures: the parts between
    # the feature extractions' own lines (seconds each on a CPU)
    steps = progress_bar(total=2 * len(sources) + 1, desc="analysis", unit="part",
                         disable=not progress, every=0)

    def measure(x: torch.Tensor, space: str) -> tuple[Any, torch.Tensor, Any, torch.Tensor]:
        """The statistics, marginal values, 1st/k-th NN distances and neighbours of ``x``."""
        distances, neighbors = nearest_neighbors(x, knn_k)
        nn_x = distances[:, 0], distances[:, -1]
        return (embedding_statistics(x, space, k=knn_k, seed=seed, nn_distances=nn_x),
                marginal_values(x, space), nn_x, neighbors)

    for src, (backbone, method, info) in zip(sources, loaded, strict=True):
        feats, embs = features_and_embeddings(backbone, method, dataset, batch_size, device,
                                              progress, desc=src.name)
        stats = {}
        stats[FEATURES], standardized[src.name], nn_feat[src.name], neighbors = measure(
            feats, "standardized")
        steps.set_postfix_str(f"{src.name}: statistics of the features done", refresh=False)
        steps.update(1)
        if embs is not None:
            stats[EMBEDDINGS], compact[src.name], nn_emb[src.name], _ = measure(
                embs, method.compact_space)  # type: ignore[union-attr]
        run_config = info.get("run_config")
        info = {k: v for k, v in info.items() if isinstance(v, str | int | float | bool)}
        if src.model is not None:
            info["model"] = ("kept model (best.pt)" if src.model.kept else "last step") + \
                (f", step {info['step']}" if "step" in info else "")
        run = RunDiagnostics(src.name, str(src.checkpoint), stats, info)
        if isinstance(run_config, dict):
            run.config_diff = config_differences(run_config)
        run.collapse = _collapse_signals(src, method, embs, labels, neighbors)
        records = read_jsonl(src.metrics, partial_last_line=True) if src.metrics else []
        _training_curves(run, src, records, out)
        reports.append(run)
        steps.set_postfix_str(f"{src.name}: " + ("statistics of the embeddings, " if embs
                                                  is not None else "") + "collapse checks done",
                              refresh=False)
        steps.update(1)

    figures = []
    names = [s.name for s in sources]
    use_embeddings = len(compact) == len(sources)
    # When some run has no method, the figures compare backbone features (standardised).
    vectors = compact if use_embeddings else standardized
    nn_dists = nn_emb if use_embeddings else nn_feat
    kind = EMBEDDINGS if use_embeddings else FEATURES
    dims = {v.shape[1] for v in vectors.values()}
    if len(dims) == 1 and dims.pop() >= 2:
        figures.append((f"2-D marginals of a random pair of {kind}, coloured by position in "
                        f"{names[0]}", plot_marginal_pair(
                            vectors[names[0]], {n: vectors[n] for n in names[1:]},
                            out / "marginals.png", before_name=names[0], seed=seed)))
    figures.append((f"distances to the 1st and {knn_k}th nearest neighbour ({kind}, cosine)",
                    plot_nn_histograms({n: nn_dists[n] for n in names}, out / "nn_distances.png",
                                       k=knn_k)))
    if accuracy_curve and any(s.epoch_checkpoints for s in sources):
        train = _sample(build_dataset(data, "train", eval_transform(image_size, channels)),
                        accuracy_train_samples, seed)
        curves = []
        for src in (s for s in sources if s.epoch_checkpoints):
            accs = [_knn_accuracy(load(path)[0], train, dataset, accuracy_knn_k, batch_size,
                                  device, progress) for _, path in src.epoch_checkpoints]
            curves.append((src.name, [epoch for epoch, _ in src.epoch_checkpoints], accs))
        figures.append((f"kNN top-1 (k={accuracy_knn_k}, {len(train)} training images as the "
                        "bank) of each per-epoch checkpoint against continued epoch",
                        plot_accuracy_curves(curves, out / "accuracy.png",
                                             ylabel="kNN top-1 (%)")))
        extra = {"accuracy": {n: {"epochs": e, "top1": a} for n, e, a in curves}}
    else:
        extra = {}
    extra["settings"] = {"data": data, "split": split, "num_samples": len(dataset),
                         "image_size": image_size, "channels": channels, "knn_k": knn_k,
                         "seed": seed}
    written = write_report(out, reports, figures, title="e2mc diagnostics", extra=extra)
    steps.set_postfix_str("figures and report written", refresh=False)
    steps.update(1)
    steps.close()
    return written
