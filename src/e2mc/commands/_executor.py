"""The job options that ``e2mc search`` and ``e2mc eval`` share (:mod:`e2mc.jobs`)."""

from __future__ import annotations

import argparse
from typing import Any


def add_executor_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    """``--executor`` and the SLURM settings; ``what``: the units of work, in words."""
    jobs = parser.add_argument_group(
        "jobs (e2mc.jobs; local and slurm need submitit: pip install 'e2mc[cluster]')")
    jobs.add_argument("--executor", choices=("inline", "local", "slurm"), default="inline",
                      help=f"inline (default): {what} in this process, one after another; "
                           "local: each as a process of its own; slurm: each as a SLURM job. "
                           "The command waits for the jobs, records their ids in "
                           "OUT/jobs.json and resumes without resubmitting them")
    jobs.add_argument("--partition", help="SLURM partition")
    jobs.add_argument("--nodes", type=int, default=1,
                      help="SLURM nodes of each training job (1)")
    jobs.add_argument("--gpus-per-node", type=int, default=0,
                      help="GPUs per node of each training job, one process (task) per GPU "
                           "(DDP); evaluations take one (0: CPU)")
    jobs.add_argument("--cpus-per-task", type=int, help="SLURM CPUs per task (per GPU)")
    jobs.add_argument("--time", dest="time_min", type=int, metavar="MINUTES",
                      help="time limit of each job (slurm: 240); a training job that nears "
                           "it (submitit's USR2, --signal-delay seconds before) finishes its "
                           "step, checkpoints and is requeued once")
    jobs.add_argument("--signal-delay", type=int, default=300, metavar="SECONDS",
                      help="seconds between submitit's time-limit signal and the limit (300): "
                           "the step in flight and the checkpoint must fit")
    jobs.add_argument("--account", help="SLURM account")
    jobs.add_argument("--constraint", help="SLURM node constraint")
    jobs.add_argument("--slurm", action="append", default=[], metavar="KEY=VALUE",
                      help="any other sbatch setting, e.g. --slurm qos=high --slurm "
                           "mail-type=END (repeatable; KEY alone for a flag)")
    jobs.add_argument("--max-parallel", type=int, metavar="N",
                      help="jobs in flight at once (local: 1; slurm: all, as a job array "
                           "with at most N running)")
    jobs.add_argument("--jobs-dir", metavar="DIR",
                      help="submitit's job files and logs (OUT/jobs)")


def executor_options(args: argparse.Namespace) -> Any:
    """The checked :class:`~e2mc.jobs.ExecutorOptions` of the parsed arguments."""
    from e2mc.jobs import ExecutorOptions, parse_slurm_settings

    options = ExecutorOptions(
        kind=args.executor, partition=args.partition, nodes=args.nodes,
        gpus_per_node=args.gpus_per_node, cpus_per_task=args.cpus_per_task,
        time_min=args.time_min, account=args.account, constraint=args.constraint,
        slurm=parse_slurm_settings(args.slurm), max_parallel=args.max_parallel,
        jobs_dir=args.jobs_dir, signal_delay_s=args.signal_delay)
    options.check()  # before anything runs: options the executor ignores, submitit missing
    return options
