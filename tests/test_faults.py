"""Fault injection: SIGKILL at chosen and at random points of a training run (during every kind
of write: checkpoint.pt, the epoch copies, best.pt, a metrics.jsonl line; between steps; at a
random time), then resume, and check against an uninterrupted run: nothing missing or
duplicated (checkpoints, epoch copies, metrics lines), no temporary file left, and bit-identical
weights, optimizer state, epoch copies, best.pt and logged losses. Also results.json and the
feature cache killed mid-write, and a truncated feature-cache entry.

The runs are forked from a forkserver with torch and e2mc loaded (no interpreter start-up,
no autograd state of the test process: :func:`helpers.child_processes`) and train a tiny method
for 18 steps, so the whole module takes seconds. ``FAULT_STATS`` collects the numbers printed at the
end (kills tried, resumes bit-identical, files checked).
"""

from __future__ import annotations

import io
import os
import random
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import e2mc.files as ckio
from e2mc.artifacts import EvalDir, RunDir, read_jsonl
from e2mc.config import RunConfig
from e2mc.distributed import Runtime
from e2mc.methods.base import MethodOutput, SSLMethod
from e2mc.training.callbacks import Callback
from e2mc.training.logging import MetricsLogger
from e2mc.training.trainer import Trainer
from helpers import child_processes

CHILDREN = child_processes()
pytestmark = pytest.mark.skipif(CHILDREN is None, reason="needs forkserver (POSIX)")
EPOCHS, BATCH, IMAGES = 3, 4, 24  # 6 steps per epoch, 18 steps
TOTAL_STEPS = EPOCHS * IMAGES // BATCH
FAULT_STATS: Counter[str] = Counter()


# ----------------------------------------------------------------------------- the tiny run
class Tiny(SSLMethod):
    """Linear encoder with BatchNorm (so that buffers are checked too), VICReg-like loss."""

    name = "tiny"

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.backbone = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8))
        self.feature_dim = 8
        self.hparams = {}

    def forward(self, views):
        z = [self.backbone(v) for v in views]
        loss = (z[0] - z[1]).pow(2).mean() + torch.relu(1 - z[0].std(0)).mean()
        return MethodOutput(loss=loss, terms={"invariance": loss.detach()}, embeddings=z)

    def build_optimizer(self, lr, weight_decay, **kw):
        return torch.optim.SGD(self.parameters(), lr=lr, momentum=0.9, weight_decay=weight_decay)


class Pairs(torch.utils.data.Dataset):
    """Two noisy views per item; the noise comes from the per-item seeded generator."""

    def __init__(self) -> None:
        self.x = torch.randn(IMAGES, 4, generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return IMAGES

    def __getitem__(self, i):
        return [self.x[i] + 0.1 * torch.randn(4), self.x[i] + 0.1 * torch.randn(4)], 0


class BestLoss(Callback):
    """Keeps ``best.pt`` at the lowest loss so far, through the trainer's save_model (the path
    the keep-best callback writes best.pt by); its state is resumed from the checkpoint."""

    name = "best_loss"

    def __init__(self) -> None:
        self.best: float | None = None

    def on_step_end(self, trainer, step, run_epoch, terms):
        loss = float(terms["loss"].detach())
        if self.best is None or loss < self.best:
            self.best = loss
            trainer.save_model(trainer.run.best, run_epoch, step)
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best = state["best"]


#: The add-ons the runs are made with: none, and SIGReg, whose random directions come from the
#: run's seeded generator (restored from checkpoint.pt's ``rng`` on resume).
ADDONS = {"none": {}, "sigreg": {"weight": 0.1, "num_slices": 16}}


def _trainer(run_dir: Path, addon: str = "none") -> Trainer:
    from e2mc.addons import build_addon

    cfg = RunConfig()
    cfg.training.batch_size, cfg.training.epochs, cfg.training.log_every = BATCH, EPOCHS, 1
    cfg.training.checkpoint_every_steps, cfg.training.progress = 4, False
    cfg.optim.base_lr, cfg.optim.lr_scaling = 0.05, "none"
    return Trainer(Tiny(), build_addon(addon, **ADDONS[addon]), Pairs(), cfg, run_dir,
                   runtime=Runtime(torch.device("cpu")), callbacks=[BestLoss()])


def _kind(path: Any) -> str:
    name = Path(path).name
    if name.startswith("epoch_"):
        return "epoch"
    return {"checkpoint.pt": "checkpoint", "best.pt": "best", "metrics.jsonl": "metrics",
            "results.json": "results"}.get(name, "cache" if name.endswith(".npz") else name)


def _install_kill(target: tuple[str, int] | None, step_delay: float = 0.0) -> None:
    """In a forked child: SIGKILL itself halfway through the ``n``-th write of ``kind``
    (the temporary file holds half the bytes; the target is not replaced), or after step n
    (``kind == "step"``); ``step_delay`` slows every step (for kills from outside)."""
    counts: Counter[str] = Counter()
    original = ckio.atomic_write

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    def atomic_write(path, write, mode="wb"):
        kind = _kind(path)
        counts[kind] += 1
        if target == (kind, counts[kind]):
            buf: Any = io.BytesIO() if "b" in mode else io.StringIO()
            write(buf)
            data = buf.getvalue()

            def half(f):
                f.write(data[: max(1, len(data) // 2)])
                f.flush()
                os.fsync(f.fileno())
                die()

            return original(path, half, mode)
        return original(path, write, mode)

    ckio.atomic_write = atomic_write
    log = MetricsLogger.log

    def logged(self, step, metrics):
        counts["metrics"] += 1
        if target == ("metrics", counts["metrics"]) and self._file is not None:
            import json

            line = json.dumps({"step": int(step), **{k: float(v) if hasattr(v, "item") else v
                                                     for k, v in metrics.items()}}) + "\n"
            self._file.write(line[: len(line) // 2])
            self._file.flush()
            die()
        return log(self, step, metrics)

    MetricsLogger.log = logged  # type: ignore[method-assign]
    step_end = BestLoss.on_step_end

    def on_step_end(self, trainer, step, run_epoch, terms):
        out = step_end(self, trainer, step, run_epoch, terms)
        if step_delay:
            time.sleep(step_delay)
        if target == ("step", step):
            die()
        return out

    BestLoss.on_step_end = on_step_end  # type: ignore[method-assign]


def _child_train(run_dir: str, target: tuple[str, int] | None, step_delay: float,
                 addon: str) -> None:
    torch.set_num_threads(1)
    _install_kill(target, step_delay)
    _trainer(Path(run_dir), addon).fit()


def _run_killed(run_dir: Path, addon: str, target: tuple[str, int] | None = None,
                kill_after_s: float | None = None, step_delay: float = 0.0) -> int:
    """Train in a forked child that is killed as ``target`` / ``kill_after_s`` say; returns its
    exit code (-9 when killed)."""
    assert CHILDREN is not None
    proc = CHILDREN.Process(target=_child_train, args=(str(run_dir), target, step_delay, addon))
    proc.start()
    if kill_after_s is not None:
        proc.join(kill_after_s)
        if proc.is_alive():
            os.kill(proc.pid, signal.SIGKILL)
    proc.join(60)
    assert not proc.is_alive()
    FAULT_STATS["kills tried"] += 1
    if proc.exitcode == -signal.SIGKILL:
        FAULT_STATS["kills landed"] += 1
    return proc.exitcode


# ----------------------------------------------------------------------------- checks
def _load(path: Path) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=True)


def _same_tensors(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(
            _same_tensors(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same_tensors(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _check_like_reference(run_dir: Path, ref: Path) -> None:
    """Everything the uninterrupted run wrote is there once, bit-identical; no temp files."""
    run, reference = RunDir(run_dir), RunDir(ref)
    leftovers = sorted(p for p in run_dir.rglob("*") if p.name.endswith(".tmp"))
    assert leftovers == [] and run.stale_temp_files() == [], leftovers
    a, b = _load(reference.checkpoint), _load(run.checkpoint)
    assert (b["step"], b["run_epoch"], b["batch_in_epoch"]) == (TOTAL_STEPS, EPOCHS, 0)
    for key in ("model", "optimizer", "callbacks", "skipped_steps"):
        assert _same_tensors(a[key], b[key]), key
    FAULT_STATS["files checked"] += 1
    epochs = [e for e, _ in run.epoch_checkpoints()]
    assert epochs == list(range(EPOCHS + 1)), epochs  # none missing, none extra
    for (_, pa), (_, pb) in zip(reference.epoch_checkpoints(), run.epoch_checkpoints(),
                                strict=True):
        ea, eb = _load(pa), _load(pb)
        assert _same_tensors(ea["model"], eb["model"]) and ea["step"] == eb["step"], pb
        FAULT_STATS["files checked"] += 1
    ba, bb = _load(reference.best), _load(run.best)
    assert _same_tensors(ba["model"], bb["model"]) and ba["step"] == bb["step"]
    FAULT_STATS["files checked"] += 1
    ma, mb = read_jsonl(reference.metrics), read_jsonl(run.metrics)  # a cut line would raise
    assert [m["step"] for m in mb] == list(range(1, TOTAL_STEPS + 1))  # each step once
    assert [m["loss"] for m in ma] == [m["loss"] for m in mb]
    assert [m.get("addon/sigreg") for m in ma] == [m.get("addon/sigreg") for m in mb]
    FAULT_STATS["files checked"] += 1
    FAULT_STATS["resumes bit-identical"] += 1


@pytest.fixture(scope="module", params=list(ADDONS))
def reference(request: pytest.FixtureRequest,
              tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Counter[str], str]:
    """The uninterrupted run, how many writes of each kind it made, and its add-on."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("reference")
    counts: Counter[str] = Counter()
    original = ckio.atomic_write

    def counting(path, write, mode="wb"):
        counts[_kind(path)] += 1
        return original(path, write, mode)

    ckio.atomic_write = counting
    try:
        result = _trainer(root, request.param).fit()
    finally:
        ckio.atomic_write = original
    assert result.completed and result.step == TOTAL_STEPS
    counts["metrics"] = len(read_jsonl(RunDir(root).metrics))
    assert counts["checkpoint"] == 6 and counts["epoch"] == EPOCHS + 1 and counts["best"] >= 3
    if request.param == "sigreg":  # the add-on is on: its statistic is logged every step
        assert all(m["addon/sigreg"] > 0 for m in read_jsonl(RunDir(root).metrics))
    return root, counts, request.param


def _scenarios(counts: Counter[str]) -> list[tuple[str, int]]:
    """Every checkpoint.pt and epoch-copy write, the first, a middle and the last best.pt
    write, three random metrics lines and three random steps (seeded)."""
    rng = random.Random(15)
    out = [("checkpoint", n) for n in range(1, counts["checkpoint"] + 1)]
    out += [("epoch", n) for n in range(1, counts["epoch"] + 1)]
    out += [("best", n) for n in sorted({1, (counts["best"] + 1) // 2, counts["best"]})]
    out += [("metrics", n) for n in sorted(rng.sample(range(1, counts["metrics"] + 1), 3))]
    out += [("step", n) for n in sorted(rng.sample(range(1, TOTAL_STEPS), 3))]
    return out


# ----------------------------------------------------------------------------- the tests
@pytest.mark.slow
def test_kill_during_every_kind_of_write_then_resume(tmp_path: Path, reference) -> None:
    """Every scenario without an add-on; with SIGReg, the kills that its random directions'
    generator state rides on (checkpoint.pt writes and steps): the epoch copies, best.pt and
    metrics lines are written alike with any add-on."""
    ref, counts, addon = reference
    for kind, n in _scenarios(counts):
        if addon != "none" and kind not in ("checkpoint", "step"):
            continue
        run_dir = tmp_path / f"{kind}-{n}"
        assert _run_killed(run_dir, addon, (kind, n)) == -signal.SIGKILL, (kind, n)
        if kind != "step":  # the kill left a half-written temporary file or line behind
            assert RunDir(run_dir).stale_temp_files() or kind == "metrics", (kind, n)
        assert _trainer(run_dir, addon).fit().completed
        _check_like_reference(run_dir, ref)


def test_kills_at_random_times_and_during_resumes(tmp_path: Path, reference) -> None:
    ref, counts, addon = reference
    rng = random.Random(16)
    for i in range(3):  # from outside, at a random time (steps slowed to 20 ms)
        run_dir = tmp_path / f"async-{i}"
        _run_killed(run_dir, addon, kill_after_s=rng.uniform(0.05, 0.4), step_delay=0.02)
        assert _trainer(run_dir, addon).fit().completed
        _check_like_reference(run_dir, ref)
    kinds = ["checkpoint", "epoch", "best", "metrics"]
    for i in range(2):  # killed, resumed and killed again during the resume, resumed
        run_dir = tmp_path / f"twice-{i}"
        first, second = (rng.choice(kinds), 2), (rng.choice(kinds), 2)
        assert _run_killed(run_dir, addon, first) == -signal.SIGKILL
        assert _run_killed(run_dir, addon, second) in (-signal.SIGKILL, 0)
        assert _trainer(run_dir, addon).fit().completed
        _check_like_reference(run_dir, ref)


def _child_write_results(out: str) -> None:
    _install_kill(("results", 1))
    EvalDir(out).write({"entries": [{"protocol": "knn", "column": "knn k=1", "primary": "top1",
                                     "metrics": {"top1": 50.0}, "seed": 0}]})


def _child_extract(root: str) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)  # the backbone the test process extracts with after the kill
    _install_kill(("cache", 1))
    from e2mc.evaluation.features import FeatureCache

    FeatureCache(root).get_or_extract(nn.Linear(4, 3), _Images(), "tiny", num_workers=0,
                                      progress=False)


class _Images(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 10

    def __getitem__(self, i):
        return torch.full((4,), float(i)), i % 2


def test_results_and_feature_cache_killed_mid_write(tmp_path: Path) -> None:
    from e2mc.evaluation.features import FeatureCache

    assert CHILDREN is not None
    out = tmp_path / "eval"
    proc = CHILDREN.Process(target=_child_write_results, args=(str(out),))
    proc.start()
    proc.join(60)
    FAULT_STATS["kills tried"] += 1
    assert proc.exitcode == -signal.SIGKILL and not EvalDir(out).exists()
    assert list(out.glob(".results.json.*.tmp"))  # the killed write's half file
    EvalDir(out).write({"entries": [{"protocol": "knn", "column": "knn k=1", "primary": "top1",
                                     "metrics": {"top1": 50.0}, "seed": 0}]})
    assert EvalDir(out).load().values("knn k=1") == [50.0]
    assert not list(out.glob(".*.tmp"))
    FAULT_STATS["files checked"] += 1

    cache = tmp_path / "cache"
    proc = CHILDREN.Process(target=_child_extract, args=(str(cache),))
    proc.start()
    proc.join(60)
    FAULT_STATS["kills tried"] += 1
    assert proc.exitcode == -signal.SIGKILL and not list(cache.glob("*.npz"))
    stale = list(cache.glob(".*.tmp"))
    assert stale
    hour_ago = time.time() - 3600  # a later run: the killed write is long over
    for p in stale:
        os.utime(p, (hour_ago, hour_ago))
    torch.manual_seed(0)
    backbone = nn.Linear(4, 3)
    x, y, hit = FeatureCache(cache).get_or_extract(backbone, _Images(), "tiny", num_workers=0,
                                                   progress=False)
    assert not hit and x.shape == (10, 3) and not list(cache.glob(".*.tmp"))
    entry = next(cache.glob("*.npz"))
    entry.write_bytes(entry.read_bytes()[: entry.stat().st_size // 2])  # truncated entry
    with pytest.warns(UserWarning, match="stale"):
        x2, _, hit = FeatureCache(cache).get_or_extract(backbone, _Images(), "tiny",
                                                        num_workers=0, progress=False)
    assert not hit and np.array_equal(x, x2)  # rebuilt, same features
    assert FeatureCache(cache).get_or_extract(backbone, _Images(), "tiny", num_workers=0,
                                              progress=False)[2]
    FAULT_STATS["files checked"] += 2


def test_report_fault_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    """Print the module's numbers (shown with ``-s`` or in the summary of a failure)."""
    with capsys.disabled():
        print(f"\nfault injection: {FAULT_STATS['kills tried']} kills tried "
              f"({FAULT_STATS['kills landed']} landed in a training run), "
              f"{FAULT_STATS['resumes bit-identical']} resumes bit-identical, "
              f"{FAULT_STATS['files checked']} files checked")
