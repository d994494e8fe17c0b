"""The analyze workflow on tiny models and the shipped data: run resolution, pairing, outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from e2mc.diagnostics.analyze import (
    EMBEDDINGS,
    FEATURES,
    analyze,
    input_channels,
    resolve_run,
)
from e2mc.evaluation.features import features_and_embeddings
from e2mc.methods import build_method


def tiny_backbone() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 8, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(2),
                         nn.Flatten())


def tiny_vicreg(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return build_method("vicreg", backbone=tiny_backbone(), feature_dim=32, projector="16-16")


def _run_dir(root: Path) -> Path:
    run = root / "run"
    (run / "checkpoints").mkdir(parents=True)
    for name in ("checkpoint.pt", "checkpoints/epoch_0001.pt", "checkpoints/epoch_0002.pt"):
        (run / name).write_bytes(b"")
    lines = [json.dumps({"step": s, "epoch": s // 3, "loss": 1.0 / (s + 1), "entropy": -0.3})
             for s in range(6)]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return run


def test_resolve_run(tmp_path):
    run = _run_dir(tmp_path)
    src = resolve_run(run)
    assert src.name == "run" and src.checkpoint == run / "checkpoint.pt"
    assert src.metrics == run / "metrics.jsonl"
    assert [e for e, _ in src.epoch_checkpoints] == [1, 2]
    (run / "checkpoint.pt").unlink()
    assert resolve_run(run).checkpoint == run / "checkpoints" / "epoch_0002.pt"
    assert resolve_run(run / "checkpoints" / "epoch_0001.pt").name == "epoch_0001"
    with pytest.raises(ValueError, match="no checkpoint.pt"):
        resolve_run(tmp_path)
    with pytest.raises(ValueError, match="neither"):
        resolve_run(tmp_path / "missing")


@pytest.mark.parametrize("batch_size", [3, 4, 10])
def test_compute_vectors_takes_the_methods_embedding_and_restores_modes(batch_size):
    method = tiny_vicreg(0).train()
    images = torch.randn(10, 1, 12, 12)
    data = torch.utils.data.TensorDataset(images, torch.zeros(10))
    rows: list[int] = []
    hook = method.backbone.register_forward_hook(lambda _m, i, _o: rows.append(len(i[0])))
    feats, embs = features_and_embeddings(method.backbone, method, data,
                                          batch_size=batch_size, progress=False)
    hook.remove()
    sizes = [min(batch_size, 10 - start) for start in range(0, 10, batch_size)]
    assert sum(rows) == sum(max(4, b + b % 2) for b in sizes)  # once each, plus padding
    assert method.training  # restored
    method.eval()
    with torch.no_grad():
        torch.testing.assert_close(feats, method.backbone(images))
        torch.testing.assert_close(embs, method.projector(method.backbone(images)))
    assert input_channels(method.backbone) == 1


def test_analyze_writes_paired_report(tmp_path):
    run = _run_dir(tmp_path)
    before_file = tmp_path / "base.pt"
    before_file.write_bytes(b"")
    models = {before_file: tiny_vicreg(0), run / "checkpoint.pt": tiny_vicreg(1),
              run / "checkpoints" / "epoch_0001.pt": tiny_vicreg(2),
              run / "checkpoints" / "epoch_0002.pt": tiny_vicreg(3)}
    same = tmp_path / "same.pt"  # a second copy of the base model: identical numbers expected
    same.write_bytes(b"")
    models[same] = models[before_file]

    def loader(path: Path):
        method = models[Path(path)]
        return method.backbone, method, {"epoch": 0}

    out = tmp_path / "out"
    json_path, html_path = analyze(
        [before_file, run, same], "builtin", out, num_samples=120, knn_k=10,
        accuracy_curve=True, accuracy_train_samples=100, accuracy_knn_k=5, loader=loader,
        progress=False, batch_size=64)
    data = json.loads(json_path.read_text(encoding="utf-8"))
    names = [r["name"] for r in data["runs"]]
    assert names == ["base", "run", "same"]
    stats = {r["name"]: r["statistics"] for r in data["runs"]}
    assert set(stats["run"]) == {FEATURES, EMBEDDINGS}
    assert stats["run"][EMBEDDINGS]["dim"] == 16 and stats["run"][FEATURES]["dim"] == 32
    assert stats["run"][EMBEDDINGS]["space"] == "hypercube"
    assert stats["run"][FEATURES]["space"] == "standardized"
    assert stats["base"] == stats["same"]  # same images, same model
    assert stats["base"] != stats["run"]
    assert data["settings"]["num_samples"] == 120 and data["settings"]["image_size"] == 28
    assert data["settings"]["channels"] == 1
    assert data["accuracy"]["run"]["epochs"] == [1, 2]
    assert all(0 <= a <= 100 for a in data["accuracy"]["run"]["top1"])
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == ["accuracy.png", "loss_run.png", "marginals.png", "nn_distances.png"]
    page = html_path.read_text(encoding="utf-8")
    assert all(name in page for name in pngs)
    assert all(p.stat().st_size > 1000 for p in out.glob("*.png"))


def test_analyze_rejects_too_few_samples(tmp_path):
    ckpt = tmp_path / "m.pt"
    ckpt.write_bytes(b"")
    method = tiny_vicreg(0)
    with pytest.raises(ValueError, match="too few"):
        analyze([ckpt], "builtin", tmp_path / "o", num_samples=20, knn_k=100,
                loader=lambda p: (method.backbone, method, {}), progress=False)


def test_training_curves_and_the_validation_monitor_are_separate_figures(tmp_path,
                                                                          monkeypatch):
    """The monitor's val/ metrics are not captioned as loss terms: the loss figure holds the
    training terms (no timing panels), the monitor figure the val/ metrics; the run's own
    monitor.png (which marks the kept step) is used when it has one."""
    run = _run_dir(tmp_path)
    records = [{"step": 0, "epoch": 0, "val/knn": 62.5, "val/rankme": 77.1, "val/seconds": 0.3},
               {"step": 4, "epoch": 0, "loss": 19.7, "lr": 0.003, "images_per_s": 140.0,
                "skipped_steps": 0},
               {"step": 4, "epoch": 1, "val/knn": 62.0, "val/rankme": 77.3, "val/seconds": 0.2}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    model = tiny_vicreg(0)

    def loader(path: Path):
        return model.backbone, model, {"epoch": 0}

    seen = {}

    def analysed(out: Path) -> dict:
        json_path, _ = analyze([run], "builtin", out, num_samples=60, knn_k=5, loader=loader,
                               progress=False, batch_size=64)
        return json.loads(json_path.read_text(encoding="utf-8"))["runs"][0]["figures"]

    import e2mc.diagnostics.analyze as workflow

    real = workflow.plot_loss_terms

    def spy(records, path, **kwargs):
        seen[Path(path).name] = kwargs["keys"]
        return real(records, path, **kwargs)

    monkeypatch.setattr(workflow, "plot_loss_terms", spy)
    figures = analysed(tmp_path / "a")
    assert seen == {"loss_run.png": ["loss", "lr"], "monitor_run.png": ["val/knn", "val/rankme"]}
    assert list(figures.values()) == ["loss_run.png", "monitor_run.png"]
    captions = list(figures)
    assert captions[0].startswith("training: loss terms and learning rate against step (1 ")
    assert captions[1].startswith("validation monitor") and "loss" not in captions[1]
    (run / "monitor.png").write_bytes((tmp_path / "a" / "nn_distances.png").read_bytes())
    figures = analysed(tmp_path / "b")
    assert (tmp_path / "b" / "monitor_run.png").read_bytes() == (run / "monitor.png").read_bytes()
    assert list(figures)[1].endswith("the kept step marked")
