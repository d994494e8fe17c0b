"""``benchmarks/reproduce_fashion_mnist.py --quick`` end to end on the shipped Fashion-MNIST subset
(and a tiny generated transfer set), then again to check that finished work is skipped."""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import e2mc

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "reproduce_fashion_mnist.py"
DOCS_RESULTS = REPO / "docs" / "results.md"


def _digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    src = str(Path(e2mc.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          env=env, timeout=600, cwd=REPO)


def _primary(record: dict, column: str) -> list[float]:
    return [e["metrics"][e["primary"]] for e in record["entries"] if e["column"] == column]


@pytest.mark.slow
def test_quick_reproduction_end_to_end_and_resumable(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    transfer = tmp_path / "digits.npz"
    np.savez(transfer, x_train=rng.integers(0, 256, (60, 28, 28), dtype=np.uint8),
             y_train=np.arange(60) % 10, x_test=rng.integers(0, 256, (40, 28, 28), dtype=np.uint8),
             y_test=np.arange(40) % 10)
    out = tmp_path / "repro"
    docs_before = _digest(DOCS_RESULTS)
    # VICReg (Table 1, the ablation, the epoch curves) and SwAV (Table 3's criteria): every
    # stage and table kind; SimSiam would add rows of VICReg's kind only
    args = ["--quick", "--data", "builtin", "--transfer-data", str(transfer), "--out", str(out),
            "--cpu-threads", "1", "--methods", "vicreg,swav"]
    first = _run(args)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    for stage in ("bases", "continue", "eval", "ablation", "epochs", "diagnostics", "report"):
        assert f"stage {stage}" in first.stdout
    assert _digest(DOCS_RESULTS) == docs_before, "--quick must not touch docs/results.md"

    result = json.loads((out / "results.json").read_text())
    assert result["quick"] is True and result["continued_epochs"] == 1
    columns = ["linear 1%", "linear 10%", "linear 100%", "knn k=20", "transfer"]
    assert result["columns"] == columns
    # The random-init floor first: the base run's epoch-0 checkpoint, before any step.
    expected_rows = {"vicreg": ["random init", "base", "continued", "+E2MC"],
                     "swav": ["random init", "base", "continued", "+E2MC", "+VCReg", "+AUH",
                              "+MMCR"]}
    for method, rows in expected_rows.items():
        assert list(result["table1"][method]) == rows
        assert result["base_epochs"][method] == 2
        for row in rows:
            for column in columns:
                cell = result["table1"][method][row][column]
                assert 0.0 <= cell["mean"] <= 100.0 and math.isfinite(cell["mean"])

    # The table is the evaluation run directories' numbers (one training and label seed).
    ev = json.loads((out / "eval" / "main" / "vicreg" / "e2mc-s0" / "results.json").read_text())
    assert ev["seeds"] == [0] and ev["fractions"] == [0.01, 0.1, 1.0]
    for column in columns[:4]:
        assert result["table1"]["vicreg"]["+E2MC"][column]["mean"] == pytest.approx(
            float(np.mean(_primary(ev, column))))
    floor = json.loads((out / "eval" / "main" / "vicreg" / "random-init" / "results.json"
                        ).read_text())
    assert Path(floor["checkpoint"]).name == "epoch_0000.pt"
    assert result["table1"]["vicreg"]["random init"]["linear 1%"]["mean"] == pytest.approx(
        float(np.mean(_primary(floor, "linear 1%"))))
    assert list(result["tests"]["vicreg"])[0] == "base vs random init"
    # A paired test per column, and its difference is the difference of the table cells.
    summary = result["tests"]["vicreg"]["+E2MC vs continued"]["summary"]
    for column in columns:
        t = summary[column]
        assert t["pairs"] == 1 and 0.0 <= t["min_mcnemar_p"] <= 1.0
        table = result["table1"]["vicreg"]
        assert t["difference"]["mean"] == pytest.approx(
            table["+E2MC"][column]["mean"] - table["continued"][column]["mean"])
    assert set(result["claim"]) == {"vicreg", "swav"}

    ablation = result["ablation"]
    assert ablation["method"] == "vicreg"
    assert [(r["beta_x"], r["gamma_x"]) for r in ablation["rows"]] == [(0, 0), (1, 0), (0, 1),
                                                                      (1, 1)]
    assert [(r["beta"], r["gamma"]) for r in ablation["rows"]][1:] == [(1000, 0), (0, 100),
                                                                      (1000, 100)]
    # (1, 1) x the preset is the +E2MC run itself: same checkpoint, same 1% probe.
    assert ablation["rows"][3]["linear 1%"]["mean"] == pytest.approx(
        result["table1"]["vicreg"]["+E2MC"]["linear 1%"]["mean"])

    assert [p["epoch"] for p in result["base_curves"]["vicreg"]] == [0, 1, 2]
    long_runs = result["epoch_curves"]["vicreg"]
    assert set(long_runs) == {"continued", "e2mc"}
    assert [p["epoch"] for p in long_runs["e2mc"]] == [0, 1, 2]
    assert set(result["diagnostics"]) == {"vicreg", "swav"}

    md = (out / "results.md").read_text()
    for heading in ("Table 1", "Table 3 (swav)", "Paired tests", "Table A.2",
                    "What we measured and what it means"):
        assert heading in md
    assert "--quick" in md and "Quick mode" in md
    # the page says the commit and the torch version it was produced with
    # (tests/test_docs_provenance.py)
    import torch

    assert result["torch"] == torch.__version__
    if (REPO / ".git").exists():  # a copy without git records no commit, and says so
        assert result["commit"] and \
            f"` at commit {result['commit']} with torch {torch.__version__} (see" in md
    figures = sorted((out / "figures").glob("*.png"))
    assert len(figures) == 2 + 2 * 2
    assert all(0 < f.stat().st_size < 200_000 for f in figures)
    for f in figures:
        assert f"figures/{f.name}" in md

    checkpoints = {p: p.stat().st_mtime_ns for p in out.rglob("checkpoint.pt")}
    second = _run(args)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "  train " not in second.stdout and "skip (done)" in second.stdout
    assert {p: p.stat().st_mtime_ns for p in out.rglob("checkpoint.pt")} == checkpoints
    again = json.loads((out / "results.json").read_text())
    assert again["table1"] == result["table1"]


@pytest.mark.slow  # integration: a few seconds on 2 cores
def test_bad_arguments_are_reported(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from reproduce_fashion_mnist import main  # the script's entry point, in this process

    assert main(["--quick", "--methods", "moco", "--out", str(tmp_path / "x"),
                 "--stages", "report"]) == 2
    assert "unknown method" in capsys.readouterr().err
    assert main(["--quick", "--stages", "bases,train", "--out", str(tmp_path / "x")]) == 2
    assert "unknown stage" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
def test_a_method_beyond_the_paper_runs_with_the_generic_probes(tmp_path: Path) -> None:
    """results/new-methods.md's path: a method the paper did not run, its preset's own backbone,
    probed with the generic settings (the paper gives probe settings for its three only)."""
    out = tmp_path / "new"
    proc = _run(["--quick", "--methods", "barlowtwins", "--out", str(out),
                 "--stages", "bases,continue,eval,report"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((out / "results.json").read_text())
    assert list(result["table1"]["barlowtwins"]) == ["random init", "base", "continued", "+E2MC"]
    ev = json.loads((out / "eval" / "main" / "barlowtwins" / "e2mc-s0" / "results.json"
                     ).read_text())
    assert ev["method_preset"] == "generic"
    config = (out / "bases" / "barlowtwins" / "config.yaml").read_text()
    assert "barlowtwins" in config and "cnn5_small" in config
    summary = result["tests"]["barlowtwins"]["+E2MC vs continued"]["summary"]
    assert summary["linear 1%"]["pairs"] == 1


def test_e2mc_overrides_reach_only_the_e2mc_runs(tmp_path: Path) -> None:
    from repro.runs import continue_config
    from repro.settings import ReproSettings

    s = ReproSettings(out=tmp_path, continue_overrides=["optim.base_lr=0.0123"],
                      e2mc_overrides=["addon.params.beta=7", "addon.params.gamma=0"])
    start = tmp_path / "checkpoint.pt"
    e2mc_cfg = continue_config(s, "vicreg", "e2mc", 0, 2, start)
    none_cfg = continue_config(s, "vicreg", "none", 0, 2, start)
    assert (e2mc_cfg.addon.params["beta"], e2mc_cfg.addon.params["gamma"]) == (7.0, 0.0)
    assert none_cfg.addon.name == "none" and "beta" not in none_cfg.addon.params
    assert e2mc_cfg.optim.base_lr == none_cfg.optim.base_lr == 0.0123
    # a criterion with a preset of its own takes it (fmnist-vicreg-sigreg), another one the
    # continued preset with its default parameters
    sigreg_cfg = continue_config(s, "vicreg", "sigreg", 0, 2, start)
    assert (sigreg_cfg.name, sigreg_cfg.addon.params["weight"]) == ("fmnist-vicreg-sigreg", 0.05)
    vcreg_cfg = continue_config(s, "vicreg", "vcreg", 0, 2, start)
    assert (vcreg_cfg.name, vcreg_cfg.addon.name) == ("fmnist-vicreg-continued", "vcreg")


def test_addons_restrict_the_criteria_of_the_continued_runs(tmp_path: Path) -> None:
    from repro.settings import ReproSettings

    assert ReproSettings().addons_of("swav") == ("none", "e2mc", "vcreg", "uniformity", "mmcr")
    assert ReproSettings(addons=("e2mc",)).addons_of("swav") == ("none", "e2mc")
    # --addons names the criteria of every method, beyond its defaults (the SIGReg study)
    assert ReproSettings(addons=("mmcr",)).addons_of("vicreg") == ("none", "mmcr")
    assert ReproSettings(addons=("e2mc", "sigreg", "vcreg")).addons_of("simsiam") == (
        "none", "e2mc", "sigreg", "vcreg")
    with pytest.raises(ValueError, match="--addons"):
        ReproSettings(out=tmp_path, addons=("byol",)).validate()


def test_the_paper_regime_script_makes_a_valid_study(tmp_path) -> None:
    """scripts/paper-regime.sh (run on a GPU machine; issue 43) prints the study it runs: the
    harness's own parser takes it, and its settings are the paper's regime."""
    import shlex

    import reproduce_fashion_mnist as harness

    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PAPER_REGIME_DRY": "1", "OUT": str(tmp_path / "out"),  # its python:
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])}
    done = subprocess.run([str(repo / "scripts" / "paper-regime.sh"), "PATH/TO/fashion-mnist",
                           "PATH/TO/mnist"], env=env, capture_output=True, text=True, check=True)
    argv = shlex.split(done.stdout)
    assert argv[:2] == ["python", "benchmarks/reproduce_fashion_mnist.py"]
    s = harness.settings_from(harness.parser().parse_args(argv[2:]))
    assert (s.batch_size, s.image_size, s.backbone, s.device) == (2048, 32, "resnet18", "cuda")
    assert s.methods == ("vicreg",) and s.transfer_data == "PATH/TO/mnist"
    assert "method.params.projector=8192-8192-8192" in s.base_overrides
    assert "method.params.projector=8192-8192-8192" in s.continue_overrides
    assert (s.seeds, s.label_seeds) == ((0, 1, 2), (0, 1, 2))


def test_the_pages_words_follow_the_packages_one_verdict_rule() -> None:
    """A comparison significant pooled (p 0.0012) but at only 4 of 9 pairs is "better", as
    `e2mc compare` says (the SIGReg page's +E2MC row at 1 %); one pair: that pair's tests."""
    from repro.page import _verdict

    pooled = {"pairs": 9, "significant_better": 4, "significant_worse": 0, "pooled_p": 0.0012,
              "difference": {"mean": 1.33}}
    assert _verdict(pooled) == "better"
    assert _verdict({**pooled, "difference": {"mean": -1.13}}) == "worse"
    assert _verdict({**pooled, "pooled_p": 0.43}) == "n.s."
    one = {"pairs": 1, "significant_better": 1, "significant_worse": 0, "pooled_p": None,
           "difference": {"mean": 2.4}}
    assert _verdict(one) == "better" and _verdict({**one, "significant_better": 0}) == "n.s."
