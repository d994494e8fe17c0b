"""A run's answer is its kept model (issue 25): every command given a run directory takes
``best.pt`` when keep-best wrote one, says so, and records it; ``--last`` takes the last step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from e2mc.artifacts import EvalDir, RunDir
from e2mc.cli import main
from helpers import TINY_RUN, tiny_base


@pytest.fixture(scope="module")
def kept_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """``(start checkpoint, data, run)``: a keep-best run in which no later step can beat the
    start (``monitor.min_delta`` 1000 points), so ``best.pt`` is the starting model."""
    root = tmp_path_factory.mktemp("kept")
    start, data = tiny_base(root, n_test=24)
    run = root / "run"
    sets = [*TINY_RUN, "monitor.every=2", "monitor.probe_epochs=2", "monitor.knn_k=3",
            "monitor.min_delta=1000", "training.max_steps=4", "optim.base_lr=0.5"]
    assert main(["continue", "--config", "fmnist-vicreg-e2mc", "--from", str(start),
                 "--data", str(data), "--out", str(run), "--val-split", "0.2",
                 "--keep-best", "val/knn", *[a for s in sets for a in ("--set", s)]]) == 0
    return start, data, run


def _eval(ref: Path | str, data: Path, out: Path, *extra: str) -> EvalDir:
    assert main(["eval", str(ref), "--data", str(data), "--protocol", "knn", "--knn-k", "5",
                 "--no-cache", "--quiet", "--out", str(out), *extra]) == 0
    assert EvalDir(out).load().info["image_size"] == 16  # the size the run trained at (the
    # start file records none: it is given --image-size 16)
    return EvalDir(out)


def _values(d: EvalDir) -> list[float]:
    return [e.value for e in d.load().entries]


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)["model"]


def test_eval_of_a_run_directory_scores_its_kept_model(kept_run, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture) -> None:
    start, data, run = kept_run
    files = RunDir(run)
    assert torch.load(files.best, weights_only=True)["step"] == 0
    assert all(torch.equal(a, b) for a, b in zip(_weights(start).values(),
                                                 _weights(files.best).values(), strict=True))
    capsys.readouterr()
    kept = _eval(run, data, tmp_path / "kept")
    assert "the run's kept model (keep-best's best.pt; --last takes the last step)" in \
        capsys.readouterr().err
    assert _values(kept) == _values(_eval(start, data, tmp_path / "start", "--image-size", "16"))
    assert kept.load().info["model"] == {"file": str(files.best), "step": 0, "kept_model": True}
    last = _eval(run, data, tmp_path / "last", "--last")
    assert "the run's last step (--last; keep-best kept best.pt)" in capsys.readouterr().err
    assert _values(last) == _values(_eval(files.checkpoint, data, tmp_path / "file"))
    assert last.load().info["model"] == {"file": str(files.checkpoint), "step": 4,
                                         "kept_model": False}
    assert not all(torch.equal(a, b) for a, b in zip(_weights(start).values(),
                                                     _weights(files.checkpoint).values(),
                                                     strict=True))  # the last step moved


def test_export_analyze_and_continue_take_the_kept_model(kept_run, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    from e2mc.checkpoints import load_checkpoint

    start, data, run = kept_run
    assert main(["export-backbone", str(run), str(tmp_path / "b.pt")]) == 0
    sidecar = json.loads((tmp_path / "b.pt.json").read_text())
    assert sidecar["model"] == {"file": str(RunDir(run).best), "step": 0, "kept_model": True}
    exported = torch.load(tmp_path / "b.pt", weights_only=True)
    backbone = load_checkpoint(start)[0].backbone.state_dict()
    assert exported.keys() == backbone.keys()
    assert all(torch.equal(exported[k], backbone[k]) for k in backbone)
    assert main(["export-backbone", str(run), str(tmp_path / "l.pt"), "--last"]) == 0
    assert json.loads((tmp_path / "l.pt.json").read_text())["model"]["step"] == 4
    capsys.readouterr()
    assert main(["analyze", str(run), "--data", str(data), "--out", str(tmp_path / "a"),
                 "--num-samples", "20", "--knn-k", "3", "--image-size", "16",
                 "--quiet", "--names", "kept"]) == 0
    assert "the run's kept model" in capsys.readouterr().err
    report = json.loads((tmp_path / "a" / "diagnostics.json").read_text())
    assert "best.pt" in json.dumps(report) and "kept model (best.pt), step 0" in json.dumps(report)
    assert '"kept"' in json.dumps(report)  # the run's name given with --names
    assert main(["analyze", str(run), "--data", str(data), "--out", str(tmp_path / "b"),
                 "--names", "a,b"]) == 2
    assert "--names needs 1 distinct names, one per run" in capsys.readouterr().err
    # continue --from RUN starts from its kept model
    sets = [*TINY_RUN, "training.max_steps=1"]
    assert main(["continue", "--config", "fmnist-vicreg-continued", "--from", str(run),
                 "--data", str(data), "--out", str(tmp_path / "next"),
                 *[a for s in sets for a in ("--set", s)]]) == 0
    assert f"starting model: {RunDir(run).best} (the kept model of run {run}" in \
        capsys.readouterr().err
