"""What ``auto`` chooses on this machine for ``data.pipeline``, ``training.precision``,
``training.channels_last`` and ``data.num_workers``, each with its reason. The configuration
keeps ``auto``, so a run resumes on another machine with that machine's choices."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from e2mc.config import RunConfig
from e2mc.processes import available_cores

#: Loader workers at most (beyond, a GPU's step is the bound on every machine we measured).
MAX_WORKERS = 32


@dataclass(frozen=True)
class Choice:
    value: Any
    reason: str


def is_image_folder(dataset: Any) -> bool:
    """Whether ``dataset`` (or the set under its subsets) holds image files (``samples``)."""
    from e2mc.data.subsets import subset_parts

    return hasattr(subset_parts(dataset)[0], "samples")


def hardware_choices(cfg: RunConfig, device: torch.device,
                     image_folder: bool | None = None) -> dict[str, Choice]:
    """The value of every key of ``cfg`` left to ``auto`` on ``device``; ``image_folder`` None:
    not known yet (both cases said)."""
    cuda = device.type == "cuda"
    out: dict[str, Choice] = {}
    if cfg.data.pipeline == "auto":
        files = ("device", "image files on CUDA: decoding and crops in the loader workers, "
                 "the photometric steps on the GPU") if cuda else (
            "fast", "image files on a CPU: the official recipe's views drawn alike, decoded "
            "and augmented as tensors")
        if image_folder is None:
            out["data.pipeline"] = Choice(f"{files[0]} or pil", f"{files[0]} for {files[1]}; "
                                          "pil for arrays (.npz, IDX, builtin)")
        elif image_folder:
            out["data.pipeline"] = Choice(*files)
        else:
            out["data.pipeline"] = Choice("pil", "arrays, not image files: the fast pipelines "
                                                 "read files")
    if cfg.training.precision == "auto":
        if cuda and torch.cuda.is_bf16_supported():
            out["training.precision"] = Choice("bf16", "CUDA with bfloat16")
        elif cuda:
            out["training.precision"] = Choice("fp16", "CUDA without bfloat16: float16 with "
                                                       "a gradient scaler")
        else:
            out["training.precision"] = Choice("fp32", "a CPU")
    if cfg.training.channels_last is None:
        out["training.channels_last"] = Choice(
            cuda, "CUDA: convolutions run on NHWC tensors" if cuda else "a CPU")
    if cfg.data.num_workers is None:
        cores = available_cores()
        out["data.num_workers"] = Choice(
            max(1, min(cores - 1, MAX_WORKERS)),
            f"{cores} core(s) this process may use, one left to the training process")
    return out


def chosen(cfg: RunConfig, choices: dict[str, Choice], key: str) -> Any:
    """The value ``key`` runs with: the ``auto`` choice, else the configuration's."""
    if key in choices:
        return choices[key].value
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


def describe(choices: dict[str, Choice]) -> str:
    """``data.pipeline=device (image files on CUDA: ...); ...`` (booleans as YAML writes them)."""
    return "; ".join(f"{key}={str(c.value).lower() if isinstance(c.value, bool) else c.value} "
                     f"({c.reason})" for key, c in choices.items())
