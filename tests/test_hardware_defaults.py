"""Defaults that fit the hardware (issue 42): the keys left to ``auto`` (data.pipeline,
training.precision, training.channels_last, data.num_workers) become the fastest choice for
the device and the data, each said with its reason; explicit values are kept."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from e2mc.config import load_config
from e2mc.training import hardware
from e2mc.training.hardware import describe, hardware_choices

AUTO = ["data.pipeline=auto", "training.precision=auto", "training.channels_last=null",
        "data.num_workers=null"]


@pytest.mark.parametrize("bf16", [True, False])
def test_on_cuda_the_device_pipeline_bf16_where_the_gpu_has_it_and_nhwc(monkeypatch,
                                                                        bf16: bool) -> None:
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)
    monkeypatch.setattr(hardware, "available_cores", lambda: 16)
    cfg = load_config("vicreg-e2mc", AUTO)
    chosen = {k: c.value for k, c in hardware_choices(cfg, torch.device("cuda"), True).items()}
    assert chosen == {"data.pipeline": "device", "training.precision": "bf16" if bf16 else "fp16",
                      "training.channels_last": True, "data.num_workers": 15}


def test_on_a_cpu_the_fast_pipeline_for_files_pil_for_arrays_fp32(monkeypatch) -> None:
    monkeypatch.setattr(hardware, "available_cores", lambda: 2)
    cfg = load_config("vicreg-e2mc", AUTO)
    files = hardware_choices(cfg, torch.device("cpu"), True)
    assert {k: c.value for k, c in files.items()} == {
        "data.pipeline": "fast", "training.precision": "fp32", "training.channels_last": False,
        "data.num_workers": 1}
    assert hardware_choices(cfg, torch.device("cpu"), False)["data.pipeline"].value == "pil"
    assert describe(files).startswith("data.pipeline=fast (image files on a CPU: ")


def test_explicit_values_are_kept_and_the_paper_presets_keep_fp16() -> None:
    cfg = load_config("vicreg-e2mc", ["data.pipeline=pil", "training.channels_last=false",
                                      "data.num_workers=3"])
    assert cfg.training.precision == "fp16"  # the paper's, with its scaler
    assert hardware_choices(cfg, torch.device("cuda"), True) == {}


def test_config_show_says_what_auto_becomes_here(capsys) -> None:
    from e2mc.cli import main

    assert main(["config", "show", "vicreg-e2mc"]) == 0
    out = capsys.readouterr().out
    assert "num_workers: null" in out
    assert "# auto on this machine (" in out and "#   data.num_workers: " in out
    assert "#   data.pipeline: " in out


def test_a_run_says_what_auto_chose_and_trains_through_it(tmp_path: Path, capsys) -> None:
    from e2mc.cli import main
    from synthetic_photos import write_jpeg_folder

    write_jpeg_folder(tmp_path / "data" / "train", 16, (40, 36), classes=2)
    assert main(["pretrain", "--config", "fmnist-vicreg-pretrain", "--data",
                 str(tmp_path / "data"), "--out", str(tmp_path / "run"), "--epochs", "1",
                 "--set", "training.batch_size=8", "--set", "training.progress=false",
                 "--set", "training.device=cpu", *[a for s in AUTO for a in ("--set", s)]]) == 0
    err = capsys.readouterr().err
    said = next(line for line in err.splitlines() if line.startswith("auto: "))
    assert said.startswith("auto: data.pipeline=fast (image files on a CPU")
    assert "training.precision=fp32 (a CPU)" in said
