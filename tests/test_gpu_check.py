"""The GPU check's benchmark script (benchmarks/gpu_check.py) end to end at its quick size on
the CPU, so that the script a GPU session runs has run before: every stage measured (none
failed), the JSON holds what the table shows, and the table names the device and torch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.mark.slow  # about 35 s on 2 cores: three short trainings, an extraction, the probes
def test_the_gpu_check_runs_every_stage_at_its_quick_size(tmp_path: Path, capsys) -> None:
    import gpu_check

    code = gpu_check.main(["--quick", "--device", "cpu", "--out", str(tmp_path), "--workers",
                           "1", "--criterion-repeats", "5", "--tests", "3 passed"])
    out = capsys.readouterr().out
    assert code == 0, out
    result = json.loads((tmp_path / "gpu-check.json").read_text())
    assert result["device"]["name"] == "CPU" and result["device"]["torch"]
    training = result["training"]
    assert training["bound"]["images_per_s"] > 0
    assert set(training["pipelines"]) == {"pil", "fast", "device"}
    for row in training["pipelines"].values():
        assert row["images_per_s"] > 0 and row["steps"] == 6
    assert [r["shape"] for r in result["criterion"]] == ["tiny"]
    assert result["extraction"]["images"] == 16 * 7
    assert result["probes"]["batched_heads"] == 9
    table = (tmp_path / "gpu-check.md").read_text()
    assert table in out and "GPU check on CPU (cpu), torch " in table
    assert "| `e2mc continue`, data.pipeline=device |" in table
    assert "| gpu tests | 3 passed" in table


def test_time_to_answer_scales_each_measured_stage_to_imagenet(tmp_path: Path, capsys) -> None:
    """The probes and kNN at their toy size: each prediction is the measured time scaled by
    the work (rows x epochs x width x classes; queries x bank x width), and the table adds the
    stages up to the 1 % answer."""
    import time_to_answer as tta

    out = tmp_path / "tta.json"
    assert tta.main(["--quick", "--device", "cpu", "--stages", "probes,knn", "--out",
                     str(out)]) == 0
    result = json.loads(out.read_text())
    size, imagenet = result["sizes"], result["imagenet"]
    one = result["linear_1"]
    work = (round(0.01 * imagenet["train"]) * 100 * imagenet["dim"] * imagenet["classes"]) / (
        size["probe_rows"] * size["probe_epochs"] * size["dim"] * size["classes"])
    assert one["predicted_s"] == pytest.approx(one["measured_s"] * work)
    assert one["share_of_bound"] > 0 and one["heads"] == 3 and one["epochs"] == 100
    knn = result["knn"]
    assert knn["predicted_s"] == pytest.approx(knn["measured_s"] * (
        imagenet["val"] * imagenet["train"] * imagenet["dim"])
        / (size["knn_queries"] * size["knn_bank"] * size["dim"]))
    table = out.with_suffix(".md").read_text()
    assert "| linear 1 %, 3 seeds |" in table and "linear 100 % on its own: " in table
    assert table in capsys.readouterr().out
