"""The README's Python quick start runs as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_quick_start_runs(capsys) -> None:
    blocks = python_blocks()
    assert blocks, "the README has no Python example"
    namespace: dict = {}
    exec(compile(blocks[0], "README quick start", "exec"), namespace)
    assert "entropy" in capsys.readouterr().out
    assert namespace["terms"]["loss"].requires_grad


def test_readme_generic_encoder_example_trains_one_step() -> None:
    import torch

    namespace: dict = {}
    exec(compile(python_blocks()[1], "README generic encoder", "exec"), namespace)
    method = namespace["method"]
    views = [torch.randn(8, 3, 16, 16), torch.randn(8, 3, 16, 16)]
    out = method(views)
    assert out.embeddings[0].shape == (8, 256) and torch.isfinite(out.loss)
    optimizer = method.build_optimizer(lr=0.1, weight_decay=1e-6)
    out.loss.backward()
    optimizer.step()
