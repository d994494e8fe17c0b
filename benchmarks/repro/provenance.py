"""Where a reproduction page's numbers come from: the command as the docs show it (paths of
this machine as placeholders), the commit of the code and the torch version
(tests/test_docs_provenance.py)."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

#: Options whose value is a data set: the docs show it as ``PATH/TO/<folder name>``.
DATA_OPTIONS = ("--data", "--transfer-data")


def public_path(path: str | Path, runs_root: Path | None = None, data: bool = False) -> str:
    """``path`` as the docs show it. An absolute path of this machine becomes a placeholder:
    ``PATH/TO/<name>`` for a data set, ``RUNS/<path under runs_root>`` (else ``RUNS/<name>``)
    for a run folder. Relative paths and names such as ``builtin`` are kept."""
    p = Path(path)
    if not p.is_absolute():
        return str(path)
    if data:
        return f"PATH/TO/{p.name}"
    if runs_root is not None and p.is_relative_to(runs_root):
        return f"RUNS/{p.relative_to(runs_root).as_posix()}"
    return f"RUNS/{p.name}"


def public_command(command: str) -> str:
    """A recorded command line with :func:`public_path` applied to each path in it (also in
    ``--base-run METHOD=DIR``); run folders are named relative to the parent of ``--out``."""
    tokens = [part for token in shlex.split(command)  # --opt=value as --opt value
              for part in (token.split("=", 1) if token.startswith("--") else [token])]
    out = next((v for k, v in zip(tokens, tokens[1:], strict=False) if k == "--out"), None)
    runs_root = Path(out).parent if out and Path(out).is_absolute() else None
    shown, previous = [], ""
    for token in tokens:
        if token.startswith("--"):
            shown.append(token)
            previous = token
            continue
        key, sep, value = token.partition("=") if not token.startswith("/") else ("", "", token)
        data = previous in DATA_OPTIONS or key.endswith("dataset")
        shown.append(f"{key}{sep}{public_path(value, runs_root, data)}" if sep
                     else public_path(token, runs_root, data))
        previous = ""
    return shlex.join(shown)


def source_commit() -> str | None:
    """The short hash of the checkout this code runs from, with ``+changes`` when its tracked
    code (``src``, ``benchmarks``) differs from it; None outside a git checkout."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=Path(__file__).parent, capture_output=True,
                              text=True, check=True, timeout=30).stdout.strip()
    try:
        commit = git("rev-parse", "--short", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no", "--", ":/src",
                      ":/benchmarks")
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{commit}+changes" if changed else commit


def torch_version() -> str:
    """The version of torch in this process (recorded beside the commit)."""
    import torch

    return str(torch.__version__)


def produced_by(command: str, commit: str | None,
                torch_version: str | None = None) -> str:
    """The page's provenance: the command, the commit and the torch version (None: not
    recorded) (tests/test_docs_provenance.py)."""
    at = f"at commit {commit}" if commit else "(commit not recorded)"
    torch = f"with torch {torch_version}" if torch_version else "(torch version not recorded)"
    return f"Produced by `{public_command(command)}` {at} {torch}"
