"""What a verdict rests on (issue 47, items 3-5), each case as the user meets it: evaluations
whose probes trained on other images or labels are not paired; a training split that holds the
test images is refused; a results.json whose number its predictions do not score is refused;
a run another process is still training is not evaluated as its end, and the flags describe
the step evaluated."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from e2mc.cli import main
from helpers import one_column_eval_dir, tiny_base

#: A tiny evaluation (16 px, 40 training images): kNN and one linear probe fraction.
EVAL = ["--protocol", "knn,linear", "--fractions", "0.5", "--seeds", "0,1", "--epochs", "2",
        "--knn-k", "5", "--knn-weighting", "weighted", "--image-size", "16", "--quiet",
        "--no-cache", "--device", "cpu"]


def _evaluate(checkpoint: Path, data: Path, out: Path) -> int:
    return main(["eval", str(checkpoint), "--data", str(data), "--out", str(out), *EVAL])


def _variant(data: Path, dest: Path, **arrays: np.ndarray) -> Path:
    """A copy of the ``.npz`` data set ``data`` with some arrays replaced."""
    with np.load(data) as f:
        np.savez(dest, **{**dict(f), **arrays})
    return dest


def _one_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("e2mc "), err
    return err[0]


def test_a_training_split_holding_the_test_images_is_refused(tmp_path: Path, capsys) -> None:
    base, data = tiny_base(tmp_path)
    with np.load(data) as f:
        x, y, xt, yt = f["x_train"], f["y_train"], f["x_test"], f["y_test"]
    leak = _variant(data, tmp_path / "leak.npz", x_train=np.concatenate([x, xt]),
                    y_train=np.concatenate([y, yt]))
    assert _evaluate(base, leak, tmp_path / "leak-eval") == 2
    assert _one_error(capsys) == (
        f"e2mc eval: error: 20 of the 20 test images of {leak} are also images of the training "
        f"split of {leak} (by content): the probes would be scored on images they were trained "
        "on; give a training split without the test images")
    assert not (tmp_path / "leak-eval" / "results.json").exists()
    # one test image of 200 in the training split (0.5 %, an exact duplicate a public data set
    # may hold): evaluated, said and recorded
    (tmp_path / "dup").mkdir()
    base, data = tiny_base(tmp_path / "dup", n_test=200)
    with np.load(data) as f:
        x, xt = f["x_train"].copy(), f["x_test"]
    x[3] = xt[7]
    dup = _variant(data, tmp_path / "dup.npz", x_train=x)
    assert _evaluate(base, dup, tmp_path / "dup-eval") == 0
    assert (f"warning: 1 of the 200 test images of {dup} are also images of the training split "
            f"of {dup} (by content); each can move a top-1 by one image"
            ) in capsys.readouterr().err
    record = json.loads((tmp_path / "dup-eval" / "results.json").read_text())
    assert record["test_in_train"] == 1


def test_probes_trained_on_other_images_or_labels_are_not_paired(tmp_path: Path,
                                                                  capsys) -> None:
    base, data = tiny_base(tmp_path)
    with np.load(data) as f:
        y = f["y_train"].copy()
    y[:20] = np.random.default_rng(0).permutation(y[:20])  # half the labels shuffled
    assert not np.array_equal(y, np.arange(40) % 4)
    noisy = _variant(data, tmp_path / "noisy.npz", y_train=y)
    for name, d in (("builtin", data), ("again", data), ("noisy", noisy)):
        assert _evaluate(base, d, tmp_path / name) == 0
    capsys.readouterr()
    one = [json.loads((tmp_path / n / "results.json").read_text()) for n in ("builtin", "again")]
    subsets = [[e["subset"]["sha256"] for e in r["entries"] if e["protocol"] == "linear"]
               for r in one]
    assert subsets[0] == subsets[1] and len(set(subsets[0])) == 2  # one per label seed
    def cmp(other: str, *options: str) -> int:
        return main(["compare", str(tmp_path / "builtin"), str(tmp_path / other),
                     "--resamples", "50", *options])

    assert cmp("again", "--out", str(tmp_path / "c0")) == 0
    capsys.readouterr()
    assert cmp("noisy", "--out", str(tmp_path / "c1")) == 2
    error = _one_error(capsys)
    assert error.startswith("e2mc compare: error: cannot pair noisy with builtin, they were "
                            "evaluated differently: the probes' training images or labels (the "
                            "labels differ: content ")
    assert error.endswith("40 images each). Pass --allow-mismatch (allow_mismatch=True) to "
                          "compare them anyway")
    assert not (tmp_path / "c1").exists()
    # told to: compared, and every output says what differs
    assert cmp("noisy", "--out", str(tmp_path / "c1"), "--allow-mismatch") == 0
    said = "Not evaluated alike, compared anyway (--allow-mismatch): noisy against builtin: " \
           "the probes' training images or labels (the labels differ"
    assert said in capsys.readouterr().out
    assert said in (tmp_path / "c1" / "comparison.md").read_text()
    assert "the probes&#x27; training images or labels (the labels differ" in (
        tmp_path / "c1" / "comparison.html").read_text()
    # more training images (the test images left out): other images, refused alike
    with np.load(data) as f:
        x = f["x_train"]
    more = _variant(data, tmp_path / "more.npz", x_train=np.concatenate([x, 255 - x[:4]]),
                    y_train=np.concatenate([np.arange(40) % 4, np.arange(4)]))
    assert _evaluate(base, more, tmp_path / "more") == 0
    capsys.readouterr()
    assert cmp("more", "--out", str(tmp_path / "c2")) == 2
    assert "the probes' training images or labels (40 images builtin, 44 more)" in \
        _one_error(capsys)
    # the same images and labels, another labelled subset at a seed: refused
    record = json.loads((tmp_path / "again" / "results.json").read_text())
    entry = next(e for e in record["entries"] if e["protocol"] == "linear" and e["seed"] == 1)
    entry["subset"]["sha256"] = "0" * 64
    (tmp_path / "again" / "results.json").write_text(json.dumps(record))
    assert cmp("again", "--out", str(tmp_path / "c3")) == 2
    assert "the labelled subset of 'linear 50%' seed 1 (builtin: " in _one_error(capsys)


def test_a_table_number_its_predictions_do_not_score_is_refused(tmp_path: Path,
                                                                capsys) -> None:
    a = one_column_eval_dir(tmp_path / "a", 150)  # 75 % at each seed
    b = one_column_eval_dir(tmp_path / "b", 152)
    record = json.loads((b / "results.json").read_text())
    record["entries"][0]["metrics"]["top1"] += 10  # by hand: 86.00, its predictions 76.00
    (b / "results.json").write_text(json.dumps(record))
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "c"),
                 "--resamples", "50"]) == 2
    assert _one_error(capsys) == (
        f"e2mc compare: error: {b / 'results.json'}: 'linear 10%' seed 0 records top1 86.00, "
        f"but its saved predictions score 76.00: the file was changed after the evaluation "
        f"wrote it; evaluate again into {b}")
    assert not (tmp_path / "c" / "comparison.md").exists()


def test_a_run_still_training_is_not_evaluated_as_its_end(tmp_path: Path, capsys) -> None:
    """The run's lock held by another process, as ``e2mc continue`` holds it while training:
    the run (or its checkpoint.pt) is refused; once the holder ends, it is evaluated."""
    import shutil

    base, data = tiny_base(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(base, run / "checkpoint.pt")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom e2mc.artifacts import writer_lock\n"
         "with writer_lock(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(120)",
         str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        for named in (run, run / "checkpoint.pt"):
            assert _evaluate(named, data, tmp_path / "eval") == 2
            error = _one_error(capsys)
            assert error.startswith(f"e2mc eval: error: {run} is still being trained (pid "
                                    f"{holder.pid} on ")
            assert error.endswith("its checkpoint.pt is a step in the middle of the run, not "
                                  "its end; evaluate it once the run has ended")
        assert not (tmp_path / "eval" / "results.json").exists()
    finally:
        holder.kill()
        holder.wait()
    assert _evaluate(run, data, tmp_path / "eval") == 0


def test_the_flags_describe_the_step_evaluated(tmp_path: Path, capsys) -> None:
    """Step 15 of a run configured for 80 steps (the issue's live run): a mid-run model, not
    a run stopped at training.max_steps=80; a kept model (keep-best's choice) is its run's
    answer and is not flagged."""
    def evaluated(step: int, kept: bool = False) -> dict:
        return {"model": {"file": "run/checkpoint.pt", "step": step, "kept_model": kept},
                "checkpoint_info": {"step": step, "epoch_use": {
                    "images": 40, "batch": 8, "steps": 5, "dropped": 0},
                    "run_config": {"training": {"epochs": 20, "max_steps": 80}}}}

    a = one_column_eval_dir(tmp_path / "a", 150, info=evaluated(80))
    for name, info, said in (("mid", evaluated(15), True), ("kept", evaluated(15, True), False)):
        b = one_column_eval_dir(tmp_path / name, 152, info=info)
        assert main(["compare", str(a), str(b), "--out", str(tmp_path / f"c-{name}"),
                     "--resamples", "50"]) == 0
        flags = [line for line in capsys.readouterr().out.splitlines()
                 if line.startswith("flag: ") and "step" in line and "seeds" not in line]
        assert flags == ([f"flag: {name} was evaluated at step 15 of a run configured for 80 "
                          "steps: a model from the middle of the run, not its end"]
                         if said else [])


def test_shared_items_count_test_images_by_content(tmp_path: Path) -> None:
    """A test image copied into the training folder (another name, another class) is one
    shared item, by its bytes; a subset counts its own items; arrays count by rows."""
    import shutil

    from PIL import Image
    from torch.utils.data import Subset

    from e2mc.data import build_dataset
    from e2mc.data.identity import shared_items

    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for c in ("c0", "c1"):
            (tmp_path / split / c).mkdir(parents=True)
            for i in range(3):
                Image.fromarray(rng.integers(0, 256, (8, 8), dtype=np.uint8)).save(
                    tmp_path / split / c / f"{i}.png")
    shutil.copy(tmp_path / "test" / "c0" / "1.png", tmp_path / "train" / "c1" / "copy.png")
    train, test = (build_dataset(str(tmp_path), split, None) for split in ("train", "test"))
    assert shared_items(train, test) == 1
    copy = next(i for i, (p, _) in enumerate(train.samples) if p.endswith("copy.png"))
    assert shared_items(Subset(train, [i for i in range(7) if i != copy]), test) == 0

    class Arrays:
        def __init__(self, images):
            self.images, self.labels = images, np.zeros(len(images), dtype=np.int64)

        def __len__(self):
            return len(self.images)

    x = rng.integers(0, 256, (5, 4, 4), dtype=np.uint8)
    assert shared_items(Arrays(x), Arrays(np.concatenate([x[2:4], 255 - x[:1]]))) == 2
