"""One path from a checkpoint (file, URL, ``builtin:NAME`` or run directory) to an evaluation
directory, :func:`evaluate_checkpoint`, which every command evaluates through."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2mc.artifacts import EvalDir, EvalResults, run_model
from e2mc.errors import InputError
from e2mc.evaluation.features import FeatureCache
from e2mc.evaluation.runner import EvalOptions, run_evaluation


@dataclass(frozen=True)
class EvalData:
    """The training and test data set specs (``test`` None: ``train``'s test split), cut to the
    first ``train_limit`` / ``test_limit`` images, or that many drawn with ``limit_seed``."""

    train: str
    test: str | None = None
    train_limit: int | None = None
    test_limit: int | None = None
    limit_seed: int | None = None
    skip_corrupt: bool = False

    def datasets(self, image_size: int, channels: int) -> tuple[Any, Any]:
        from e2mc.data import build_dataset, eval_transform

        transform = eval_transform(image_size, channels)
        train = build_dataset(self.train, "train", transform, skip_corrupt=self.skip_corrupt)
        test = build_dataset(self.test or self.train, "test", transform,
                             skip_corrupt=self.skip_corrupt)
        _check_same_classes(train, test, self.train, self.test or self.train)
        return (_limit(train, self.train_limit, self.limit_seed),
                _limit(test, self.test_limit, self.limit_seed))

    def image_size(self) -> int:
        """The size of the training images (:func:`e2mc.data.shape.image_shape`)."""
        from e2mc.data import build_dataset
        from e2mc.data.shape import image_shape

        return image_shape(build_dataset(self.train, "train",
                                         skip_corrupt=self.skip_corrupt)).size

    def id(self, image_size: int, channels: int, named: bool = True) -> str:
        """The evaluation's ``data`` (and the cache's data id),
        ``TRAIN|TEST|size=S|ch=C[|skip-corrupt][|train:N|test:M[|seeded-S]]``; ``named``
        False: ``*`` for the specs (the content identity says what the images are), as the
        stamp holds it."""
        cut = self.train_limit is not None or self.test_limit is not None
        subset = f"train:{self.train_limit}|test:{self.test_limit}" if cut else ""
        if self.limit_seed is not None:
            subset += f"|seeded-{self.limit_seed}"
        specs = [self.train, self.test or self.train] if named else ["*", "*"]
        return "|".join([*specs, f"size={image_size}", f"ch={channels}",
                         *(["skip-corrupt"] if self.skip_corrupt else []),
                         *([subset] if subset else [])])


def _limit(dataset: Any, limit: int | None, seed: int | None) -> Any:
    import numpy as np

    from e2mc.data import LabeledSubset

    if limit is None or limit >= len(dataset):
        return dataset
    if seed is None:
        return LabeledSubset(dataset, range(limit))
    return LabeledSubset(dataset, np.sort(np.random.default_rng(seed).permutation(
        len(dataset))[:limit]))


def _check_same_classes(train: object, test: object, train_spec: str, test_spec: str) -> None:
    """``train`` and ``test`` must number the same classes alike (else an ``InputError``)."""
    a, b = getattr(train, "classes", None), getattr(test, "classes", None)
    if a is not None and b is not None and list(a) != list(b):
        only = sorted(set(map(str, b)) - set(map(str, a))) or sorted(set(map(str, a)) - set(
            map(str, b))) or ["the same names in another order"]
        raise InputError(f"--test-data {test_spec} has other classes than --data {train_spec} "
                         f"({', '.join(only[:5])}); its labels would not mean the same classes")


@dataclass(frozen=True)
class ModelSpec:
    """How to read a checkpoint: ``arch``, ``small_images``, ``in_channels`` (checked against
    the first layer), ``trust`` (``torch.load(weights_only=False)``), ``last`` (a run's last
    step, not its kept model), ``module`` (your backbone, for :func:`evaluate_module`)."""

    arch: str | None = None
    small_images: bool = False
    in_channels: int | None = None
    trust: bool = False
    last: bool = False
    module: Any = None


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)  # the sys.stderr of the call (a capture, a redirect)


@dataclass
class _Loaded:
    """A checkpoint argument resolved and its backbone loaded."""

    named: str  # what the caller gave: a file, URL, builtin:NAME or run directory
    chosen: Any  # artifacts.RunModel (None for a URL)
    path: str  # the file read
    backbone: Any
    feature_dim: int
    info: dict[str, Any]
    channels: int
    size: int


def _load(checkpoint: str | os.PathLike[str], model: ModelSpec, image_size: int | None,
          log: Callable[[str], None], data: EvalData | None = None) -> _Loaded:
    from e2mc.checkpoints import is_url, load_backbone, local_checkpoint, recorded_image_size
    from e2mc.models import check_input_size, fixed_image_size

    named = os.fspath(checkpoint)
    chosen = run_model(named, model.last)
    _refuse_live_run(named, chosen)
    if chosen is not None and chosen.from_directory:
        log(f"model: {chosen.describe()}")
    # the file read: the run directory's model, the file named, or a URL's local copy
    path = str(chosen.path) if chosen is not None else local_checkpoint(named)
    if model.module is not None:  # a run built around the caller's own module
        from e2mc.checkpoints import checkpoint_summary
        from e2mc.checkpoints.user_module import load_into_module

        backbone, feature_dim, info = load_into_module(path, model.module, model.trust)
        info = checkpoint_summary(info, path)  # plain values, as load_backbone's
    else:
        backbone, feature_dim, info = load_backbone(
            named if is_url(named) else path, arch=model.arch, small_images=model.small_images,
            in_channels=model.in_channels or 3, trust=model.trust)
    channels = _model_channels(backbone, model, path, info, log)
    if info.get("format") in ("backbone", "module") and "exported" not in info:
        log(f"model: {path}: starting weights, a plain state dict (not trained by e2mc)")
    size = image_size or recorded_image_size(info)
    if size is None:
        size = fixed_image_size(backbone)
        which = "the size the model takes"
        if size is None and data is not None:
            size, which = data.image_size(), f"the size of the images of {data.train}"
        elif size is None:
            size, which = 224, "ImageNet's size"
        log(f"note: {path} records no training image size; evaluating at {size} px, {which} "
            "(--image-size sets it)")
    # before any image is read: a size the model cannot take is one error line
    arch = info.get("arch") or (info.get("hparams") or {}).get("backbone")
    check_input_size(backbone, size, channels, arch if isinstance(arch, str) else path,
                     "--image-size")
    if feature_dim is None:  # your module's own weights: its output size on these images
        from e2mc.models.input_size import pooled_dim

        feature_dim = pooled_dim(backbone, channels, size)
    return _Loaded(named, chosen, path, backbone, feature_dim, info, channels, size)


def _refuse_live_run(named: str, chosen: Any) -> None:
    """``InputError`` for a run directory (or its ``checkpoint.pt`` / ``best.pt``) another
    process still trains: its latest step would be recorded as the run's end."""
    from e2mc.artifacts import BEST, CHECKPOINT, describe_holder, live_writer

    if chosen is None or not (chosen.from_directory or chosen.path.name in (CHECKPOINT, BEST)):
        return
    root = Path(named) if chosen.from_directory else chosen.path.parent
    writer = live_writer(root)
    if writer is not None and writer.get("pid") != os.getpid():
        raise InputError(f"{root} is still being trained ({describe_holder(writer)}): its "
                         f"{chosen.path.name} is a step in the middle of the run, not its end; "
                         "evaluate it once the run has ended")


def _stamp(loaded: _Loaded, data: EvalData, options: EvalOptions, train: Any, test: Any
           ) -> dict[str, Any]:
    """What an evaluation directory was made from: checkpoint bytes, data identity, the content
    identities of the data sets (``train_data``, ``test_data``, as results.json records them)
    and the options."""
    from e2mc.data.identity import data_identity
    from e2mc.files import sha256_file

    return {"checkpoint_sha256": sha256_file(loaded.path),
            "data_id": data.id(loaded.size, loaded.channels, named=False),
            "train_data": data_identity(train), "test_data": data_identity(test),
            # the options that decide the numbers (not progress, workers or device)
            "options": repr(dataclasses.replace(options, progress=True, num_workers=None,
                                                device="any"))}


#: The share of test images the training split may hold (by content) before an evaluation is
#: refused: a split mistake shares far more; public data sets hold a few exact duplicates.
LEAK_SHARE = 0.01


def _check_no_leak(train: Any, test: Any, data: EvalData, log: Callable[[str], None]
                   ) -> dict[str, Any]:
    """``{"test_in_train": N}``, the test images the training split also holds by content; more
    than :data:`LEAK_SHARE` of them is an ``InputError``, fewer a warning."""
    from e2mc.data.identity import shared_items

    shared = shared_items(train, test)
    if shared:
        said = (f"{shared} of the {len(test)} test images of {data.test or data.train} are "
                f"also images of the training split of {data.train} (by content)")
        if shared > LEAK_SHARE * len(test):
            raise InputError(f"{said}: the probes would be scored on images they were trained "
                             "on; give a training split without the test images")
        log(f"warning: {said}; each can move a top-1 by one image")
    return {"test_in_train": shared}


def _matching(out: str | os.PathLike[str], stamp: dict[str, Any]) -> EvalResults | None:
    record = EvalDir(out).load() if EvalDir(out).exists() else None
    return record if record is not None and record.info.get("stamp") == stamp else None


def is_evaluated(checkpoint: str | os.PathLike[str], out: str | os.PathLike[str],
                 data: EvalData, options: EvalOptions, *, model: ModelSpec = ModelSpec(),
                 image_size: int | None = None, **_: Any) -> bool:
    """Whether ``out`` holds what :func:`evaluate_checkpoint` (same arguments) would write."""
    if not EvalDir(out).exists():
        return False
    loaded = _load(checkpoint, model, image_size, log=lambda _: None, data=data)
    train, test = data.datasets(loaded.size, loaded.channels)
    stamp = _stamp(loaded, data, options, train, test)
    return _matching(out, stamp) is not None


def evaluate_checkpoint(checkpoint: str | os.PathLike[str], out: str | os.PathLike[str],
                        data: EvalData, options: EvalOptions, *,
                        model: ModelSpec = ModelSpec(), image_size: int | None = None,
                        cache: FeatureCache | str | os.PathLike[str] | None = None,
                        reuse: bool = False, extra_record: dict[str, Any] | None = None,
                        log: Callable[[str], None] = _stderr) -> EvalResults | None:
    """Evaluate the backbone of ``checkpoint`` on ``data`` into ``out``, holding its writer
    lock from before anything is loaded; returns what it holds (None off the main process).
    ``reuse``: read ``out`` back when its stamp matches."""
    from contextlib import nullcontext

    from e2mc.artifacts import writer_lock
    from e2mc.checkpoints import is_url
    from e2mc.distributed import is_main_process

    options = _resolved(options)  # under torchrun: joins the group, then rank 0 takes the lock
    with writer_lock(out) if is_main_process() else nullcontext():
        loaded = _load(checkpoint, model, image_size, log, data)
        train, test = data.datasets(loaded.size, loaded.channels)
        leak = _check_no_leak(train, test, data, log)
        stamp = _stamp(loaded, data, options, train, test)
        if reuse and (record := _matching(out, stamp)) is not None:
            log(f"  read (same checkpoint bytes, data content and options): {out}")
            return record
        if cache is not None and not isinstance(cache, FeatureCache):
            cache = FeatureCache(cache)
        named, path, chosen, info = loaded.named, loaded.path, loaded.chosen, loaded.info
        run_evaluation(
            loaded.backbone, loaded.feature_dim, train, test, out, options,
            data_id=data.id(loaded.size, loaded.channels), checkpoint=path, cache=cache,
            lock=False, extra_record={
                "checkpoint": named if is_url(named) else path, "checkpoint_file": path,
                "model": chosen.record(info.get("step")) if chosen else None,
                "checkpoint_info": info, "image_size": loaded.size, "device": options.device,
                "stamp": stamp, "train_data": stamp["train_data"],
                "test_data": stamp["test_data"], **leak, **(extra_record or {})})
    return EvalDir(out).load() if is_main_process() else None


def _resolved(options: EvalOptions) -> EvalOptions:
    """``device="auto"`` resolved where the evaluation runs (a job on a GPU node, say)."""
    if options.device != "auto":
        return options
    from e2mc.distributed import init_runtime

    return dataclasses.replace(options, device=str(init_runtime("auto").device))


def _model_channels(backbone: Any, model: ModelSpec, path: str, info: dict[str, Any],
                    log: Callable[[str], None]) -> int:
    """The model's input channels, checked against ``model.in_channels``."""
    from e2mc.models import input_channels

    recorded = (info.get("hparams") or {}).get("backbone")
    if model.arch not in (None, recorded) and info.get("format") != "backbone":  # (else: used)
        log(f"warning: --arch {model.arch} is ignored: {path} is a "
            f"{info.get('format', 'e2mc')} checkpoint, which records its architecture "
            f"({recorded or 'see the file'})")
    channels = input_channels(backbone)
    if model.in_channels is not None and model.in_channels != channels:
        raise InputError(f"--in-channels {model.in_channels} does not fit {path}, "
                         f"whose first layer takes {channels} channel(s)")
    return channels


def default_cache_dir() -> Path:
    """The feature cache of ``e2mc eval``: ``$E2MC_CACHE`` or ``~/.cache/e2mc/features``."""
    return Path(os.environ.get("E2MC_CACHE") or Path.home() / ".cache" / "e2mc" / "features")


def evaluate_module(module: Any, run: str | os.PathLike[str], data: EvalData | str,
                    out: str | os.PathLike[str], options: EvalOptions | None = None, *,
                    image_size: int | None = None, last: bool = False,
                    cache: FeatureCache | str | os.PathLike[str] | None = None
                    ) -> EvalResults | None:
    """Evaluate a run of :func:`e2mc.training.continue_module`, which the commands cannot
    rebuild: its weights are loaded into a copy of ``module``; ``data`` is a spec or an
    :class:`EvalData`. Writes and prints what ``e2mc eval`` does; returns the results."""
    from e2mc.evaluation.results import result_lines

    results = evaluate_checkpoint(run, out, data if isinstance(data, EvalData)
                                  else EvalData(data), options or EvalOptions(),
                                  model=ModelSpec(module=module, last=last),
                                  image_size=image_size, cache=cache)
    if results is not None:
        print(*result_lines(results), f"wrote {EvalDir(out).results}", sep="\n")
    return results
