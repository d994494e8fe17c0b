"""One CLI grammar (issue 24): ``--out`` is the output directory of every subcommand that writes
one, ``--quiet`` / ``-q`` the one silence flag, ``--seed`` the training seed (compare's and
analyze's other seeds named for what they seed), one spelling per option (issue 46: the old
spellings are gone), and optional extras noted only when asked for."""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np
import pytest

from e2mc.artifacts import EvalDir
from e2mc.cli import build_parser, main
from e2mc.errors import EXIT_INPUT
from helpers import TINY_RUN, recorded_data, tiny_base


def _parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


# ----------------------------------------------------------------------------- --out
def test_every_subcommand_that_writes_a_directory_takes_out() -> None:
    for argv in (["eval", "ckpt", "--data", "d"], ["analyze", "run", "--data", "d"],
                 ["search", "--config", "c", "--from", "x", "--data", "d"], ["demo"],
                 ["compare", "a"], ["continue", "--config", "c"]):
        args = _parse(*argv, "--out", "D")
        assert Path(getattr(args, "run_dir", None) or args.out) == Path("D"), argv


# ----------------------------------------------------------------------------- --quiet
@pytest.mark.parametrize("argv", [
    ["continue", "--config", "c", "--out", "R"], ["pretrain", "--config", "c", "--out", "R"],
    ["eval", "ckpt", "--data", "d", "--out", "D"], ["analyze", "run", "--data", "d", "--out", "D"],
    ["search", "--config", "c", "--from", "x", "--data", "d", "--out", "D"], ["demo"]])
def test_quiet_and_q_on_every_subcommand_that_shows_progress(argv: list[str]) -> None:
    assert _parse(*argv).quiet is False
    assert _parse(*argv, "--quiet").quiet is True
    assert _parse(*argv, "-q").quiet is True


def test_continue_quiet_and_seed_reach_the_config() -> None:
    from e2mc.commands._run_options import config_from_args

    args = _parse("continue", "--config", "fmnist-vicreg-continued", "--out", "R", "-q",
                  "--seed", "7")
    cfg = config_from_args(args, "continue")
    assert cfg.training.progress is False and cfg.training.seed == 7
    plain = config_from_args(_parse("continue", "--config", "fmnist-vicreg-continued",
                                    "--out", "R"), "continue")
    assert plain.training.progress is True and plain.training.seed == 0
    same = _parse("continue", "--config", "fmnist-vicreg-continued", "--out", "R", "--seed", "7",
                  "--set", "training.seed=7")
    assert config_from_args(same, "continue").training.seed == 7


def test_seed_and_a_different_set_training_seed_is_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["continue", "--config", "fmnist-vicreg-continued", "--out", str(tmp_path / "r"),
                 "--seed", "1", "--set", "training.seed=2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT_INPUT
    assert err == ["e2mc continue: error: --seed 1 and --set training.seed=2 disagree; give "
                   "the training seed once"]
    assert not (tmp_path / "r").exists()


def test_search_quiet_turns_off_its_runs_progress_but_not_their_identity(tmp_path: Path) -> None:
    from e2mc.search import Search, SearchSpec, grid_trials

    ckpt = tmp_path / "base.pt"
    ckpt.write_bytes(b"x")
    spec = SearchSpec(config="fmnist-vicreg-e2mc", checkpoint=str(ckpt),
                      checkpoint_sha256="0" * 64, data="builtin", val_split=0.2, seed=0,
                      metric="val/knn", common=list(TINY_RUN[:-1]),
                      trials=grid_trials(["addon.params.beta=1,2"]))
    spec.common = [c for c in spec.common if not c.startswith("training.progress")]
    loud, quiet = Search(spec, tmp_path / "a"), Search(spec, tmp_path / "b", progress=False)
    for name in loud.configs:
        assert loud.configs[name].training.progress is True
        assert quiet.configs[name].training.progress is False
        assert quiet.controls[name].training.progress is False
    assert loud.spec.identity() == quiet.spec.identity()  # resumable with or without -q


# ----------------------------------------------------------------------------- one spelling
def test_compare_and_analyze_name_their_seeds_for_what_they_seed() -> None:
    assert _parse("compare", "a").resample_seed == 0
    assert _parse("compare", "a", "--resample-seed", "4").resample_seed == 4
    base = ["analyze", "run", "--data", "d", "--out", "D"]
    assert _parse(*base).sample_seed == 0 and not hasattr(_parse(*base), "seed")
    assert _parse(*base, "--sample-seed", "3").sample_seed == 3


OLD_SPELLINGS = {"continue": ["--run-dir"], "pretrain": ["--run-dir"], "demo": ["--base"],
                 "analyze": ["--no-progress", "--seed"], "compare": ["--seed"],
                 "eval": ["--trust"]}


def test_no_command_has_an_old_spelling_and_no_help_lists_one() -> None:
    """Issue 46: one spelling per option. No command has an old one, and no command's ``--help``
    lists one or the words "old spelling"."""
    for name, p in _commands().items():
        text = p.format_help()
        assert "old spelling" not in text, name
        for old in OLD_SPELLINGS.get(name, []):
            assert old not in p._option_string_actions, (name, old)
            assert not any(w.strip("[],") == old for w in text.split()), (name, old)


# ----------------------------------------------------------------------------- compare --out
def _eval_dir(root: Path, correct: int) -> Path:
    from e2mc.evaluation.results import save_predictions

    labels = np.arange(40) % 2
    preds = labels.copy()
    preds[correct:] = 1 - preds[correct:]
    entries = []
    for seed in (0, 1):
        rel = save_predictions(root, f"linear_10_seed{seed}", preds, labels)
        entries.append({"protocol": "linear", "column": "linear 10%", "primary": "top1",
                        "metrics": {"top1": 100 * correct / 40}, "fraction": 0.1, "seed": seed,
                        "predictions": rel})
    EvalDir(root).write({"entries": entries, **recorded_data(labels)})
    return root


def test_compare_out_is_a_directory_and_its_resample_seed_gives_the_same_numbers(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = _eval_dir(tmp_path / "evals" / "a", 20)
    b = _eval_dir(tmp_path / "evals" / "b", 30)
    args = [str(a), str(b), "--resamples", "200"]
    assert main(["compare", *args, "--out", str(tmp_path / "new"), "--resample-seed", "3"]) == 0
    out = capsys.readouterr().out
    names = ["comparison.html", "comparison.md", "comparison.png", "comparison.csv",
             "comparison_tests.csv"]
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == sorted(names)
    assert f"paired tests in {tmp_path / 'new' / 'comparison.md'}" in out
    tests = list(csv.DictReader((tmp_path / "new" / "comparison_tests.csv").open()))
    assert [float(t["difference"]) for t in tests] == [25.0, 25.0]
    assert main(["compare", *args, "--out", str(tmp_path / "again"), "--resample-seed", "3"]) == 0
    for name in names[3:]:  # the same resampling seed: the same p-values and intervals
        assert (tmp_path / "again" / name).read_bytes() == (tmp_path / "new" / name).read_bytes()
    assert main(["compare", *args]) == 0  # default: the first run's parent directory
    assert (tmp_path / "evals" / "comparison.md").is_file()


def test_compare_out_refuses_a_file_and_a_stale_prefix_comparison(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = _eval_dir(tmp_path / "a", 20)
    b = _eval_dir(tmp_path / "b", 30)
    (tmp_path / "file").write_text("x")
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "file")]) == EXIT_INPUT
    err = capsys.readouterr().err
    assert err.startswith("e2mc compare: error: --out ") and "is a directory now" in err
    (tmp_path / "table.md").write_text("| run | linear 10% |\n| old | 99.0 |\n")
    (tmp_path / "table.csv").write_text("run,column,mean\nold,linear 10%,99.0\n")
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "table")]) == EXIT_INPUT
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "would not update" in err
    assert "remove table.md, table.csv" in err
    assert not (tmp_path / "table").exists()


# ----------------------------------------------------------------------------- extras' notes
def test_tensorboard_note_only_when_asked_and_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import e2mc.training.logging as run_logging
    from e2mc.config import load_config
    from e2mc.training.logging import MetricsLogger

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # not installed
    monkeypatch.setattr(run_logging, "_NOTED", set())
    default = load_config("fmnist-vicreg-continued")
    assert default.logging.tensorboard is None
    with MetricsLogger(tmp_path / "a", config=default) as logger:
        logger.log(1, {"loss": 1.0})
    assert capsys.readouterr().err == ""
    asked = load_config("fmnist-vicreg-continued", ["logging.tensorboard=true"])
    for run in ("b", "c"):
        with MetricsLogger(tmp_path / run, config=asked) as logger:
            logger.log(1, {"loss": 1.0})
    err = capsys.readouterr().err
    assert err.count("note: tensorboard is not installed") == 1
    assert not (tmp_path / "b" / "tensorboard").exists()
    off = load_config("fmnist-vicreg-continued", ["logging.tensorboard=false"])
    assert off.logging.tensorboard is False


# ----------------------------------------------------------------------------- end to end
@pytest.mark.slow  # integration: a few seconds on 2 cores
def test_pretrain_with_out_seed_and_quiet_prints_no_progress(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    from e2mc.config import read_yaml

    _, data = tiny_base(tmp_path)
    sets = [a for item in TINY_RUN if not item.startswith("training.progress")
            for a in ("--set", item)]
    run = tmp_path / "run"
    assert main(["pretrain", "--config", "fmnist-vicreg-pretrain", "--out", str(run), "--data",
                 str(data), "--seed", "3", "--quiet", *sets,
                 "--set", "model.backbone=mobilenet_v3_small",
                 "--set", "training.max_steps=2"]) == 0
    err = capfd.readouterr().err
    assert "\r" not in err and "step/s" not in err and "epoch 1/1" not in err
    # what the run is, what auto chose, where it started (start.json), that its backbone
    # sees 1 x 1 pixel at the end (mobilenet_v3_small at 16 px), where it stopped; nothing
    # between
    lines = err.strip().splitlines()
    assert len(lines) == 5 and lines[0].startswith("pretrain fmnist-vicreg-pretrain: vicreg")
    assert lines[1].startswith("auto: data.pipeline=pil (arrays, not image files")
    assert lines[2].startswith("start: ")
    assert lines[3].startswith("note: at 16 px the last feature map of mobilenet_v3_small is 1 "
                               "x 1 pixel")
    assert lines[-1].startswith("stopped (training.max_steps=2): epoch 0/1, "
                                                   "step 2")
    cfg = read_yaml(run / "config.yaml")
    assert cfg["training"]["seed"] == 3 and cfg["training"]["progress"] is False
    assert "tensorboard" not in err


# ----------------------------------------------------------------------------- help (issue 33)
def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _options(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in p._actions if a.option_strings and a.help != argparse.SUPPRESS
            and not isinstance(a, argparse._HelpAction)]


def _metavar(a: argparse.Action) -> str | None:
    if a.nargs == 0:
        return None  # a flag
    if a.metavar is not None:
        return str(a.metavar)
    if a.choices is not None:
        return "{" + ",".join(map(str, a.choices)) + "}"
    return a.dest.upper()


def _takes_value(a: argparse.Action) -> bool:
    return a.nargs != 0 and not isinstance(a, argparse.BooleanOptionalAction)


def test_every_option_says_what_it_does_and_its_default() -> None:
    missing, unstated = [], []
    for name, p in _commands().items():
        for a in _options(p):
            if not a.help or len(a.help) < 8:
                missing.append(f"{name} {a.option_strings[0]}")
            elif (_takes_value(a) and not a.required and not isinstance(a, argparse._AppendAction)
                  and "default" not in a.help and "without it" not in a.help):
                unstated.append(f"{name} {a.option_strings[0]}")
    assert not missing, f"options without help: {missing}"
    assert not unstated, f"options whose default the help does not state: {unstated}"


def test_one_metavar_per_option_name_across_commands() -> None:
    seen: dict[str, dict[str, list[str]]] = {}
    for name, p in _commands().items():
        for a in _options(p):
            mv = _metavar(a)
            if mv is not None:
                seen.setdefault(a.option_strings[0], {}).setdefault(mv, []).append(name)
    split = {o: mvs for o, mvs in seen.items() if len(mvs) > 1}
    assert not split, f"one option name, several metavars: {split}"
    for option, metavar in (("--out", "DIR"), ("--seed", "N"), ("--from", "CHECKPOINT"),
                            ("--val-split", "FRACTION_OR_COUNT"), ("--data", "DATA"),
                            ("--device", "DEVICE")):
        assert set(seen[option]) == {metavar}, option


def _help_texts(p: argparse.ArgumentParser) -> list[str]:
    texts = [p.description or ""]
    texts += [a.help or "" for a in p._actions if a.help != argparse.SUPPRESS]
    return texts


def test_no_help_names_an_option_its_command_does_not_have() -> None:
    """A help text copied from another command names options this one lacks (pretrain's
    "(not with --from)"); options of another command are named with it ("e2mc continue
    --keep-best")."""
    import re

    commands = _commands()
    named = re.compile(r"(?:e2mc ([a-z-]+)(?: [A-Z.]+)* )?(--[a-z][a-z0-9-]*)")
    wrong = []
    for name, p in commands.items():
        own = {s for a in p._actions for s in a.option_strings}
        for text in _help_texts(p):
            for m in named.finditer(text):
                other, option = m.group(1), m.group(2)
                where = commands.get(other, p)
                if option not in {s for a in where._actions for s in a.option_strings}:
                    wrong.append(f"{name}: {option!r} in {text[:60]!r}")
            assert own  # every command has options
    assert not wrong, wrong


def test_help_texts_speak_of_their_own_command() -> None:
    commands = _commands()
    for name in ("eval",):
        text = " ".join(_help_texts(commands[name]))
        assert "training job" not in text  # eval submits evaluations only
        assert "RUN_DIR" not in text  # eval writes OUT
    analyze = " ".join(_help_texts(commands["analyze"]))
    assert "latest checkpoint" not in analyze  # a run directory stands for best.pt (--last)
    assert _parse("demo", "--from", "x.pt").base == "x.pt"


def test_every_long_option_is_unique_per_command_and_helps_in_one_voice() -> None:
    """The same help text twice in one command is a copy (each option says what it does)."""
    for name, p in _commands().items():
        texts = [a.help for a in _options(p) if a.help]
        twice = {t for t in texts if texts.count(t) > 1}
        assert not twice, (name, twice)
