"""Sanity flags in every verdict, and the answer last (issue 41): each flag built from its case
and asserted as the user sees it, in the last lines ``e2mc compare`` prints (the flags, one
headline per run, the page) and on the page; a training epoch's dropped images said at the start
and recorded in the checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from e2mc.checkpoints import checkpoint_summary, load_checkpoint
from e2mc.cli import main
from helpers import TINY_RUN, one_column_eval_dir, tiny_base

N = 200


def _eval_dir(root: Path, correct: int, **kw) -> Path:
    """One "linear 1%" column of N test images (:func:`helpers.one_column_eval_dir`)."""
    return one_column_eval_dir(root, correct, N, column="linear 1%", fraction=0.01, **kw)


def _compare(tmp_path: Path, a: Path, b: Path, capsys) -> list[str]:
    out = tmp_path / "cmp"
    assert main(["compare", str(a), str(b), "--names", "continued,e2mc", "--out", str(out),
                 "--resamples", "200"]) == 0
    return capsys.readouterr().out.rstrip("\n").splitlines()


def test_the_answer_is_last_a_headline_per_run_then_the_page(tmp_path: Path, capsys) -> None:
    a = _eval_dir(tmp_path / "a", 150)  # 75 %, above the chance of 2 classes
    b = _eval_dir(tmp_path / "b", 190)
    lines = _compare(tmp_path, a, b, capsys)
    assert lines[-1] == f"page: {tmp_path / 'cmp' / 'comparison.html'}"
    assert lines[-2] == "e2mc against continued: BETTER at linear 1% ▲▲ (+20.00 ± 0.00, p 0.005)"
    # beside the ± and the p: what each is taken over
    assert lines[-3] == ("key: difference from continued in top-1 points ± over 2 label-subset "
                         "seeds (the probes' labelled images; not training seeds); p: paired "
                         "permutation test over 200 test images, pooled over the seeds; ▲ ▼ "
                         "p < 0.05, ▲▲ ▼▼ p < 0.01")
    assert lines[-4] == (f"files: the table, every verdict and the paired tests in "
                         f"{tmp_path / 'cmp' / 'comparison.md'} (beside it: .png, .csv, "
                         "_tests.csv)")
    assert lines[-5] == ""  # the answer is all the command prints


def test_a_headline_without_significance_still_gives_sizes_and_p_values(tmp_path: Path,
                                                                        capsys) -> None:
    """"No significant difference" says how large the difference is and its p-value, the ones
    of the verdict lines above it: +1 point at p 0.06 is not -0.02 at p 1."""
    import re

    a = _eval_dir(tmp_path / "a", 150)
    b = _eval_dir(tmp_path / "b", 152)  # +1 point, not significant on 200 images
    lines = _compare(tmp_path, a, b, capsys)
    md = (tmp_path / "cmp" / "comparison.md").read_text().splitlines()
    verdict = next(line for line in md if line.startswith("- e2mc, linear 1%: "))
    p = re.search(r"seed\(s\), p ([0-9.e-]+);", verdict).group(1)
    assert "no significant difference from continued (+1.00 ± 0.00 points" in verdict
    assert lines[-2] == ("e2mc against continued: no significant difference at linear 1% "
                         f"(+1.00 ± 0.00, p {p})")


def test_a_run_at_chance_is_flagged_by_name(tmp_path: Path, capsys) -> None:
    a = _eval_dir(tmp_path / "a", 150, classes=10, seeds=(0,))
    b = _eval_dir(tmp_path / "b", 20, classes=10, seeds=(0,))  # 10 % of 10 classes
    lines = _compare(tmp_path, a, b, capsys)
    flags = [line for line in lines if line.startswith("flag: ")]
    assert flags == ["flag: e2mc is at or near chance (linear 1% 10.00 %; chance 10.00 %, the "
                     "most common test class): it collapsed or learned nothing, and a difference "
                     "from it means nothing"]
    # no direction where a row is at chance: the headline, the .md and the page say so
    assert lines[-2] == ("e2mc against continued: not judged at linear 1% (at or near chance: "
                         "the flag above)")
    page = (tmp_path / "cmp" / "comparison.html").read_text()  # on the page and in the .md
    assert ('<li>e2mc against continued: <span class="unjudged">not judged at linear 1% (at or '
            "near chance: the flag above)</span></li>") in page
    assert ('<li class="unjudged">e2mc, linear 1%: not judged (at or near chance) against '
            "continued (") in page
    md = (tmp_path / "cmp" / "comparison.md").read_text()
    assert "e2mc, linear 1%: not judged (at or near chance) against continued" in md
    assert "| e2mc | 10.00 |" in md  # and no ▼ in its cell
    assert '<div class="flags"><ul><li>&#9873; e2mc is at or near chance' in page
    assert "- flag: e2mc is at or near chance" in (tmp_path / "cmp" / "comparison.md").read_text()


def test_two_runs_of_the_same_weights_are_nothing_to_compare(tmp_path: Path, capsys) -> None:
    """Two evaluations of one backbone (run_evaluation records its SHA-256) through the real
    evaluation, and two hand-written ones that predate the record (the checkpoint file's)."""
    from test_evaluation_cli import tiny_run

    a, b = tiny_run(tmp_path, "a", 0, 0.0), tiny_run(tmp_path, "b", 0, 0.0)
    flags = [line for line in _compare(tmp_path, a, b, capsys)
             if line.startswith("flag: ") and "same weights" in line]
    assert len(flags) == 1 and flags[0].startswith("flag: continued and e2mc are the same "
                                                   "weights (backbone sha256 ")
    assert flags[0].endswith("nothing to compare, their rows differ by nothing but chance")
    other = tiny_run(tmp_path, "c", 1, 1.0)
    assert not any("same weights" in line for line in _compare(tmp_path, a, other, capsys))
    md = (tmp_path / "cmp" / "comparison.md").read_text()  # the last comparison: no flag
    assert "same weights" not in md


def test_a_choice_at_the_edge_of_its_grid_is_flagged(tmp_path: Path, capsys) -> None:
    grid = {"settings": {"linear": {"1%": {"lr_grid": [0.03, 0.1, 0.3], "wd_grid": []}}}}
    a = _eval_dir(tmp_path / "a", 120, info=grid, config={"lr": 0.1, "weight_decay": 0.0})
    b = _eval_dir(tmp_path / "b", 120, info=grid, config={"lr": 0.3, "weight_decay": 0.0})
    flags = [line for line in _compare(tmp_path, a, b, capsys)
             if line.startswith("flag: ") and "grid" in line]
    assert flags == ["flag: e2mc's linear probes chose the largest lr of the grid in 2 of 2 "
                     "probes: the best value may lie beyond the grid; widen --lr-grid / "
                     "--wd-grid"]


def test_images_an_epoch_drops_and_a_stop_inside_an_epoch_are_flagged(tmp_path: Path,
                                                                       capsys) -> None:
    base, data = tiny_base(tmp_path)  # 40 training images
    run = tmp_path / "run"
    assert main(["continue", "--config", "fmnist-vicreg-e2mc", "--from", str(base),
                 "--data", str(data), "--out", str(run),
                 *[a for s in TINY_RUN for a in ("--set", s)], "--set", "training.batch_size=16",
                 "--set", "training.max_steps=1"]) == 0
    assert ("note: every epoch leaves 8 of the 40 images out (batch 16: 2 step(s) per epoch; "
            "other images each epoch)") in capsys.readouterr().err
    saved = torch.load(run / "checkpoint.pt", map_location="cpu", weights_only=False)
    assert saved["epoch_use"] == {"images": 40, "batch": 16, "steps": 2, "dropped": 8}
    _, loaded = load_checkpoint(run)  # what an evaluation of the run records
    info = {"checkpoint_info": checkpoint_summary(loaded, run / "checkpoint.pt")}
    a = _eval_dir(tmp_path / "a", 120)
    b = _eval_dir(tmp_path / "b", 120, info=info)
    lines = _compare(tmp_path, a, b, capsys)
    flags = [line for line in lines if line.startswith("flag: ") and "left out" in line]
    assert flags == ["flag: e2mc was trained with 8 of its 40 images left out of every epoch "
                     "(batch 16, 2 step(s) per epoch; others each epoch)"]
    # training.max_steps=1 stopped it inside its first epoch of 2 steps
    assert [line for line in lines if line.startswith("flag: ") and "max_steps" in line] == [
        "flag: e2mc was stopped by training.max_steps=1 inside an epoch: 0.50 of 1 epoch(s) "
        "of 2 steps; its last epoch saw 16 of the 40 images"]
    both = _eval_dir(tmp_path / "a2", 120, info=info)  # two runs trained alike: one line
    flags = [line for line in _compare(tmp_path, both, b, capsys)
             if line.startswith("flag: ") and "left out" in line]
    assert flags == ["flag: continued and e2mc were trained with 8 of their 40 images left out "
                     "of every epoch (batch 16, 2 step(s) per epoch; others each epoch)"]


@pytest.mark.parametrize("seeds", [(0,), (0, 1, 2)])
def test_the_key_says_what_the_spread_and_p_are_over(tmp_path: Path, capsys,
                                                     seeds: tuple[int, ...]) -> None:
    """Label-subset seeds where there are several (not training seeds), none where there is
    one; the test images always."""
    a = _eval_dir(tmp_path / "a", 120, seeds=seeds)
    b = _eval_dir(tmp_path / "b", 120, seeds=seeds)
    said = [line for line in _compare(tmp_path, a, b, capsys) if line.startswith("key: ")]
    assert said == ["key: difference from continued in top-1 points" + (
        " ± over 3 label-subset seeds (the probes' labelled images; not training seeds); p: "
        "paired permutation test over 200 test images, pooled over the seeds" if len(seeds) > 1
        else " (one seed, no ±); p: paired permutation test over 200 test images")
        + "; ▲ ▼ p < 0.05, ▲▲ ▼▼ p < 0.01"]
    assert not any("seeds:" in line for line in _compare(tmp_path, a, b, capsys))


def _with_knn(root: Path, correct: int, k: int, num_train: int, classes: int = 10) -> Path:
    """Add a "knn k=K" column (``correct`` of N right) and the training bank's size."""
    import json

    import numpy as np

    from e2mc.artifacts import EvalDir
    from e2mc.evaluation.results import save_predictions

    labels = np.arange(N) % classes
    preds = labels.copy()
    preds[correct:] = (preds[correct:] + 1) % classes
    record = json.loads((root / "results.json").read_text())
    record["entries"].append({
        "protocol": "knn", "column": f"knn k={k}", "primary": "top1", "fraction": 1.0,
        "seed": 0, "metrics": {"k": k, "top1": 100 * correct / N},
        "predictions": save_predictions(root, f"knn_k{k}", preds, labels)})
    record["num_train"] = num_train
    EvalDir(root).write(record)
    return root


def test_probes_at_chance_beside_a_knn_above_it_are_the_probes(tmp_path: Path, capsys) -> None:
    """A run whose kNN is far above chance and whose linear probe is at it: the probe learned
    nothing, not the model; a run at chance everywhere: the model."""
    a = _with_knn(_eval_dir(tmp_path / "a", 150, classes=10, seeds=(0,)), 150, 20, 10000)
    b = _with_knn(_eval_dir(tmp_path / "b", 20, classes=10, seeds=(0,)), 140, 20, 10000)
    flags = [line for line in _compare(tmp_path, a, b, capsys) if line.startswith("flag: ")]
    assert flags == ["flag: e2mc's linear 1% at or near chance (linear 1% 10.00 %; chance "
                     "10.00 %, the most common test class) while its knn k=20 70.00 % is above "
                     "it: those probes learned next to nothing (their settings, or too few "
                     "labels), and a difference there means nothing"]
    c = _with_knn(_eval_dir(tmp_path / "c", 20, classes=10, seeds=(0,)), 24, 20, 10000)
    flags = [line for line in _compare(tmp_path, a, c, capsys) if line.startswith("flag: ")]
    assert flags[0].startswith("flag: e2mc is at or near chance (linear 1% 10.00 %, knn k=20 "
                               "12.00 %;") and flags[0].endswith("it collapsed or learned "
                                                                 "nothing, and a difference "
                                                                 "from it means nothing")


def test_a_knn_k_beyond_a_class_of_the_bank_is_flagged(tmp_path: Path, capsys) -> None:
    """k = 200 over 400 training images of 10 classes (40 a class) is flagged, once for the
    runs evaluated alike; k = 20 of the same bank, or k = 200 of 4,000 images, is not."""
    def run(name: str, k: int, train: int) -> Path:
        return _with_knn(_eval_dir(tmp_path / name, 150, classes=10, seeds=(0,)), 150, k, train)

    flags = [line for line in _compare(tmp_path, run("a", 200, 400), run("b", 200, 400), capsys)
             if line.startswith("flag: ") and "linear 1%" not in line]  # 4 labels: few
    assert flags == ["flag: continued and e2mc: knn k=200 votes over 200 of 400 training "
                     "images, more than the 40 a class has on average (10 classes): the vote "
                     "leans to the class frequencies, whatever the neighbours"]
    for k, train in ((20, 400), (200, 4000)):
        lines = _compare(tmp_path, run(f"a{k}{train}", k, train), run(f"b{k}{train}", k, train),
                         capsys)
        assert not any("votes over" in line for line in lines)


def test_a_kept_starting_model_is_flagged(tmp_path: Path, capsys) -> None:
    """keep-best handed the start back (the evaluated model is step 0): the row is the weights
    the run started from, said by name."""
    kept = {"model": {"file": "runs/continued/best.pt", "step": 0, "kept_model": True}}
    a = _eval_dir(tmp_path / "a", 120, info=kept)
    b = _eval_dir(tmp_path / "b", 130, info={"model": {"file": "runs/e2mc/best.pt",
                                                       "step": 20, "kept_model": True}})
    flags = [line for line in _compare(tmp_path, a, b, capsys)
             if line.startswith("flag: ") and "starting model" in line]
    assert flags == ["flag: continued is its run's starting model, step 0 (keep-best kept it: "
                     "no step beat the start on its metric): its row is the weights the run "
                     "started from, not trained ones"]
