"""Every command the tool prints as a next step works (issue 33, item 2): the keep-best hint of
a run built by name runs as printed; the one of a ``continue_module`` run gives the Python calls
(the CLI cannot rebuild a user module) and they load its kept model."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import torch
from torch import nn

from e2mc.cli import main
from helpers import TINY_RUN, tiny_base

KEEP = ["data.val_split=8", "monitor.every=2", "monitor.keep_best=val/knn",
        "training.max_steps=4"]


def _hint(err: str) -> str:
    return next(line for line in err.splitlines() if line.startswith("the run's answer is"))


@pytest.mark.slow  # a 4-step run, its evaluation and export: about 10 s on 2 cores
def test_keep_best_hints_run_as_printed(tmp_path: Path, capsys, monkeypatch) -> None:
    ckpt, data = tiny_base(tmp_path)
    monkeypatch.chdir(tmp_path)  # the hint's paths are as given: relative to here
    sets = [a for item in [*TINY_RUN, *KEEP] for a in ("--set", item)]
    assert main(["continue", "--config", "fmnist-vicreg-e2mc", "--from", str(ckpt),
                 "--data", str(data), "--out", "runs/r", *sets]) == 0
    hint = _hint(capsys.readouterr().err)
    commands = re.findall(r"(e2mc (?:eval|export-backbone) [^;]+?)(?:;|$)", hint)
    assert [c.split()[1] for c in commands] == ["eval", "export-backbone"], hint
    for command in commands:
        argv = shlex.split(command)[1:]
        if argv[0] == "eval":  # at a tiny size: the hint's data and image size, kNN only
            argv += ["--protocol", "knn", "--knn-k", "3", "--fractions", "1", "--seeds", "0",
                     "--no-cache", "--quiet", "--device", "cpu"]
        assert main(argv) == 0, command
    assert (tmp_path / "runs" / "r-eval" / "results.json").is_file()
    assert (tmp_path / "runs" / "r-backbone.pt").is_file()


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


@pytest.mark.slow  # two 4-step runs, their evaluations, a comparison and an analysis
def test_your_own_module_from_the_hint_to_a_comparison_page(tmp_path: Path, capsys,
                                                             monkeypatch) -> None:
    """The documented path of a continue_module run (issue 41): the hint's Python calls as
    printed (with the encoder's class and a tiny evaluation), then e2mc compare of the two
    runs (with and without E2MC) to its page, and the analysis through module_loader."""
    from e2mc.evaluation import EvalOptions
    from e2mc.training import continue_module

    _, data = tiny_base(tmp_path)
    monkeypatch.chdir(tmp_path)
    overrides = [o for o in TINY_RUN if not o.startswith(("model.backbone", "method.params"))]
    tiny = EvalOptions(protocols=("linear", "knn"), fractions=(1.0,), seeds=(0, 1),
                       knn_k=(3,), linear_overrides={"epochs": 2}, progress=False,
                       device="cpu")
    for name, preset in (("mine-continued", "fmnist-vicreg-continued"),
                         ("mine", "fmnist-vicreg-e2mc")):
        continue_module(Encoder(), preset, name, [*overrides, f"data.dataset={data}",
                                                  "method.params={projector: 32-32}", *KEEP])
        hint = _hint(capsys.readouterr().err)
        assert "Encoder" in hint and "e2mc eval" not in hint
        evaluate = re.search(r"(evaluate_module\(.+?\)); compare", hint).group(1)
        analyse = re.search(r"(analyze\(.+\))$", hint).group(1)
        namespace = {"Encoder": Encoder}
        exec("from e2mc.evaluation import evaluate_module", namespace)
        exec(evaluate[:-1] + ", options=tiny)", {**namespace, "tiny": tiny})  # as printed
    assert main(["compare", "mine-continued-eval", "mine-eval", "--names", "continued,e2mc",
                 "--out", "cmp"]) == 0
    assert (tmp_path / "cmp" / "comparison.html").is_file()
    out = capsys.readouterr().out.rstrip().splitlines()
    assert out[-1] == "page: cmp/comparison.html"
    assert out[-2].startswith("e2mc against continued: ")
    namespace = {"Encoder": Encoder}
    exec("from e2mc.diagnostics.analyze import analyze, module_loader", namespace)
    exec(analyse[:-1] + ", num_samples=32, knn_k=5, progress=False)", namespace)
    assert (tmp_path / "mine-analysis" / "report.html").is_file()
