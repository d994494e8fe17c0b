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

