"""``e2mc analyze`` through the real entry point on tiny project checkpoints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import e2mc
from e2mc.checkpoints import export_backbone, save_checkpoint
from e2mc.methods import build_method


def _cli(*args: str) -> subprocess.CompletedProcess:
    src = str(Path(e2mc.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [src, *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run([sys.executable, "-m", "e2mc", *args], env=env, capture_output=True,
                          text=True, timeout=300)


def _model(seed: int):
    torch.manual_seed(seed)
    return build_method("vicreg", backbone="resnet18", small_images=True, in_channels=1,
                        projector="32-32")


@pytest.mark.slow  # integration: a few seconds on 2 cores
def test_analyze_cli_end_to_end(tmp_path):
    base = tmp_path / "base.pt"
    save_checkpoint(base, _model(0))
    run = tmp_path / "e2mc_run"
    save_checkpoint(run / "checkpoint.pt", _model(1))
    (run / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "epoch": 0, "loss": 2.0 - s * 0.1, "entropy": -0.2})
                + "\n" for s in range(5)), encoding="utf-8")
    exported = tmp_path / "backbone_only.pth"
    export_backbone(_model(2), exported)
    out = tmp_path / "out"
    proc = _cli("analyze", str(base), str(run), str(exported), "--data", "builtin", "--out",
                str(out), "--num-samples", "64", "--knn-k", "8", "--image-size", "16",
                "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert "report.html" in proc.stdout
    assert "backbone features only" in proc.stderr  # the exported file has no projector
    data = json.loads((out / "diagnostics.json").read_text(encoding="utf-8"))
    kinds = {r["name"]: sorted(r["statistics"]) for r in data["runs"]}
    assert kinds == {"base": ["backbone features", "projector embeddings"],
                     "e2mc_run": ["backbone features", "projector embeddings"],
                     "backbone_only": ["backbone features"]}
    feats = data["runs"][0]["statistics"]["backbone features"]
    assert feats["dim"] == 512 and feats["num_samples"] == 64
    assert data["settings"]["image_size"] == 16 and data["settings"]["channels"] == 1
    page = (out / "report.html").read_text(encoding="utf-8")
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == ["loss_e2mc_run.png", "marginals.png", "nn_distances.png"]
    assert all(name in page for name in pngs)


def test_analyze_cli_reports_bad_input(tmp_path):
    proc = _cli("analyze", str(tmp_path / "missing.pt"), "--data", "builtin", "--out",
                str(tmp_path / "o"))
    assert proc.returncode != 0
    assert "neither a run directory nor a checkpoint file" in proc.stderr
