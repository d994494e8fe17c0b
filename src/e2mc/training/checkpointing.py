"""Training checkpoints: the project format plus everything needed to resume exactly.

A training checkpoint is a project checkpoint (``e2mc.checkpoints.save_checkpoint``: format,
method, hparams, model; written atomically) with these extra entries:

``optimizer``, ``scaler`` (state dicts), ``epoch`` (total epochs the weights have been trained,
base epochs included, as in the official checkpoints), ``run_epoch`` / ``step`` /
``batch_in_epoch`` (position in this run: completed epochs, optimizer steps, batches of the
current epoch already done), ``base_epoch``, ``skipped_steps``, ``rng`` (one entry per process:
python, numpy, torch, cuda), ``training_state`` (the method's, e.g. the SwAV queue), ``addon``
(name and state dict), ``run_config`` (the resolved configuration as a dict).

Every entry is made of tensors, numbers, strings, lists, tuples and dicts, so resuming reads the
file with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

RESUME_KEYS = ("optimizer", "run_epoch", "step", "batch_in_epoch", "rng", "run_config")


def rng_state() -> dict[str, Any]:
    """The generator states of python, numpy, torch (CPU) and every CUDA device."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {"kind": str(kind), "keys": torch.from_numpy(np.asarray(keys).copy()),
                  "pos": int(pos), "has_gauss": int(has_gauss), "cached": float(cached)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned (CUDA states only where devices match)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"],
                         n["has_gauss"], n["cached"]))
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


def save_training_checkpoint(path: str | Path, method: torch.nn.Module, **extra: Any) -> Path:
    """Write a training checkpoint atomically (temporary file, then rename); returns ``path``."""
    from e2mc.checkpoints import save_checkpoint

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_checkpoint(path, method, **extra)
    return path


def load_training_checkpoint(path: str | Path, method_name: str) -> dict[str, Any]:
    """Read a training checkpoint written by this trainer for resuming.

    Raises ``ValueError`` when the file is not a resumable e2mc checkpoint or was written by a
    run of another method.
    """
    path = Path(path)
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # any unpickling failure means "not a resumable checkpoint"
        raise ValueError(f"cannot read the training checkpoint {path}: {err}") from err
    if not isinstance(ckpt, dict) or ckpt.get("format") != "e2mc":
        raise ValueError(f"{path} is not an e2mc training checkpoint")
    missing = [k for k in RESUME_KEYS if k not in ckpt]
    if missing:
        raise ValueError(f"{path} cannot be resumed: it lacks {', '.join(missing)}")
    if ckpt.get("method") != method_name:
        raise ValueError(f"{path} was written by a {ckpt.get('method')!r} run; this run trains "
                         f"{method_name!r} (use another run directory)")
    return ckpt


def load_optimizer_state_keep_hyperparameters(optimizer: torch.optim.Optimizer,
                                              state: dict[str, Any]) -> None:
    """Take the per-parameter state (momentum buffers) of an optimizer ``state_dict`` written by
    the same method's optimizer, keeping ``optimizer``'s own hyperparameters (lr, weight decay).
    """
    ours = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    try:
        optimizer.load_state_dict(state)
    except (ValueError, KeyError) as err:
        raise ValueError(f"the starting checkpoint's optimizer state does not fit this optimizer "
                         f"({err}); set init.load_optimizer=false to start with a fresh "
                         f"optimizer state") from err
    for group, hyper in zip(optimizer.param_groups, ours, strict=True):
        group.update(hyper)
