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
