"""Where the jobs of a search or an evaluation set run: :class:`ExecutorOptions` (``--executor``
and the SLURM settings) and the submitit executor they make (:func:`make_executor`)."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2mc.errors import InputError

EXECUTORS = ("inline", "local", "slurm")
#: Seconds between submitit's signal and the time limit (``--signal-delay``).
SIGNAL_DELAY_S = 300
#: ``--time`` of a SLURM job when none is given (minutes).
DEFAULT_SLURM_TIME_MIN = 240
#: ``--slurm-outage``: minutes to wait for a SLURM that does not answer.
DEFAULT_SLURM_OUTAGE_MIN = 30.0
#: A local job without ``--time`` runs as long as it takes (submitit needs a number).
_NO_LIMIT_MIN = 60 * 24 * 365


def import_submitit() -> Any:
    """submitit, or a one-line error saying how to install it."""
    try:
        import submitit
    except ImportError:
        raise InputError("--executor local and --executor slurm need submitit: "
                         "pip install 'e2mc[cluster]'") from None
    return submitit


@dataclass(frozen=True)
class ExecutorOptions:
    """Where the jobs of a search run (``e2mc search --executor ...``)."""

    kind: str = "inline"
    partition: str | None = None
    nodes: int = 1
    gpus_per_node: int = 0
    #: processes (tasks) per node of a training job on the CPU (gloo DDP); with GPUs, one per GPU
    tasks_per_node: int | None = None
    cpus_per_task: int | None = None
    time_min: int | None = None
    account: str | None = None
    constraint: str | None = None
    #: ``--slurm KEY=VALUE``: submitit's ``slurm_additional_parameters`` (``#SBATCH --KEY=VALUE``)
    slurm: dict[str, Any] = field(default_factory=dict)
    max_parallel: int | None = None
    jobs_dir: str | None = None
    poll_s: float | None = None
    signal_delay_s: int = SIGNAL_DELAY_S
    slurm_outage_min: float = DEFAULT_SLURM_OUTAGE_MIN

    def check(self) -> None:
        """Refuse values out of range and options the executor would ignore; need submitit."""
        if self.kind not in EXECUTORS:
            raise InputError(f"--executor must be one of {', '.join(EXECUTORS)}, got "
                             f"{self.kind!r}")
        for name, value, low in (("--nodes", self.nodes, 1),
                                 ("--gpus-per-node", self.gpus_per_node, 0),
                                 ("--tasks-per-node", self.tasks_per_node, 1),
                                 ("--cpus-per-task", self.cpus_per_task, 1),
                                 ("--time", self.time_min, 1),
                                 ("--max-parallel", self.max_parallel, 1),
                                 ("--signal-delay", self.signal_delay_s, 1),
                                 ("--slurm-outage", self.slurm_outage_min, 0),
                                 ("--poll", self.poll_s, 0.1)):
            if value is not None and value < low:
                raise InputError(f"{name} must be at least {low}, got {value}")
        slurm_only = {"--partition": self.partition, "--account": self.account,
                      "--constraint": self.constraint, "--cpus-per-task": self.cpus_per_task,
                      "--slurm": self.slurm or None,
                      "--nodes": self.nodes if self.nodes != 1 else None,
                      "--slurm-outage": self.slurm_outage_min
                      if self.slurm_outage_min != DEFAULT_SLURM_OUTAGE_MIN else None}
        jobs_only = {"--gpus-per-node": self.gpus_per_node or None, "--time": self.time_min,
                     "--tasks-per-node": self.tasks_per_node,
                     "--max-parallel": self.max_parallel, "--jobs-dir": self.jobs_dir,
                     "--poll": self.poll_s,
                     "--signal-delay": self.signal_delay_s
                     if self.signal_delay_s != SIGNAL_DELAY_S else None}
        if self.tasks_per_node is not None and self.gpus_per_node:
            raise InputError("--tasks-per-node is for jobs on the CPU; with --gpus-per-node "
                             "a job runs one task per GPU")
        given = [k for k, v in slurm_only.items() if v is not None and self.kind != "slurm"]
        if given:
            raise InputError(f"{', '.join(given)} only apply to --executor slurm")
        given = [k for k, v in jobs_only.items() if v is not None and self.kind == "inline"]
        if given:
            raise InputError(f"{', '.join(given)} only apply to --executor local or slurm")
        if self.kind != "inline":
            import_submitit()

    def parallel(self, jobs: int) -> int:
        """Jobs in flight at once: ``--max-parallel``, else on SLURM all, here one, or with
        ``--gpus-per-node G`` as many as the GPUs hold."""
        if self.max_parallel is not None or self.kind == "slurm":
            return self.max_parallel or max(jobs, 1)
        if not self.gpus_per_node:
            return 1
        import torch

        return max(1, torch.cuda.device_count() // self.gpus_per_node)

    @property
    def poll(self) -> float:
        if self.poll_s is not None:
            return self.poll_s
        return 30.0 if self.kind == "slurm" else 0.5


def parse_slurm_settings(items: Sequence[str]) -> dict[str, Any]:
    """``["mail-type=END", "exclusive"]`` -> ``{"mail-type": "END", "exclusive": True}``."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().lstrip("-")
        if not key or (sep and not value.strip()):
            raise InputError(f"--slurm {item!r} must look like KEY=VALUE (or KEY for a flag)")
        out[key] = value.strip() if sep else True
    return out


def train_tasks_per_node(options: ExecutorOptions) -> int:
    """Processes per node of a training job: one per GPU, else ``--tasks-per-node`` (1)."""
    return options.gpus_per_node or options.tasks_per_node or 1


def slurm_parameters(options: ExecutorOptions, name: str, kind: str = "train"
                     ) -> dict[str, Any]:
    """``submitit.SlurmExecutor.update_parameters`` for jobs of ``kind`` (``train``: DDP over
    ``--nodes``; ``eval``: one task, at most one GPU)."""
    gpus = options.gpus_per_node
    train = kind == "train"
    params: dict[str, Any] = {
        "job_name": name,
        "time": options.time_min or DEFAULT_SLURM_TIME_MIN,
        "nodes": options.nodes if train else 1,
        "ntasks_per_node": train_tasks_per_node(options) if train else 1,
        "signal_delay_s": options.signal_delay_s,
        "additional_parameters": {"requeue": True, **options.slurm},
    }
    if gpus:
        params["gpus_per_node"] = gpus if train else 1
    for key in ("partition", "cpus_per_task", "account", "constraint"):
        if getattr(options, key) is not None:
            params[key] = getattr(options, key)
    if options.max_parallel is not None:
        params["array_parallelism"] = options.max_parallel
    return params


def make_executor(options: ExecutorOptions, folder: str | Path, name: str,
                  kind: str = "train") -> Any:
    """The submitit executor of ``options`` (``local`` or ``slurm``) with its parameters."""
    submitit = import_submitit()
    if options.kind == "slurm":
        missing = [c for c in ("sbatch", "srun") if shutil.which(c) is None]
        if missing:
            raise InputError(f"--executor slurm submits with SLURM's sbatch and srun; "
                             f"{' and '.join(missing)} not found on PATH (run it where SLURM "
                             "answers, e.g. a cluster's login node, or use --executor local)")
        executor = submitit.SlurmExecutor(folder=folder)
        executor.update_parameters(**slurm_parameters(options, name, kind))
        return executor
    gpus = options.gpus_per_node if kind == "train" else min(options.gpus_per_node, 1)
    executor = submitit.LocalExecutor(folder=folder)
    executor.update_parameters(timeout_min=options.time_min or _NO_LIMIT_MIN,
                               tasks_per_node=train_tasks_per_node(options)
                               if kind == "train" else 1, gpus_per_node=gpus,
                               signal_delay_s=options.signal_delay_s)
    return executor
