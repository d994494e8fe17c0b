"""What a checkpoint argument stands for: a file, a URL (fetched into torch.hub's cache), a
shipped checkpoint (``builtin:NAME``), a training run directory (its model), or an object
already loaded; and that object read."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from e2mc.checkpoints.io import torch_load
from e2mc.checkpoints.remote import fetch, is_url

PathOrState = str | os.PathLike[str] | dict[str, Any]


def load_file(path_or_state: PathOrState, trust: bool) -> tuple[Any, str | None, str | None]:
    """``(object, source, local file read)`` (None, None for a loaded object); a URL is fetched
    first, a run directory stands for its model (:func:`checkpoint_of`)."""
    if isinstance(path_or_state, dict):
        return path_or_state, None, None
    if is_url(path_or_state):
        local = str(fetch(str(path_or_state)))
        return torch_load(local, trust=trust), str(path_or_state), local
    path = checkpoint_of(path_or_state)  # a run directory stands for its model (best.pt)
    return torch_load(path, trust=trust), path, path


def checkpoint_of(path_or_run_dir: str | os.PathLike[str], last: bool = False) -> str:
    """``path_or_run_dir`` itself, or a run directory's model (:func:`e2mc.artifacts.run_model`:
    its kept ``best.pt``, else or with ``last`` its latest checkpoint)."""
    from e2mc.artifacts import run_model

    model = None if is_url(path_or_run_dir) else run_model(path_or_run_dir, last)
    if model is None or model.path == Path(path_or_run_dir):  # a URL, or the file itself
        return os.fspath(path_or_run_dir)
    return str(model.path)


def local_checkpoint(ref: str | os.PathLike[str], last: bool = False) -> str:
    """The local file ``ref`` stands for: a URL's fetched copy, a run directory's model, else
    ``ref`` itself."""
    return str(fetch(str(ref))) if is_url(ref) else checkpoint_of(ref, last)
