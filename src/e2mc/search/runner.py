"""``e2mc search``: every trial trained with its add-on and as its paired control (add-on
``none``, same overrides and seed) on a validation split; the rule declared before the first run
selects the largest positive paired difference; ``--confirm`` re-trains the selected setting with
fresh seeds and tests it on the test split (docs/search.md)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from e2mc.artifacts import EvalDir, RunDir, SearchDir, writer_lock
from e2mc.files import atomic_write_text, display_name
from e2mc.jobs import ExecutorOptions, JobRunner, JobStopped, TrainJob, Work, evaluation_work
from e2mc.search.report import confirm_markdown, confirmation, plot_trajectories, search_markdown
from e2mc.search.spec import CONTROL_ADDON, SearchSpec, Trial, run_dir_name, select


class SearchPreempted(Exception):
    """A run or the search was pre-empted (checkpoint written): running it again resumes."""


class Search:
    """A search in its directory; ``executor`` (:mod:`e2mc.jobs`) ``local`` or ``slurm`` runs
    each run and evaluation as a job, then reads the results back as the inline search does."""

    def __init__(self, spec: SearchSpec, out: str | Path,
                 log: Callable[[str], None] = lambda m: print(m, file=sys.stderr),
                 executor: ExecutorOptions | None = None, progress: bool = True) -> None:
        self.spec, self.out, self.log = spec, Path(out), log
        #: progress bars and job counts (``--quiet``: off); not in the spec (resumes either way)
        self.progress = progress
        self.files = SearchDir(out)
        self.jobs = (JobRunner(executor, self.files, log, progress=progress)
                     if executor is not None and executor.kind != "inline" else None)
        self._check_resumable()
        self._check_params_keys()
        self.configs = {t.name: self._config(t.overrides, control=False) for t in spec.trials}
        self.controls = {t.name: self._config(t.control_overrides, control=True)
                         for t in spec.trials}
        self._check_distinct()
        #: set by :meth:`stop_on` (a pre-emption handler): checked between runs
        self._stop_requested: Callable[[], bool] = lambda: False
        #: the runs' ``warning:`` lines: {text: [run directories]} (search.md lists them)
        self.warnings: dict[str, list[str]] = {}

    def _base(self, seed: int | None = None) -> list[str]:
        """The overrides every run of the search shares."""
        s = self.spec
        seed = s.seed if seed is None else seed
        return ["mode=continue", f"init.checkpoint={s.checkpoint}", f"data.dataset={s.data}",
                f"data.val_split={s.val_split}", f"training.seed={seed}", *s.common]

    def _check_params_keys(self) -> None:
        """A trial key inside a ``params`` section must exist in the config: those sections
        accept any name, so a misspelt key would otherwise change nothing, silently."""
        from e2mc.config import load_config

        cfg = load_config(self.spec.config, self._base())
        self._addon = cfg.addon.name
        for trial in self.spec.trials:
            for key in (o.split("=", 1)[0] for o in trial.overrides):
                if ".params." not in key or (key.startswith("addon.") and _addon_reset(
                        trial.overrides, self._addon)):  # (its add-on's own params, checked)
                    continue
                section, name = key.split(".params.", 1)
                have = getattr(cfg, section).params
                if name.split(".")[0] not in have:
                    raise ValueError(f"grid key {key!r}: the config's {section}.params has no "
                                     f"{name!r} (it has: {', '.join(have) or 'nothing'})")

    def _config(self, overrides: list[str], control: bool, seed: int | None = None) -> Any:
        from e2mc.config import load_config

        s = self.spec
        extra = [f"addon.name={CONTROL_ADDON}", "addon.params={}"] if control else []
        extra += [] if self.progress else ["training.progress=false"]
        cfg = load_config(s.config, [*self._base(seed), *_addon_reset(overrides, self._addon),
                                     *overrides, *extra])
        if cfg.addon.name == CONTROL_ADDON and not control:
            raise ValueError(f"the search config {s.config!r} has no add-on to test: its trials "
                             "would equal their controls")
        return cfg

    def _check_distinct(self) -> None:
        """Two trials with one name, or with the same settings, are refused: the first would be
        reported twice or under the other's name."""
        names = [t.name for t in self.spec.trials]
        if len(set(names)) != len(names):
            twice = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"trial names must be distinct; {', '.join(map(repr, twice))} is "
                             "used more than once")
        seen: dict[str, str] = {}
        for trial in self.spec.trials:
            settings = json.dumps(self.configs[trial.name].to_dict(), sort_keys=True,
                                  default=str)
            if settings in seen:
                raise ValueError(f"trials {seen[settings]!r} and {trial.name!r} have the same "
                                 "settings; list each setting once")
            seen[settings] = trial.name

    def stop_on(self, requested: Callable[[], bool]) -> None:
        """Stop (:class:`SearchPreempted`) between runs once ``requested()`` is true."""
        self._stop_requested = requested

    def _check_resumable(self) -> None:
        path = self.files.json
        if not path.is_file():
            return
        try:
            old = json.loads(path.read_text(encoding="utf-8"))["spec"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise ValueError(f"{path} is not a search record ({err}); use another --out") from err
        new = self.spec.identity()
        if new.get("data_identity") is not None:  # the images by content, however named
            from e2mc.data.identity import describe_change, same_data

            if not same_data(old.get("data_identity"), new["data_identity"]):
                raise ValueError(
                    f"{self.out} holds a search of other images than {self.spec.data} holds "
                    f"now ({describe_change(old.get('data_identity'), new['data_identity'])}); "
                    "its trials would not be this data's: use another --out")
        differ = [k for k in new if old.get(k) != new[k]
                  and not (k in ("data", "data_identity") and new.get("data_identity"))]
        if differ:
            raise ValueError(f"{self.out} holds a search made with another "
                             f"{', '.join(differ)} (e.g. base checkpoint or data); use another "
                             "--out or the same settings")

    def run_dirs(self, trial: Trial) -> tuple[RunDir, RunDir]:
        """The trial's run and its control's (shared by trials differing only in add-on params)."""
        control = trial.control_overrides
        return (self.files.trial_run(run_dir_name(trial.name, trial.overrides)),
                self.files.control_run(run_dir_name(" ".join(control) or "default", control)))

    def _check_stop(self) -> None:
        if self._stop_requested():
            raise SearchPreempted("the search got a pre-emption signal; run the same command "
                                  "again to resume")

    def _train(self, cfg: Any, run: RunDir, control: bool = False) -> list[dict[str, Any]]:
        """Train ``run`` to its end unless done; pre-empted: :class:`SearchPreempted`, not done."""
        from e2mc.training.preemption import PreemptedAtStart
        from e2mc.training.run import run_training

        self._check_stop()
        if run.is_done():
            self.log(f"  {'skip' if self.jobs is None else 'read'} (done): {run.root}")
        else:
            role = ("control: the same run without the add-on (add-on none)" if control
                    else f"trial (add-on {cfg.addon.name})")
            self.log(f"  train {role}: {run.root}")
        try:
            with _warnings_to(lambda text: self._warned(text, run.root)):
                result = run_training(cfg, run.root, done_marker=True)  # marked done at its end
        except PreemptedAtStart as stop:  # a signal while the run was being built
            raise SearchPreempted(f"{run.root} {stop}; run the same command again to "
                                  "resume it") from None
        if not result.finished:
            raise SearchPreempted(f"{run.root} stopped at step {result.step} "
                                  f"({result.stop_reason}); run the same command again to "
                                  "resume it")
        self._check_stop()
        return [r for r in run.read_metrics() if self.spec.metric in r]

    def _work_key(self, directory: Path) -> str:
        return directory.relative_to(self.files.root).as_posix()

    def _train_work(self, cfg: Any, run: RunDir) -> Work:
        return Work(self._work_key(run.root), TrainJob(cfg, run.root), run.root,
                    run.is_done)

    def _run_jobs(self, works: list[Work], kind: str) -> None:
        """Bring ``works`` to done as jobs; one stopped unfinished is :class:`SearchPreempted`."""
        assert self.jobs is not None
        unique = list({w.key: w for w in works}.values())  # a shared control once
        try:
            self.jobs.run(unique, kind, should_stop=lambda: self._stop_requested())
        except JobStopped as stop:
            raise SearchPreempted(str(stop)) from None
        finally:
            record = self.jobs.read_record()
            for w in unique:
                for text in record.get(w.key, {}).get("warnings", []):
                    self._warned(text, w.directory)

    def _warned(self, text: str, run: Path) -> None:
        runs = self.warnings.setdefault(text.strip(), [])
        if self._work_key(run) not in runs:
            runs.append(self._work_key(run))

    def run(self) -> dict[str, Any]:
        """Train every trial and its control, apply the rule, write the search's files (under
        the directory's lock); returns the record."""
        with writer_lock(self.out):
            self.files.refuse_links(*(rd.root for t in self.spec.trials
                                      for rd in self.run_dirs(t)))
            return self._run()

    def _run(self) -> dict[str, Any]:
        if self.files.json.is_file():  # the warnings of runs done before (not run again)
            old = json.loads(self.files.json.read_text(encoding="utf-8"))
            self.warnings = {w["text"]: w["runs"] for w in old.get("warnings", [])}
        record: dict[str, Any] = {"spec": self.spec.identity(),
                                  "trials": [], "selected": None}
        self._write(record)  # the rule is on disk before the first run
        metric = self.spec.metric
        if self.jobs is not None:  # every trial and control as a job, side by side
            self._run_jobs([self._train_work(cfg, rd) for trial in self.spec.trials
                            for cfg, rd in zip((self.configs[trial.name],
                                                self.controls[trial.name]),
                                               self.run_dirs(trial), strict=True)], "train")
        for trial in self.spec.trials:
            self.log(f"trial {display_name(trial.name)}")
            run, control = self.run_dirs(trial)
            ours = self._train(self.configs[trial.name], run)
            theirs = self._train(self.controls[trial.name], control, control=True)
            row = {"name": trial.name, "overrides": trial.overrides, "run": str(run.root),
                   "control": str(control.root), "trajectory": _points(ours, metric),
                   "control_trajectory": _points(theirs, metric)}
            if ours and theirs:
                row.update(value=ours[-1][metric], control_value=theirs[-1][metric],
                           start_value=ours[0][metric], steps=ours[-1]["step"],
                           difference=ours[-1][metric] - theirs[-1][metric])
            record["trials"].append(row)
            self._write(record)
        record["selected"] = select(record["trials"])
        record["warnings"] = [{"text": k, "runs": v} for k, v in self.warnings.items()]
        self._write(record)
        self._report(record)
        return record

    def _write(self, record: dict[str, Any]) -> None:
        atomic_write_text(self.files.json, json.dumps(record, indent=2))

    def _report(self, record: dict[str, Any]) -> None:
        atomic_write_text(self.files.markdown, search_markdown(record))
        plot_trajectories(record, self.files.plot)
        chosen = record["selected"]
        table = [line for line in search_markdown(record).splitlines() if line.startswith("|")]
        self.log("\n".join(table))  # every trial against its control, selected or not
        if chosen is None:
            self.log(f"no trial beat its control on {self.spec.metric}: nothing selected")
        else:
            row = next(t for t in record["trials"] if t["name"] == chosen)
            self.log(f"selected: {display_name(chosen)} ({self.spec.metric} "
                     f"{row['difference']:+.2f} against its control on the validation split)")
        for text, runs in self.warnings.items():
            self.log(f"{text} ({len(runs)} run(s), listed in search.md)")
        self.log(f"the search's table and rule: {self.files.markdown}; the trajectories: "
                 f"{self.files.plot}")

    def confirm(self, seeds: Sequence[int], record: dict[str, Any],
                eval_fractions: Sequence[float] = (0.01, 0.1, 1.0),
                label_seeds: Sequence[int] = (0, 1, 2), probe_epochs: int = 30,
                device: str = "cpu") -> dict[str, Any] | None:
        """Train the selected trial and its control with each of ``seeds``, evaluate both on the
        test split and write ``confirm.md`` / ``confirm.json`` with the paired tests."""
        with writer_lock(self.out):
            return self._confirm(seeds, record, eval_fractions, label_seeds, probe_epochs,
                                 device)

    def _confirm(self, seeds: Sequence[int], record: dict[str, Any],
                 eval_fractions: Sequence[float], label_seeds: Sequence[int],
                 probe_epochs: int, device: str) -> dict[str, Any] | None:
        from e2mc.evaluation.workflow import evaluate_checkpoint

        chosen = record.get("selected")
        if chosen is None:
            self.log("nothing selected: nothing to confirm")
            return None
        trial = next(t for t in self.spec.trials if t.name == chosen)
        units = {}  # (seed, kind) -> (its config, run directory, evaluation's arguments)
        for seed in seeds:
            for kind, control in (("run", False), ("control", True)):
                run, out = self.files.confirm_run(seed, kind), self.files.confirm_eval(seed, kind)
                units[seed, kind] = (self._config(trial.control_overrides if control
                                                  else trial.overrides, control, seed), run,
                                     self._eval_call(run, out, eval_fractions, label_seeds,
                                                     probe_epochs, device))
        if self.jobs is not None:  # the runs as jobs, then their evaluations as jobs
            self._run_jobs([self._train_work(cfg, run) for cfg, run, _ in units.values()],
                           "train")
            self._run_jobs([evaluation_work(self._work_key(Path(call["out"])), call)
                            for _, _, call in units.values()], "eval")
        for (seed, kind), (cfg, run, call) in units.items():
            if kind == "run":
                self.log(f"confirm {display_name(chosen)}, training seed {seed}")
            self._train(cfg, run, control=kind == "control")
            evaluate_checkpoint(**call)  # read back when its directory holds it
        pairs = [(seed, self.files.confirm_eval(seed, "control").root,
                  self.files.confirm_eval(seed, "run").root) for seed in seeds]
        result = confirmation(pairs, chosen)
        atomic_write_text(self.files.confirm_json, json.dumps(result, indent=2))
        atomic_write_text(self.files.confirm_markdown, confirm_markdown(result))
        self.log(confirm_markdown(result))
        return result

    def _eval_call(self, run: RunDir, out: EvalDir, fractions: Sequence[float],
                   label_seeds: Sequence[int], probe_epochs: int, device: str
                   ) -> dict[str, Any]:
        """``evaluate_checkpoint``'s arguments for the test evaluation of ``run`` in ``out``."""
        from e2mc.evaluation.runner import EvalOptions
        from e2mc.evaluation.workflow import EvalData

        cfg = self.configs[self.spec.trials[0].name]
        options = EvalOptions(protocols=("linear", "knn"), fractions=tuple(fractions),
                              seeds=tuple(label_seeds), method="generic", knn_k=(20,),
                              knn_weightings=("weighted",),
                              linear_overrides={"epochs": probe_epochs}, device=device,
                              progress=False)
        return {"checkpoint": str(run.checkpoint), "out": str(out.root),
                "data": EvalData(self.spec.data), "options": options,
                "image_size": cfg.data.image_size, "cache": str(self.files.feature_cache),
                "reuse": True}


@contextmanager
def _warnings_to(note: Callable[[str], None]) -> Iterator[None]:
    """Within: ``sys.stderr`` passes through, and each ``warning:`` line goes to ``note`` too."""
    stream = sys.stderr

    class Tee:
        def write(self, text: str) -> int:
            for line in text.splitlines():
                if line.startswith("warning:"):
                    note(line)
            return stream.write(text)

        def __getattr__(self, name: str) -> Any:
            return getattr(stream, name)

    sys.stderr = Tee()  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stderr = stream


def _addon_reset(overrides: list[str], addon: str) -> list[str]:
    """``["addon.params={}"]`` when ``overrides`` name another add-on than the config's: it
    starts from its own defaults, then the trial's ``addon.params.*``."""
    names = [o.split("=", 1)[1].strip() for o in overrides
             if o.split("=", 1)[0].strip() == "addon.name"]
    return ["addon.params={}"] if names and names[-1] != addon else []


def _points(records: list[dict[str, Any]], metric: str) -> list[list[float]]:
    return [[r["step"], r[metric]] for r in records]
