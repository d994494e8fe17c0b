"""The package imports only downward: ``lint-imports`` keeps the contracts declared in
pyproject.toml (the layers drawn in docs/architecture.md, no import loops), and breaks them as
soon as a module imports a layer above it, even from inside a function."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def lint_imports(project: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` on the ``e2mc`` package under ``project/src`` with ``project``'s
    pyproject.toml."""
    env = {**os.environ, "PYTHONPATH": str(project / "src")}
    return subprocess.run(
        [sys.executable, "-c", "from importlinter.cli import lint_imports_command as c; c()",
         "--no-cache", "--no-logo"],
        cwd=project, env=env, capture_output=True, text=True, timeout=120)


def test_the_package_keeps_its_import_contracts() -> None:
    done = lint_imports(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def test_an_upward_import_breaks_the_layers(tmp_path: Path) -> None:
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    shutil.copytree(ROOT / "src" / "e2mc", tmp_path / "src" / "e2mc",
                    ignore=lambda _, names: [n for n in names if n.endswith((".pt", ".npz"))])
    features = tmp_path / "src" / "e2mc" / "evaluation" / "features.py"
    features.write_text(features.read_text() + (
        "\n\ndef _trainer():\n"
        "    from e2mc.training.trainer import Trainer  # evaluation reaching up into training\n"
        "\n    return Trainer\n"))
    done = lint_imports(tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Layers: each imports only the layers below it BROKEN" in done.stdout
    assert "e2mc.evaluation is not allowed to import e2mc.training" in done.stdout
    assert "e2mc.evaluation.features -> e2mc.training.trainer" in done.stdout
