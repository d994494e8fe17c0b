"""What every benchmark JSON records about its run: the torch version, the commit (with a
``+dirty`` mark when the tracked files differ from it), the 1-minute load average, the
machine. The machine is often shared: compare paths measured in the same run, as ratios."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

import torch

_REPO = Path(__file__).resolve().parent.parent


def git_commit() -> str:
    """The checkout's short commit, ``+dirty`` when tracked files were changed; ``unknown``
    outside a git checkout."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(_REPO), *args], capture_output=True,
                              text=True, check=False)

    head = git("rev-parse", "--short", "HEAD")
    if head.returncode != 0:
        return "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
    return head.stdout.strip() + ("+dirty" if dirty else "")


def run_meta() -> dict:
    """The run's identity for a benchmark JSON (call it at the end: the load is the
    1-minute average of the run's last minute)."""
    return {"torch": torch.__version__, "commit": git_commit(),
            "load_1min": os.getloadavg()[0], "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "machine": platform.platform()}
