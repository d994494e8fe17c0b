"""``e2mc eval A B C --out DIR``: several checkpoints evaluated alike into ``DIR/<name>/``,
inline or each as a job, with ``reuse``: running the same command again after an interruption
redoes nothing that finished."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from e2mc.artifacts import EvalResults, EvalSetDir, evaluation_set_names, writer_lock
from e2mc.errors import InputError
from e2mc.evaluation.runner import EvalOptions
from e2mc.evaluation.workflow import EvalData, ModelSpec, evaluate_checkpoint
from e2mc.files import atomic_write_text, refuse_link
from e2mc.jobs import ExecutorOptions, JobRunner, JobStopped, evaluation_work


def evaluate_set(checkpoints: Sequence[str], out: str | Path, data: EvalData,
                 options: EvalOptions, executor: ExecutorOptions, *,
                 model: ModelSpec | None = None, image_size: int | None = None,
                 cache: str | Path | None = None, extra_record: dict[str, Any] | None = None,
                 log: Callable[[str], None] = lambda m: print(m, file=sys.stderr)
                 ) -> dict[str, EvalResults]:
    """Evaluate each of ``checkpoints`` into ``out/<name>/``; returns name -> results."""
    files, model = EvalSetDir(out), model or ModelSpec()
    names = evaluation_set_names([str(c) for c in checkpoints])
    _check_exist(checkpoints, model.last)  # before anything is written or submitted
    with writer_lock(files.root):
        wanted = dict(zip(names, map(str, checkpoints), strict=True))
        for name in wanted:  # each evaluation directory is the set's own
            refuse_link(files.evaluation(name).root)
        _write_index(files, wanted)
        calls = {name: {"checkpoint": ref, "out": str(files.evaluation(name).root),
                        "data": data, "options": options, "model": model,
                        "image_size": image_size, "cache": None if cache is None else str(cache),
                        "reuse": True, "extra_record": extra_record}
                 for name, ref in wanted.items()}
        if executor.kind == "inline":
            for i, call in enumerate(calls.values()):
                log(f"[{i + 1}/{len(calls)}] {call['checkpoint']} -> {call['out']}")
                evaluate_checkpoint(**call, log=log)
        else:
            # each job resolves device "auto" on its own node (evaluate_checkpoint)
            jobs = JobRunner(executor, files, log, progress=options.progress)
            works = [evaluation_work(name, call) for name, call in calls.items()]
            try:
                jobs.run(works, "eval")
            except JobStopped as stop:
                raise InputError(f"{stop}; run the same command again to resume") from None
        return {name: files.evaluation(name).load() for name in names}


def _check_exist(checkpoints: Sequence[str], last: bool) -> None:
    from e2mc.checkpoints import checkpoint_of, is_url

    for ref in checkpoints:
        if not is_url(ref) and not Path(checkpoint_of(ref, last)).is_file():
            raise InputError(f"{ref}: no such file or directory")


def _write_index(files: EvalSetDir, wanted: dict[str, str]) -> None:
    """Add ``wanted`` to ``evaluations.json`` atomically; a name recorded with another
    checkpoint (names hash their checkpoints) means a foreign file and is refused."""
    index: dict[str, str] = {}
    if files.index.is_file():
        try:
            index = json.loads(files.index.read_text(encoding="utf-8"))["checkpoints"]
        except (ValueError, KeyError, TypeError) as err:
            raise InputError(f"{files.index} is not an e2mc evaluation index ({err}); use "
                             "another --out") from None
        clash = [n for n in wanted if n in index and index[n] != wanted[n]]
        if clash:
            raise InputError(f"{files.index} records {clash[0]} as {index[clash[0]]}, not "
                             f"{wanted[clash[0]]}; use another --out")
    index = {**index, **wanted}
    files.root.mkdir(parents=True, exist_ok=True)
    atomic_write_text(files.index, json.dumps({"checkpoints": index}, indent=2))

