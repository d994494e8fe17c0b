"""The ``e2mc`` entry point: help, version, and clean errors for bad input."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import e2mc


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    src = str(Path(e2mc.__file__).resolve().parents[1])
    full_env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", ""),
                **(env or {})}
    return subprocess.run([sys.executable, "-m", "e2mc", *args], capture_output=True, text=True,
                          env=full_env, timeout=300)


def test_version_and_help() -> None:
    out = run_cli("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"e2mc {e2mc.__version__}"
    helped = run_cli("--help")
    assert helped.returncode == 0
    for command in ("convert", "export-backbone", "eval", "compare", "analyze"):
        assert command in helped.stdout


def test_bad_input_gives_a_message_not_a_traceback(tmp_path: Path) -> None:
    missing = tmp_path / "nope.pt"
    out = run_cli("export-backbone", str(missing), str(tmp_path / "out.pt"))
    assert out.returncode == 2
    assert "error" in out.stderr and "nope.pt" in out.stderr
    assert "Traceback" not in out.stderr
    debug = run_cli("export-backbone", str(missing), str(tmp_path / "out.pt"),
                    env={"E2MC_DEBUG": "1"})
    assert "Traceback" in debug.stderr
