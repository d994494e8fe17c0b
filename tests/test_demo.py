"""``e2mc demo``: the shipped base checkpoint loads, and the quick demo runs end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import e2mc
from e2mc.demo import BASE_CHECKPOINT


def test_shipped_base_checkpoint_loads_strictly() -> None:
    from e2mc.checkpoints import load_checkpoint

    method, info = load_checkpoint(BASE_CHECKPOINT)
    assert method.name == "vicreg" and method.hparams["backbone"] == "cnn5_small"
    assert info["format"] == "e2mc"
    method.eval()
    with torch.no_grad():
        out = method([torch.randn(8, 1, 28, 28), torch.randn(8, 1, 28, 28)])
    assert out.embeddings[0].shape == (8, 512)
    assert torch.isfinite(out.loss)


@pytest.mark.slow
def test_quick_demo_through_the_entry_point(tmp_path: Path) -> None:
    src = str(Path(e2mc.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = tmp_path / "demo"
    proc = subprocess.run([sys.executable, "-m", "e2mc", "demo", "--quick", "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = (out / "comparison.md").read_text()
    for row in ("continued", "e2mc", "base"):
        assert row in table
    assert "linear 10%" in table and "knn" in table
    assert (out / "analysis" / "report.html").exists()
    # the last screen is the answer: at most 25 rows of a 100-column terminal, each flag once,
    # a headline per run (E2MC's last), the page; the table and every verdict are in the files
    lines = proc.stdout.rstrip("\n").splitlines()
    last = lines[next(i for i, line in enumerate(lines) if line.endswith("] done")) + 1:]
    assert sum(max(1, -(-len(line) // 100)) for line in last) <= 25, "\n".join(last)
    assert last[1] == (f"files: the table, every verdict and the paired tests in "
                       f"{out / 'comparison.md'}; diagnostics: {out / 'analysis' / 'report.html'}")
    flags = [line for line in last if line.startswith("flag: ")]
    assert flags and len(flags) == len(set(flags))
    assert [line.split(":")[0] for line in last if " against continued: " in line] == [
        "base against continued", "e2mc against continued"]
    assert not any(line.startswith(("| ", "- ")) for line in lines)
    # the page it ends on opens with the answer, then the table; the diagnostics follow
    assert last[-1] == f"page: {out / 'comparison.html'}"
    assert "--quick checks the installation" in proc.stdout
    # said first too, before any work
    assert proc.stdout.splitlines()[0].startswith("--quick: an installation check")
    page = (out / "comparison.html").read_text()
    answer, table = page.index('class="answer"'), page.index("<table>")
    assert answer < table < page.index("Diagnostics: how the embeddings moved")
    assert "<li>e2mc against continued: " in page[answer:table]  # the headlines
    assert "<li>base against continued: " in page[answer:table]
    import html

    found = json.loads((out / "analysis" / "diagnostics.json").read_text())["verdict"]
    assert found and all(html.escape(line) in page for line in found)  # the report's verdict
    assert 'href="analysis/report.html"' in page
    for name in ("continued", "e2mc"):
        record = json.loads((out / "eval" / name / "results.json").read_text())
        assert {e["protocol"] for e in record["entries"]} == {"linear", "knn"}
        assert (out / name / "checkpoint.pt").exists()


@pytest.mark.slow  # two spawned processes: a few seconds
def test_side_by_side_training_equals_the_runs_one_after_the_other(tmp_path: Path) -> None:
    """The demo's two runs trained at once (one process each, one thread each on 2 cores) end
    with the weights of the same runs trained one after the other in this process with the
    same thread count: side by side changes the wall time, not the numbers."""
    from e2mc.demo import DemoSettings, continue_config, train_side_by_side
    from e2mc.training.run import run_training

    settings = DemoSettings(train_limit=64, max_steps=2, progress=False,
                            overrides=["training.batch_size=16", "training.cpu_threads=1"])

    def configs() -> dict:
        return {name: continue_config(addon, BASE_CHECKPOINT, settings)
                for addon, name in (("none", "continued"), ("e2mc", "e2mc"))}

    parallel = train_side_by_side(configs(), tmp_path / "parallel", progress=False, threads=1)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        serial = {name: run_training(cfg, tmp_path / "serial" / name, done_marker=True).checkpoint
                  for name, cfg in configs().items()}
    finally:
        torch.set_num_threads(before)
    for name in ("continued", "e2mc"):
        a = torch.load(parallel[name], weights_only=True)
        b = torch.load(serial[name], weights_only=True)
        assert a["step"] == b["step"] == 2
        assert a["model"].keys() == b["model"].keys()
        assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"]), name


@pytest.mark.slow
def test_a_failing_run_side_by_side_is_the_demo_error(tmp_path: Path) -> None:
    """A run that fails in its process fails the demo with the run's own error."""
    from e2mc.demo import DemoSettings, continue_config, train_side_by_side

    settings = DemoSettings(train_limit=64, max_steps=2, progress=False,
                            overrides=["training.batch_size=16"])
    configs = {"continued": continue_config("none", BASE_CHECKPOINT, settings),
               "e2mc": continue_config("e2mc", BASE_CHECKPOINT, settings)}
    configs["e2mc"].init.checkpoint = str(tmp_path / "missing.pt")
    with pytest.raises(Exception, match="missing.pt"):
        train_side_by_side(configs, tmp_path / "runs", progress=False, threads=1)
