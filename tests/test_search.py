"""``e2mc search``: paired trials on a validation split, the declared rule, resuming, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from e2mc.artifacts import SEARCH_JSON
from e2mc.cli import main
from e2mc.search import Trial, file_trials, grid_trials, select
from helpers import TINY_RUN, recorded_data, tiny_base

TINY = [*TINY_RUN, "monitor.every=2", "monitor.probe_epochs=2", "monitor.knn_k=3"]


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return tiny_base(tmp_path_factory.mktemp("search-base"))


def _search(base: tuple[Path, Path], out: Path, *extra: str) -> int:
    ckpt, data = base
    sets = [a for item in TINY for a in ("--set", item)]
    return main(["search", "--config", "fmnist-vicreg-e2mc", "--from", str(ckpt),
                 "--data", str(data), "--out", str(out), "--metric", "val/knn", *sets, *extra])


def test_grid_and_file_trials(tmp_path: Path) -> None:
    trials = grid_trials(["optim.base_lr=0.1,0.01", "training.epochs=1,2"])
    assert [t.overrides for t in trials] == [
        ["optim.base_lr=0.1", "training.epochs=1"], ["optim.base_lr=0.1", "training.epochs=2"],
        ["optim.base_lr=0.01", "training.epochs=1"], ["optim.base_lr=0.01", "training.epochs=2"]]
    listed = tmp_path / "trials.yaml"
    listed.write_text("- {name: small, set: {addon.params.beta: 10}}\n"
                      "- {optim.base_lr: 0.5}\n")
    assert [(t.name, t.overrides) for t in file_trials(listed)] == [
        ("small", ["addon.params.beta=10"]), ("optim.base_lr=0.5", ["optim.base_lr=0.5"])]
    assert Trial("b", ["addon.params.beta=1", "optim.base_lr=2"]).control_overrides == [
        "optim.base_lr=2"]


def test_the_rule_selects_the_largest_positive_difference_or_nothing() -> None:
    rows = [{"name": "a", "difference": 0.5}, {"name": "b", "difference": 1.5},
            {"name": "c", "difference": None}]
    assert select(rows) == "b"
    assert select([{"name": "a", "difference": 0.0}, {"name": "b", "difference": -1.0}]) is None
    assert select([]) is None
    # float32 rounding of two equal accuracies is a tie, won by the earlier trial
    tied = [{"name": "lr 0.001", "difference": 0.1999974}, {"name": "lr 0.01",
            "difference": 0.2000014}, {"name": "lr 0.1", "difference": -0.47}]
    assert select(tied) == "lr 0.001"
    assert select([{"name": "a", "difference": 0.2}, {"name": "b", "difference": 0.21}]) == "b"
    assert select([{"name": "a", "difference": 5e-5}]) is None  # zero up to rounding


def test_search_with_no_winner_selects_nothing_and_resumes(base: tuple[Path, Path],
                                                           tmp_path: Path,
                                                           capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "search"
    # beta = gamma = 0: the add-on adds nothing, so each trial trains exactly like its control
    assert _search(base, out, "--grid", "addon.params.beta=0", "--grid",
                   "addon.params.gamma=0") == 0
    record = json.loads((out / SEARCH_JSON).read_text())
    (row,) = record["trials"]
    assert row["difference"] == 0.0 and record["selected"] is None
    assert "trial minus its control" in record["spec"]["rule"]
    assert [p[0] for p in row["trajectory"]] == [0, 2, 4]
    err = capsys.readouterr().err
    assert "nothing selected" in err
    assert "  train trial (add-on e2mc): " in err
    assert "  train control: the same run without the add-on (add-on none): " in err
    # even with nothing selected: the table of every trial against its control, and the paths
    assert "| trial | steps | start | control | trial | difference |" in err
    assert f"| {row['name']} | 4 |" in err and "+0.00 |" in err
    assert f"the search's table and rule: {out / 'search.md'}" in err
    assert "No trial beat its control" in (out / "search.md").read_text()
    assert (out / "search.png").stat().st_size > 0
    # the runs' warnings (8 validation images, 4 scored, 4 probe labels): on the terminal
    # and in search.md, each once, named with both runs
    said, thin = record["warnings"]
    assert said["text"].startswith("warning: the monitor scores on 4 validation images: one "
                                   "image is 25 points of accuracy")
    assert thin["text"].startswith("warning: the monitor's val/linear_1% (4 labels)")
    assert said["runs"] == thin["runs"] and len(said["runs"]) == 2
    assert f"- {said['text']} ({', '.join(said['runs'])})" in \
        (out / "search.md").read_text().replace("\\", "")
    assert f"{said['text']} (2 run(s), listed in search.md)" in err
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("checkpoint.pt")}
    assert len(stamps) == 2  # the trial and its control
    assert _search(base, out, "--grid", "addon.params.beta=0", "--grid",
                   "addon.params.gamma=0") == 0
    assert "  train " not in capsys.readouterr().err  # nothing re-run
    assert json.loads((out / SEARCH_JSON).read_text())["warnings"] == record["warnings"]
    assert {p: p.stat().st_mtime_ns for p in out.rglob("checkpoint.pt")} == stamps


def test_search_refuses_another_base_an_unknown_key_and_metric(base: tuple[Path, Path],
                                                               tmp_path: Path,
                                                               capsys: pytest.CaptureFixture
                                                               ) -> None:
    ckpt, data = base
    out = tmp_path / "s"
    out.mkdir()
    (out / SEARCH_JSON).write_text(json.dumps({"spec": {"checkpoint_sha256": "0" * 64}}))
    assert _search(base, out, "--grid", "addon.params.beta=0") == 2
    assert "another" in capsys.readouterr().err
    assert _search(base, tmp_path / "k", "--grid", "optim.base_rate=0.1") == 2
    assert "optim.base_rate" in capsys.readouterr().err
    assert _search(base, tmp_path / "p", "--grid", "addon.params.betta=1") == 2
    assert "no 'betta'" in capsys.readouterr().err
    assert _search(base, tmp_path / "m", "--grid", "addon.params.beta=0", "--metric",
                   "val/acc") == 2
    assert "unknown monitor metric" in capsys.readouterr().err


def _eval_dir(root: Path, correct: np.ndarray, seeds: tuple[int, ...]) -> Path:
    from e2mc.artifacts import EvalDir
    from e2mc.evaluation.results import save_predictions

    labels = np.zeros(len(correct), dtype=np.int64)
    entries = []
    for seed in seeds:
        rel = save_predictions(root, f"linear_1_s{seed}", np.where(correct, 0, 1), labels)
        entries.append({"protocol": "linear", "column": "linear 1%", "fraction": 0.01,
                        "seed": seed, "primary": "top1",
                        "metrics": {"top1": 100 * correct.mean()}, "predictions": rel})
    EvalDir(root).write({"entries": entries, **recorded_data(labels)})
    return root


def test_confirmation_pairs_each_seed_and_pools(tmp_path: Path) -> None:
    from e2mc.search import confirm_markdown, confirmation

    control = np.arange(200) < 100  # right on 100 of 200 test images
    better = np.arange(200) < 140  # the same 100 and 40 more
    pairs = [(s, _eval_dir(tmp_path / f"c{s}", control, (0, 1)),
              _eval_dir(tmp_path / f"t{s}", better, (0, 1))) for s in (0, 1)]
    result = confirmation(pairs, "lr 0.1")
    col = result["columns"]["linear 1%"]
    assert col["difference"]["mean"] == pytest.approx(20.0) and col["difference"]["se"] == 0
    assert (col["pairs"], col["significant_better"], col["significant_worse"]) == (4, 4, 0)
    assert col["pooled_p"] < 0.001
    assert "| linear 1% | +20.00 ± 0.00 | 4/4 | 0/4 |" in confirm_markdown(result)


def test_confirm_trains_each_seed_and_tests_on_the_test_split(base: tuple[Path, Path],
                                                               tmp_path: Path) -> None:
    from e2mc.artifacts import SearchDir
    from e2mc.files import sha256_file
    from e2mc.search import Search, SearchSpec

    ckpt, data = base
    spec = SearchSpec(config="fmnist-vicreg-e2mc", checkpoint=str(ckpt),
                      checkpoint_sha256=sha256_file(ckpt), data=str(data), val_split=0.2,
                      seed=0, metric="val/knn", common=TINY,
                      trials=[Trial("beta 1", ["addon.params.beta=1"])])
    search = Search(spec, tmp_path / "s", log=lambda _m: None)
    result = search.confirm([0, 1], {"selected": "beta 1"}, eval_fractions=(0.5, 1.0),
                            label_seeds=(0,), probe_epochs=2)
    assert result is not None and result["seeds"] == [0, 1]
    assert set(result["columns"]) == {"linear 50%", "linear 100%", "knn k=20"}
    assert all(c["pairs"] == 2 for c in result["columns"].values())
    files = SearchDir(tmp_path / "s")
    assert files.confirm_markdown.is_file() and files.confirm_json.is_file()
    for seed in (0, 1):
        for kind in ("run", "control"):
            assert files.confirm_run(seed, kind).checkpoint.is_file()
            assert files.confirm_eval(seed, kind).exists()
    assert search.confirm([0], {"selected": None}) is None  # nothing selected: nothing to do


# --------------------------------------------------------------------------- trust (issue 22)
def _spec(base: tuple[Path, Path], trials: list[Trial], *common: str):
    from e2mc.files import sha256_file
    from e2mc.search import SearchSpec

    ckpt, data = base
    return SearchSpec(config="fmnist-vicreg-e2mc", checkpoint=str(ckpt),
                      checkpoint_sha256=sha256_file(ckpt), data=str(data), val_split=0.2,
                      seed=0, metric="val/knn", common=[*TINY, *common], trials=trials)


def test_trial_directories_are_injective_and_same_settings_are_refused(
        base: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from e2mc.search import Search

    # two names with one slug, different settings: two directories
    named = [Trial("beta 100", ["addon.params.beta=100"]),
             Trial("beta_100", ["addon.params.beta=10"])]
    search = Search(_spec(base, named), tmp_path / "a", log=lambda _m: None)
    assert len({search.run_dirs(t)[0].root for t in named}) == 2
    # a 5-axis grid of 32 trials (long keys, names past any cut): 32 trial directories and
    # one control per point of the axes that do not configure the add-on
    grid = grid_trials(["addon.params.beta=1,2", "addon.params.gamma=1,2",
                        "optim.base_lr=0.01,0.02", "optim.weight_decay=0.0001,0.0002",
                        "optim.warmup_epochs=0,0.5"])
    search = Search(_spec(base, grid), tmp_path / "b", log=lambda _m: None)
    dirs = [search.run_dirs(t) for t in grid]
    assert len({r.root for r, _ in dirs}) == 32 and len({c.root for _, c in dirs}) == 8
    # the same settings twice (another spelling of 0.1), or one name twice: refused, exit 2
    listed = tmp_path / "same.yaml"
    listed.write_text("- {name: a, set: {optim.base_lr: 0.1}}\n"
                      "- {name: b, set: {optim.base_lr: 0.10}}\n")
    assert _search(base, tmp_path / "c", "--trials", str(listed)) == 2
    assert "trials 'a' and 'b' have the same settings" in capsys.readouterr().err
    listed.write_text("- {name: a, set: {optim.base_lr: 0.1}}\n"
                      "- {name: a, set: {optim.base_lr: 0.2}}\n")
    assert _search(base, tmp_path / "d", "--trials", str(listed)) == 2
    assert "'a' is used more than once" in capsys.readouterr().err


def test_controls_that_trained_the_same_are_one_line_named_after_their_trials() -> None:
    from e2mc.search.report import control_lines

    same, other = [[0, 50.0], [2, 51.0]], [[0, 50.0], [2, 49.5]]
    record = {"trials": [{"name": "b1", "control_trajectory": same},
                         {"name": "b2", "control_trajectory": same},
                         {"name": "lr", "control_trajectory": other},
                         {"name": "x", "control_trajectory": []}]}
    assert control_lines(record) == [(["b1", "b2"], [(0.0, 50.0), (2.0, 51.0)]),
                                     (["lr"], [(0.0, 50.0), (2.0, 49.5)])]


def test_search_speaks_continues_language(base: tuple[Path, Path], tmp_path: Path) -> None:
    """Every option of ``e2mc continue`` that configures a run is an option of ``e2mc search``
    with the same spelling, help and config key (``--device`` is the training device, the
    probes' is ``--probe-device``), and search's help names no old spelling: ``--backbone X
    --new-heads --epochs 2 --device cpu`` give every run what ``--set`` of those keys gives."""
    import argparse

    from e2mc.cli import build_parser
    from e2mc.commands._run_options import TRAINING_KEYS
    from e2mc.search import Search, make_spec

    subparsers = next(a for a in build_parser()._actions
                      if isinstance(a, argparse._SubParsersAction))
    helps = {name: {a.dest: (a.option_strings, a.help) for a in subparsers.choices[name]._actions}
             for name in ("continue", "search")}
    assert set(TRAINING_KEYS) >= {"backbone", "new_heads", "device", "epochs"}
    for dest in TRAINING_KEYS:
        assert helps["search"][dest] == helps["continue"][dest], dest
    text = subparsers.choices["search"].format_help()
    assert "old spelling" not in text and "--probe-device" in text
    ckpt, data = base
    args = build_parser().parse_args([
        "search", "--config", "fmnist-vicreg-e2mc", "--from", str(ckpt), "--data", str(data),
        "--out", str(tmp_path / "s"), "--grid", "addon.params.beta=10", "--backbone",
        "cnn5_small", "--new-heads", "--epochs", "2", "--device", "cpu",
        *[a for item in TINY for a in ("--set", item)]])
    from e2mc.commands._run_options import training_overrides

    common = [*args.common, *training_overrides(args)]
    assert common[-4:] == ["init.new_heads=true", "model.backbone=cnn5_small",
                           "training.epochs=2", "training.device=cpu"]
    spec = make_spec(args.config, args.checkpoint, args.data, 0.2, 0, "val/knn", common,
                     [Trial("b", ["addon.params.beta=10"])])
    search = Search(spec, tmp_path / "s", log=lambda m: None)
    for cfg in (search.configs["b"], search.controls["b"]):
        assert (cfg.model.backbone, cfg.init.new_heads, cfg.training.epochs,
                cfg.training.device) == ("cnn5_small", True, 2, "cpu")


def test_a_grid_over_the_addon_gives_each_addon_its_own_params(base: tuple[Path, Path],
                                                              tmp_path: Path) -> None:
    """``--grid addon.name=e2mc,vcreg`` on an E2MC preset: the e2mc trial keeps the preset's
    params, the vcreg trial starts from VCReg's defaults (not E2MC's beta and gamma, which it
    would refuse), a trial's own ``addon.params.*`` apply on top and are checked against its
    add-on; both trials share one control; the search runs and reports both."""
    from e2mc.addons import VCReg
    from e2mc.search import Search, make_spec

    ckpt, data = base

    def search(trials: list[Trial]) -> Search:
        spec = make_spec("fmnist-vicreg-e2mc", str(ckpt), str(data), 0.2, 0, "val/knn", TINY,
                         trials)
        return Search(spec, tmp_path / "s", log=lambda m: None)

    found = search(grid_trials(["addon.name=e2mc,vcreg"]))
    e2mc, vcreg = (found.configs[f"addon.name={n}"].addon for n in ("e2mc", "vcreg"))
    assert (e2mc.name, e2mc.params["beta"], e2mc.params["gamma"]) == ("e2mc", 1000.0, 100.0)
    assert (vcreg.name, dict(vcreg.params)) == ("vcreg", {})
    assert len({found.run_dirs(t)[1].root for t in found.spec.trials}) == 1  # one control
    mu = search([Trial("vc", ["addon.name=vcreg", "addon.params.mu=0.5"])])
    assert dict(mu.configs["vc"].addon.params) == {"mu": 0.5}
    assert VCReg(**mu.configs["vc"].addon.params).nu == 0.001  # the rest: VCReg's defaults
    with pytest.raises(ValueError, match="beta"):  # E2MC's key is not VCReg's
        search([Trial("vc", ["addon.name=vcreg", "addon.params.beta=5"])])
    assert _search(base, tmp_path / "run", "--grid", "addon.name=e2mc,vcreg") == 0
    rows = json.loads((tmp_path / "run" / SEARCH_JSON).read_text())["trials"]
    assert [r["name"] for r in rows] == ["addon.name=e2mc", "addon.name=vcreg"]
    assert rows[0]["control_trajectory"] == rows[1]["control_trajectory"]
    assert all(r["difference"] is not None for r in rows)
