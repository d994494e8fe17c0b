"""The job options that ``e2mc search`` and ``e2mc eval`` share (:mod:`e2mc.jobs`)."""

from __future__ import annotations

import argparse
from typing import Any


def add_executor_arguments(parser: argparse.ArgumentParser, what: str,
                           trains: bool = True) -> None:
    """``--executor`` and the SLURM settings; ``what``: the units of work, in words; ``trains``:
    whether some jobs train (``e2mc search``) or all evaluate (``e2mc eval``)."""
    job = "training job" if trains else "evaluation job"
    jobs = parser.add_argument_group(
        "jobs (e2mc.jobs; local and slurm need submitit: pip install 'e2mc[cluster]')")
    jobs.add_argument("--executor", choices=("inline", "local", "slurm"), default="inline",
                      help=f"inline (default): {what} in this process, one after another; "
                           "local: each as a process of its own; slurm: each as a SLURM job. "
                           "The command waits for the jobs, records their ids in "
                           "OUT/jobs.json and resumes without resubmitting them")
    jobs.add_argument("--partition", metavar="NAME",
                      help="SLURM partition (default: the cluster's)")
    jobs.add_argument("--nodes", type=int, default=1, metavar="N",
                      help=f"SLURM nodes of each {job} (default: 1)")
    jobs.add_argument("--gpus-per-node", type=int, default=0, metavar="N",
                      help=f"GPUs per node of each {job}, one process (task) per GPU"
                           + (" (DDP); evaluations take one" if trains else ", at most one")
                           + " (default: 0, the CPU)")
    if trains:
        jobs.add_argument("--tasks-per-node", type=int, metavar="N",
                          help="processes (tasks) per node of each training job on the CPU, "
                               "which train together (DDP over gloo, as N processes of "
                               "torchrun); not with --gpus-per-node, which runs one per GPU "
                               "(default: 1)")
    jobs.add_argument("--cpus-per-task", type=int, metavar="N",
                      help="SLURM CPUs per task, i.e. per GPU (default: the cluster's)")
    jobs.add_argument("--time", dest="time_min", type=int, metavar="MINUTES",
                      help="time limit of each job (default: 240 on slurm, none on local)"
                           + ("; a training job that nears it (submitit's USR2, --signal-delay "
                              "seconds before) finishes its step, checkpoints and is requeued "
                              "once" if trains else "; a job that reaches it is requeued and "
                              "starts its evaluation again"))
    jobs.add_argument("--signal-delay", type=int, default=300, metavar="SECONDS",
                      help="seconds between submitit's time-limit signal and the limit "
                           "(default: 300): the step in flight and the checkpoint must fit")
    jobs.add_argument("--account", metavar="NAME",
                      help="SLURM account (default: the cluster's)")
    jobs.add_argument("--constraint", metavar="FEATURES",
                      help="SLURM node constraint (default: none)")
    jobs.add_argument("--slurm", action="append", default=[], metavar="KEY=VALUE",
                      help="any other sbatch setting, e.g. --slurm qos=high --slurm "
                           "mail-type=END (repeatable; KEY alone for a flag)")
    jobs.add_argument("--max-parallel", type=int, metavar="N",
                      help="jobs in flight at once (default on local: 1, or with "
                           "--gpus-per-node G as many as the GPUs hold, GPUs // G; on slurm: "
                           "all, as a job array with at most N running)")
    jobs.add_argument("--poll", dest="poll_s", type=float, metavar="SECONDS",
                      help="seconds between two looks at the jobs (default: 30 on slurm, "
                           "0.5 on local)")
    jobs.add_argument("--slurm-outage", type=float, default=30.0, metavar="MINUTES",
                      help="while SLURM does not answer (its controller down or restarting) "
                           "the jobs' states are unknown, not ended: wait this long for it, "
                           "saying so every 3 minutes, then stop with exit 1 (default: 30)")
    jobs.add_argument("--jobs-dir", metavar="DIR",
                      help="submitit's job files and logs (default: OUT/jobs)")


def executor_options(args: argparse.Namespace) -> Any:
    """The checked :class:`~e2mc.jobs.ExecutorOptions` of the parsed arguments."""
    from e2mc.jobs import ExecutorOptions, parse_slurm_settings

    options = ExecutorOptions(
        kind=args.executor, partition=args.partition, nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        tasks_per_node=getattr(args, "tasks_per_node", None), cpus_per_task=args.cpus_per_task,
        time_min=args.time_min, account=args.account, constraint=args.constraint,
        slurm=parse_slurm_settings(args.slurm), max_parallel=args.max_parallel,
        jobs_dir=args.jobs_dir, signal_delay_s=args.signal_delay, poll_s=args.poll_s,
        slurm_outage_min=args.slurm_outage)
    options.check()  # before anything runs: options the executor ignores, submitit missing
    return options
