"""Collapse detection (e2mc.diagnostics.collapse): the collapse values are what the methods' own
losses give on collapsed outputs; the warning fires on constructed collapsed runs (uniform
prototype scores, rank-one embeddings) through the real trainer and stays silent on the shipped
VICReg base."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest
import torch

import e2mc
from e2mc.diagnostics.collapse import (
    chance_signal,
    check_run,
    collapse_value,
    leave_one_out_top1,
    loss_signal,
    rank_signal,
    read_term,
)
from e2mc.methods.vicreg import VICREG_VARIANCE_FLOOR
from e2mc.training.collapse_monitor import CollapseMonitor

ASSET = Path(e2mc.__file__).resolve().parent / "assets" / "demo_base_vicreg.pt"


# ----------------------------------------------------------------------------- the values
def test_collapse_values_are_the_methods_losses_on_collapsed_outputs() -> None:
    from e2mc.methods.simsiam import simsiam_loss
    from e2mc.methods.vicreg import vicreg_loss

    assert collapse_value("swav", {"n_prototypes": 100}).value == pytest.approx(math.log(100))
    assert collapse_value("swav", {"n_prototypes": 100}).term == "base/swav"
    constant = torch.ones(16, 8) * 0.3  # every image the same embedding
    _, terms = vicreg_loss(constant, constant.clone())
    assert float(terms["variance"]) == pytest.approx(VICREG_VARIANCE_FLOOR, abs=1e-6)
    assert collapse_value("vicreg").value == pytest.approx(0.99)
    z = torch.randn(1, 8).repeat(16, 1)
    assert float(simsiam_loss(z, z, z, z)) == pytest.approx(collapse_value("simsiam").value,
                                                            abs=1e-6)
    assert collapse_value("generic") is None


def test_loss_signal_needs_the_whole_window_pinned() -> None:
    target = collapse_value("swav", {"n_prototypes": 100})
    ln_k = math.log(100)
    pinned = [5.0, 4.9, ln_k + 0.01, ln_k - 0.02, ln_k, ln_k + 0.03]
    signal = loss_signal(pinned, target, window=4)
    assert signal is not None and signal.kind == "loss" and "ln 100" in signal.message
    assert loss_signal(pinned, target, window=5) is None  # 4.9 is outside the tolerance
    learning = [4.6, 4.4, 4.1, 3.8, 3.5, 3.3]
    assert loss_signal(learning, target, window=3) is None
    assert loss_signal(pinned[:2], target, window=4) is None  # too few values
    with pytest.raises(ValueError):
        loss_signal(pinned, target, window=0)


def test_rank_signal_on_rank_one_and_constant_embeddings_only() -> None:
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(256, 1, generator=gen)
    v = torch.randn(1, 128, generator=gen)
    for collapsed in (a @ v + 3.0, torch.full((256, 128), 0.7)):
        signal = rank_signal(collapsed)
        assert signal is not None and signal.kind == "rank" and signal.value < 1.01
    assert rank_signal(torch.randn(256, 128, generator=gen)) is None
    # three directions of about equal spread: effective rank ~3, above the threshold 2 of a
    # 128-d space, below a threshold of 10
    three = torch.randn(256, 3, generator=gen) @ torch.linalg.qr(
        torch.randn(128, 3, generator=gen))[0].T
    assert rank_signal(three) is None
    assert rank_signal(three, min_rank=10).value == pytest.approx(3.0, abs=0.1)
    with pytest.raises(ValueError):
        rank_signal(torch.randn(1, 4))


# ----------------------------------------------------------------------------- a real SwAV
def _collapsed_swav(rank_one: bool) -> torch.nn.Module:
    """cnn5_small SwAV whose prototypes are all the same vector (every score equal: a uniform
    prediction, loss ln K) and, with ``rank_one``, whose projection head ends in a rank-one
    layer (every embedding on one line)."""
    from e2mc.methods import build_method

    torch.manual_seed(0)
    method = build_method("swav", backbone="cnn5_small", in_channels=1, hidden_dim=32,
                          output_dim=16, n_prototypes=10, freeze_prototypes_iters=10_000,
                          queue_length=0, n_crops=[2])
    with torch.no_grad():
        method.prototypes.weight.copy_(torch.ones(10, 16) / 4.0)
        if rank_one:
            last = method.projection_head[-1]
            last.weight.copy_(torch.randn(16, 1) @ torch.randn(1, last.weight.shape[1]))
            last.bias.zero_()
    return method


def test_uniform_prototype_scores_give_exactly_ln_k() -> None:
    method = _collapsed_swav(rank_one=False)
    views = [torch.randn(8, 1, 28, 28), torch.randn(8, 1, 28, 28)]
    out = method(views)
    assert float(out.loss.detach()) == pytest.approx(math.log(10), abs=1e-5)


def _train(run_dir: Path, method: torch.nn.Module, monitor: CollapseMonitor, name: str,
           lr: float, limit: int, batch: int, epochs: int, recipe: str | None = None) -> list:
    from e2mc.addons import build_addon
    from e2mc.config import load_config
    from e2mc.training.build import build_train_dataset
    from e2mc.training.trainer import Trainer

    cfg = load_config(f"fmnist-{name}-pretrain", [
        f"training.batch_size={batch}", f"training.epochs={epochs}", "training.log_every=1",
        "training.progress=false", "data.num_workers=0", f"data.limit={limit}",
        f"optim.base_lr={lr}", "optim.warmup_epochs=0", "training.device=cpu"])
    if recipe is not None:
        cfg.data.recipe = recipe
    dataset = build_train_dataset(cfg, method)
    trainer = Trainer(method, build_addon("none"), dataset, cfg, run_dir, callbacks=[monitor])
    result = trainer.fit()
    assert result.completed
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("rank_one", [False, True])
def test_monitor_warns_once_on_a_collapsed_swav_run(tmp_path: Path, rank_one: bool) -> None:
    method = _collapsed_swav(rank_one)
    stream = io.StringIO()
    monitor = CollapseMonitor("swav", method.hparams, window=3, warmup_steps=0, probe_size=32,
                              stream=stream)
    records = _train(tmp_path / "run", method, monitor, "swav", lr=0.1, limit=64, batch=16,
                     epochs=2, recipe="simsiam")
    text = stream.getvalue()
    assert text.count("warning: possible collapse") == 1, text  # once, not every step
    assert "loss signal" in text and "ln 10" in text  # the loss is pinned from the first step
    warned = [r for r in records if "collapse/warning" in r]
    assert len(warned) == 1 and warned[0]["collapse/loss"] == pytest.approx(math.log(10), abs=1e-3)
    assert monitor.state_dict() == {"warned": ["loss"]}
    # the rank signal on its own (the loss signal switched off by a target the loss never hits)
    if rank_one:
        monitor2 = CollapseMonitor("swav", {"n_prototypes": 100000}, window=3, warmup_steps=0,
                                   probe_size=32, stream=io.StringIO())
        _train(tmp_path / "run2", _collapsed_swav(True), monitor2, "swav", lr=0.1, limit=64,
               batch=16, epochs=1, recipe="simsiam")
        assert monitor2.warned == ["rank"]
        assert "effective rank of the projector embeddings" in monitor2.stream.getvalue()


# ----------------------------------------------------------------------------- the shipped base
def _base_embeddings() -> tuple[torch.nn.Module, torch.Tensor]:
    from torch.utils.data import Subset

    from e2mc.checkpoints import load_checkpoint
    from e2mc.data import build_dataset, eval_transform
    from e2mc.evaluation.features import features_and_embeddings

    method, _ = load_checkpoint(ASSET)
    test = Subset(build_dataset("builtin", "test", eval_transform(28, 1)), range(256))
    _, embeddings = features_and_embeddings(method.backbone, method, test, progress=False)
    return method, embeddings


def test_silent_on_the_shipped_vicreg_base(tmp_path: Path) -> None:
    method, embeddings = _base_embeddings()
    assert rank_signal(embeddings) is None
    # its own variance term on two augmented views of training images, as training logs it
    from e2mc.data import MultiViewDataset, build_dataset, build_views
    from e2mc.methods.vicreg import vicreg_loss

    views_ds = MultiViewDataset(build_dataset("builtin", "train"), build_views("vicreg", 28, 1))
    torch.manual_seed(0)
    pairs = [views_ds[i][0] for i in range(128)]
    method.eval()
    with torch.no_grad():
        x = method.projector(method.backbone(torch.stack([p[0] for p in pairs])))
        y = method.projector(method.backbone(torch.stack([p[1] for p in pairs])))
    _, terms = vicreg_loss(x, y)
    variance = [float(terms["variance"])] * 20
    target = collapse_value("vicreg")
    assert variance[0] < target.value - 2 * target.tolerance  # measured 0.66, floor 0.99
    assert check_run("vicreg", method.hparams, variance, embeddings) == []
    # and through the trainer: a few continued steps from the base, the monitor stays silent
    stream = io.StringIO()
    monitor = CollapseMonitor("vicreg", method.hparams, window=2, warmup_steps=0, probe_size=64,
                              stream=stream)
    records = _train(tmp_path / "run", method, monitor, "vicreg", lr=0.01, limit=64, batch=32,
                     epochs=1)
    assert stream.getvalue() == "" and monitor.warned == []
    assert not any("collapse/warning" in r for r in records)
    assert len(read_term(tmp_path / "run" / "metrics.jsonl", "base/variance")) == 2


# ----------------------------------------------------------------------------- e2mc analyze
def test_analyze_flags_the_collapsed_run_and_not_the_shipped_base(tmp_path: Path) -> None:
    from e2mc.checkpoints import save_checkpoint
    from e2mc.diagnostics.analyze import analyze

    run = tmp_path / "collapsed"
    run.mkdir()
    save_checkpoint(run / "checkpoint.pt", _collapsed_swav(rank_one=True), epoch=2)
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"step": 5 * i, "loss": math.log(10), "base/swav": math.log(10)}) + "\n"
        for i in range(1, 30)))
    json_path, html_path = analyze([str(ASSET), str(run)], "builtin", tmp_path / "out",
                                   num_samples=200, knn_k=20, progress=False)
    runs = {r["name"]: r for r in json.loads(json_path.read_text())["runs"]}
    assert runs["demo_base_vicreg"]["collapse"] == []
    assert sorted(c["kind"] for c in runs["collapsed"]["collapse"]) == ["loss", "rank"]
    assert "Possible collapse" in html_path.read_text()


def test_leave_one_out_top1_and_the_chance_signal_on_known_neighbours() -> None:
    labels = torch.tensor([0, 0, 1, 1, 1])
    same = torch.tensor([[1, 2], [0, 3], [3, 4], [2, 4], [2, 3]])  # ties: the smaller label
    assert leave_one_out_top1(labels, same) == 100.0
    other = torch.tensor([[2, 3], [3, 4], [0, 1], [0, 1], [0, 1]])
    assert leave_one_out_top1(labels, other) == 0.0
    assert leave_one_out_top1(labels, torch.tensor([[1, 2]] * 5)) == 40.0  # 0 for everyone
    # chance is the most common label's share (60 % here): 100 % is far from it, 40 % at it
    assert chance_signal(labels, same) is None
    found = chance_signal(labels, other)
    assert found is not None and found.kind == "chance"
    assert (found.value, found.threshold) == (0.0, 60.0)
    assert "0.00 %, at or near chance (60.00 %" in found.message
    assert chance_signal(torch.zeros(5, dtype=torch.long), other) is None  # one class


def test_analyze_names_the_run_whose_features_are_at_chance(tmp_path: Path) -> None:
    """A model whose backbone ignores its input (every weight zero: one feature vector for
    every image) is flagged, by name, beside the shipped base, which is not."""
    from e2mc.checkpoints import load_checkpoint, save_checkpoint
    from e2mc.diagnostics.analyze import analyze

    method, _ = load_checkpoint(ASSET)
    with torch.no_grad():
        for p in method.backbone.parameters():
            p.zero_()
    save_checkpoint(tmp_path / "blind.pt", method, epoch=1)
    json_path, html_path = analyze([str(ASSET), str(tmp_path / "blind.pt")], "builtin",
                                   tmp_path / "out", num_samples=200, knn_k=20, progress=False)
    runs = {r["name"]: r for r in json.loads(json_path.read_text())["runs"]}
    assert runs["demo_base_vicreg"]["collapse"] == []
    chance = [c for c in runs["blind"]["collapse"] if c["kind"] == "chance"]
    assert len(chance) == 1 and chance[0]["value"] <= chance[0]["threshold"] + 9.0
    page = html_path.read_text()
    heading = page[page.index("Possible collapse"):page.index("</ul>", page.index(
        "Possible collapse"))]
    assert "<b>blind</b> (chance signal)" in heading and "demo_base_vicreg" not in heading


# ----------------------------------------------------------------------------- e2mc continue
def test_continue_from_a_collapsed_checkpoint_warns_once(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    """The monitor is wired into run_training (e2mc pretrain / continue) with its defaults:
    the loss signal after the first epoch and a 20-step window."""
    from e2mc.checkpoints import save_checkpoint
    from e2mc.config import load_config
    from e2mc.training.run import run_training

    start = tmp_path / "collapsed.pt"
    save_checkpoint(start, _collapsed_swav(rank_one=False), epoch=4)
    cfg = load_config("fmnist-swav-continued", [
        f"init.checkpoint={start}", "method.params.hidden_dim=32",
        "method.params.output_dim=16", "method.params.n_prototypes=10",
        "method.params.freeze_prototypes_iters=10000", "method.params.queue_length=0",
        "training.batch_size=16", "training.epochs=7", "data.limit=64", "training.log_every=1",
        "training.progress=false", "data.num_workers=0", "training.device=cpu",
        "training.keep_epoch_checkpoints=false", "init.load_optimizer=false"])
    result = run_training(cfg, tmp_path / "run")
    assert result.completed
    err = capsys.readouterr().err
    assert err.count("warning: possible collapse") == 1, err
    assert "base/swav has stayed at 2.3026" in err  # ln 10
    records = read_term(tmp_path / "run" / "metrics.jsonl", "collapse/warning")
    assert records == [1.0]


def test_check_run_needs_a_full_window_of_losses() -> None:
    ln_k = math.log(100)
    assert check_run("swav", {"n_prototypes": 100}, [ln_k] * 5, None, window=20) == []
    found = check_run("swav", {"n_prototypes": 100}, [ln_k] * 20, None, window=20)
    assert [s.kind for s in found] == ["loss"]
