"""One error path for every subcommand (docs/cli.md): bad input gives one ``error:`` line on
stderr and exit 2, a failure while running exit 1 with its cause, a non-finite training exit 3;
no traceback unless ``--debug``. Every subcommand is walked with a missing path, a corrupt file
and an out-of-range value; then the single defects of issue 15, each with its own test."""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest
import torch

from e2mc.artifacts import EvalDir, RunDir
from e2mc.artifacts.layout import read_jsonl
from e2mc.cli import build_parser, main
from e2mc.demo import BASE_CHECKPOINT
from e2mc.errors import EXIT_FAILURE, EXIT_INPUT, EXIT_NONFINITE, describe
from helpers import recorded_data


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bad-input")
    corrupt = root / "corrupt.pt"  # a real checkpoint cut in the middle
    corrupt.write_bytes(BASE_CHECKPOINT.read_bytes()[: BASE_CHECKPOINT.stat().st_size // 3])
    (root / "bad.yaml").write_text("training: [unclosed\n")
    for name, text in (("x", "{not json"), ("y", '{"entries": [{"column": 1}]}')):
        (root / "evals" / name).mkdir(parents=True)
        (root / "evals" / name / "results.json").write_text(text)
    (root / "a-file").write_text("not a directory\n")
    return {"root": root, "missing": root / "missing.pt", "corrupt": corrupt,
            "yaml": root / "bad.yaml", "ex": root / "evals" / "x", "ey": root / "evals" / "y",
            "file": root / "a-file"}


def _cases(f: dict[str, Path]) -> dict[str, list[tuple[list[str], str]]]:
    """Per subcommand: (arguments, a text the error line must contain) for a missing path, a
    corrupt file and an out-of-range value."""
    r, base, m, c = f["root"], str(BASE_CHECKPOINT), str(f["missing"]), str(f["corrupt"])
    run = ["--data", "builtin", "--out", str(r / "run")]
    cont = ["continue", "--config", "fmnist-vicreg-continued", *run]
    search = ["search", "--config", "fmnist-vicreg-e2mc", "--data", "builtin"]
    return {
        "continue": [([*cont, "--from", m], "missing.pt"), ([*cont, "--from", c], "corrupt.pt"),
                     ([*cont, "--from", base, "--set", "training.cpu_threads=0"],
                      "training.cpu_threads")],
        "pretrain": [(["pretrain", "--config", str(r / "none.yaml"), *run], "none.yaml"),
                     (["pretrain", "--config", str(f["yaml"]), *run], "not valid YAML"),
                     (["pretrain", "--config", "fmnist-vicreg-pretrain", *run, "--set",
                       "optim.base_lr=nan"], "optim.base_lr")],
        "eval": [(["eval", m, "--data", "builtin", "--out", str(r / "e")], "missing.pt"),
                 (["eval", c, "--data", "builtin", "--out", str(r / "e")], "corrupt.pt"),
                 (["eval", base, "--data", "builtin", "--out", str(r / "e"), "--svm-costs",
                   "-1"], "--svm-costs")],
        "compare": [(["compare", str(r / "no1"), str(r / "no2")], "no1"),
                    (["compare", str(f["ex"]), str(f["ey"])], "results.json"),
                    (["compare", str(f["ex"]), str(f["ey"]), "--resamples", "0"],
                     "--resamples")],
        "analyze": [(["analyze", m, "--data", "builtin", "--out", str(r / "a")], "missing.pt"),
                    (["analyze", c, "--data", "builtin", "--out", str(r / "a")], "corrupt.pt"),
                    (["analyze", base, "--data", "builtin", "--out", str(r / "a"),
                      "--image-size", "0"], "--image-size")],
        "convert": [(["convert", m, str(r / "c.pt")], "missing.pt"),
                    (["convert", c, str(r / "c.pt")], "corrupt.pt"),
                    (["convert", base, str(r / "c.pt"), "--method", "bogus"], "--method")],
        "export-backbone": [(["export-backbone", m, str(r / "b.pt")], "missing.pt"),
                            (["export-backbone", c, str(r / "b.pt")], "corrupt.pt"),
                            (["export-backbone", base, str(r)], "is a directory")],
        "demo": [(["demo", "--from", m, "--out", str(r / "d")], "missing.pt"),
                 (["demo", "--from", c, "--out", str(r / "d")], "corrupt.pt"),
                 (["demo", "--epochs", "0", "--out", str(r / "d")], "--epochs")],
        "presets": [(["presets", "--markdown", "extra"], "unrecognized arguments")],
        "config": [(["config", "show", str(r / "none.yaml")], "none.yaml"),
                   (["config", "show", str(f["yaml"])], "not valid YAML"),
                   (["config", "show", "fmnist-vicreg-continued", "--set", "training.seed=-1"],
                    "training.seed")],
        "search": [([*search, "--out", str(r / "s1"), "--from", m, "--grid",
                     "optim.base_lr=0.1"], "missing.pt"),
                   ([*search, "--out", str(r / "s2"), "--from", c, "--grid",
                     "optim.base_lr=0.1"], "corrupt.pt"),
                   ([*search, "--out", str(r / "s3"), "--from", base, "--grid",
                     "optim.base_lr=nan"], "optim.base_lr")],
    }


def _subcommands() -> set[str]:
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return set(action.choices)


def test_every_subcommand_is_walked(files: dict[str, Path]) -> None:
    """A new subcommand must get its cases here."""
    assert _subcommands() == set(_cases(files)), "add the new subcommand to _cases"


@pytest.mark.parametrize("command", sorted(_subcommands()))
def test_bad_input_is_one_error_line_and_exit_2(
        command: str, files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    for argv, expected in _cases(files)[command]:
        rc = _main(argv)
        err = capsys.readouterr().err
        assert rc == EXIT_INPUT, (argv, err)
        lines = [line for line in err.splitlines() if "error:" in line]
        assert len(lines) == 1 and expected in lines[0], (argv, err)
        assert "Traceback" not in err, (argv, err)


def _main(argv: list[str]) -> int:
    """``main``'s exit code, argparse's own exit (2 for a bad option value) included."""
    try:
        return main(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)


def test_debug_shows_the_traceback(files: dict[str, Path]) -> None:
    argv = ["export-backbone", str(files["missing"]), str(files["root"] / "o.pt")]
    with pytest.raises(FileNotFoundError):
        main([*argv, "--debug"])  # --debug anywhere on the command line
    with pytest.raises(FileNotFoundError):
        main(["--debug", *argv])
    os.environ["E2MC_DEBUG"] = "1"
    try:
        with pytest.raises(FileNotFoundError):
            main(argv)
    finally:
        del os.environ["E2MC_DEBUG"]


def test_describe_maps_errors_to_exit_codes() -> None:
    from e2mc.training.nonfinite import NonFiniteLossError

    assert describe(ValueError("x"))[0] == EXIT_INPUT
    assert describe(FileNotFoundError(errno.ENOENT, "No such file", "a.pt")) == (
        EXIT_INPUT, "a.pt: no such file")
    code, message = describe(OSError(errno.ENOSPC, "No space left on device", "c.pt"))
    assert code == EXIT_FAILURE and "no space left" in message and "c.pt" in message
    assert describe(NonFiniteLossError("loss is not finite"))[0] == EXIT_NONFINITE
    assert describe(RuntimeError("boom")) == (
        EXIT_FAILURE, "RuntimeError: boom (--debug shows the traceback)")
    worker = ("Caught CorruptImageError in DataLoader worker process 0.\nOriginal Traceback "
              "(most recent call last):\n  File \"x.py\", line 1\n"
              "e2mc.data.image_folder.CorruptImageError: cannot read image file a.jpg: bad\n")
    from e2mc.errors import CorruptImageError

    assert describe(CorruptImageError(worker)) == (EXIT_INPUT,
                                                   "cannot read image file a.jpg: bad")


# ----------------------------------------------------------------------------- checkpoints
@pytest.mark.parametrize("content, says", [(b"", "empty"), (b"hello\n", "holds text"),
                                           (b'{"model": 1}', "holds JSON")])
def test_unreadable_checkpoint_files_are_named(tmp_path: Path, content: bytes, says: str) -> None:
    from e2mc.checkpoints.io import torch_load
    from e2mc.errors import CorruptFileError

    path = tmp_path / "x.pt"
    path.write_bytes(content)
    with pytest.raises(CorruptFileError, match=says) as info:
        torch_load(path)
    assert "trust" not in str(info.value)  # not the untrusted-pickle advice


def test_atomic_writes_follow_the_umask(tmp_path: Path) -> None:
    from e2mc.files import atomic_write

    for umask, mode in ((0o022, 0o644), (0o027, 0o640)):
        old = os.umask(umask)
        try:
            target = tmp_path / f"f{umask:o}"
            atomic_write(target, lambda f: f.write(b"x"))
        finally:
            os.umask(old)
        assert stat.S_IMODE(target.stat().st_mode) == mode


# ----------------------------------------------------------------------------- training runs
TINY = ["--config", "fmnist-vicreg-continued", "--from", str(BASE_CHECKPOINT), "--data",
        "builtin", "--set", "data.limit=32", "--set", "training.batch_size=16", "--set",
        "training.progress=false", "--set", "training.log_every=1", "--set",
        "data.num_workers=0", "--set", "training.cpu_threads=1", "--set", "training.device=cpu"]


def test_resume_with_another_config_is_refused_or_recorded(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    assert main(["continue", *TINY, "--out", str(run), "--set", "training.max_steps=1"]) == 0
    config_before = RunDir(run).config.read_text()
    changed = ["continue", *TINY, "--out", str(run), "--set", "training.max_steps=2",
               "--set", "addon.name=e2mc", "--set", "optim.base_lr=0.5"]
    capsys.readouterr()
    assert main(changed) == EXIT_INPUT
    err = capsys.readouterr().err
    assert "addon.name: 'none' -> 'e2mc'" in err and "optim.base_lr: 0.003 -> 0.5" in err
    assert "--override-config" in err and "max_steps" not in err  # a free key
    assert RunDir(run).config.read_text() == config_before  # config.yaml kept
    assert main([*changed, "--override-config"]) == 0
    changes = read_jsonl(RunDir(run).config_changes)
    assert len(changes) == 1 and changes[0]["step"] == 2
    assert changes[0]["changes"]["addon.name"] == {"old": "none", "new": "e2mc"}
    ckpt = torch.load(RunDir(run).checkpoint, weights_only=True)
    assert ckpt["step"] == 2 and ckpt["run_config"]["addon"]["name"] == "e2mc"
    assert ckpt["optimizer"]["param_groups"][0]["lr"] == pytest.approx(0.5 * 16 / 256)
    assert "addon/entropy" in RunDir(run).read_metrics()[-1]  # step 2 trained with E2MC
    assert main(["continue", *TINY, "--out", str(run), "--set", "training.max_steps=2",
                 "--set", "training.batch_size=8", "--override-config"]) == EXIT_INPUT
    assert "cannot change within a run" in capsys.readouterr().err


@pytest.mark.parametrize("lr", ["1e20", "1e30"])
def test_learning_rate_blow_up_stops_with_the_nonfinite_code(
        tmp_path: Path, lr: str, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    rc = main(["continue", *TINY, "--out", str(run), "--set", f"optim.base_lr={lr}",
               "--set", "training.max_steps=2"])
    err = capsys.readouterr().err
    assert rc == EXIT_NONFINITE, err
    line = next(line for line in err.splitlines() if "error:" in line)
    assert "at step 1" in line and "No checkpoint was written yet" in line
    assert "exploded" in line or "not finite" in line
    assert not RunDir(run).checkpoint.exists()  # nothing exploded is kept


def test_skip_nonfinite_undoes_an_exploding_update(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert main(["continue", *TINY, "--out", str(run), "--set", "optim.base_lr=1e20",
                 "--set", "training.max_steps=2", "--skip-nonfinite"]) == 0
    ckpt = torch.load(RunDir(run).checkpoint, weights_only=True)
    start = torch.load(BASE_CHECKPOINT, weights_only=True)["model"]
    assert ckpt["skipped_steps"] == 2
    for key, value in start.items():  # weights and buffers as they were before the steps
        assert torch.equal(ckpt["model"][key], value), key


def test_nan_learning_rate_is_refused_naming_the_key(capsys: pytest.CaptureFixture[str],
                                                     tmp_path: Path) -> None:
    from e2mc.config import load_config

    for override, key in (("optim.base_lr=nan", "optim.base_lr"),
                          ("optim.base_lr=1e300", "optim.base_lr"),  # float32 overflow
                          ("training.cpu_threads=0", "training.cpu_threads"),
                          ("training.device=bogus", "training.device"),
                          ("training.seed=-1", "training.seed"),
                          ("training.max_steps=0", "training.max_steps"),
                          ("optim.warmup_epochs=-3", "optim.warmup_epochs")):
        with pytest.raises(ValueError, match=key.replace(".", r"\.")):
            load_config("fmnist-vicreg-continued", [override])


def test_disk_full_during_a_checkpoint_write_keeps_the_previous_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import e2mc.checkpoints.io as ckio

    run = tmp_path / "run"
    args = ["continue", *TINY, "--out", str(run), "--set", "training.checkpoint_every_steps=1",
            "--set", "training.keep_epoch_checkpoints=false"]
    assert main([*args, "--set", "training.max_steps=1"]) == 0
    before = RunDir(run).checkpoint.read_bytes()
    real_save = torch.save

    def full_disk(obj, f, *a, **kw):
        real_save(obj, f, *a, **kw)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ckio.torch, "save", full_disk)
    capsys.readouterr()
    assert main([*args, "--set", "training.max_steps=2"]) == EXIT_FAILURE
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and "no space left" in lines[0] and "checkpoint.pt" in lines[0]
    assert "Traceback" not in err
    assert RunDir(run).checkpoint.read_bytes() == before and not RunDir(run).stale_temp_files()


def test_a_directory_as_the_starting_checkpoint(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["continue", *TINY, "--from", str(tmp_path), "--out",
                 str(tmp_path / "r")]) == EXIT_INPUT
    assert "is a directory" in capsys.readouterr().err


# ----------------------------------------------------------------------------- eval / analyze
@pytest.fixture(scope="module")
def tiny_npz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("npz") / "tiny.npz"
    np.savez(path, x_train=rng.integers(0, 256, (20, 28, 28), dtype=np.uint8),
             y_train=np.arange(20) % 2, x_test=rng.integers(0, 256, (10, 28, 28), dtype=np.uint8),
             y_test=np.arange(10) % 2)
    return path


EVAL_QUICK = ["--protocol", "knn", "--knn-k", "3", "--seeds", "0", "--fractions", "1",
              "--image-size", "28", "--no-cache", "--quiet", "--num-workers", "0",
              "--device", "cpu"]


def test_eval_reads_the_channels_from_the_model(
        tmp_path: Path, tiny_npz: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "e"
    assert main(["eval", str(BASE_CHECKPOINT), "--data", str(tiny_npz), "--out", str(out),
                 *EVAL_QUICK, "--arch", "resnet18"]) == 0  # a 1-channel model
    err = capsys.readouterr().err
    assert "--arch resnet18 is ignored" in err and "cnn5_small" in err
    assert EvalDir(out).load().values("knn k=3")
    assert main(["eval", str(BASE_CHECKPOINT), "--data", str(tiny_npz), "--out", str(out),
                 *EVAL_QUICK, "--in-channels", "3"]) == EXIT_INPUT
    assert "takes 1 channel" in capsys.readouterr().err


@pytest.fixture(scope="module")
def folder_with_a_corrupt_jpeg(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from PIL import Image

    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for split, n in (("train", 12), ("test", 6)):
        for i in range(n):
            folder = root / split / f"c{i % 2}"
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 256, (28, 28), dtype=np.uint8)).save(
                folder / f"{i}.jpg")
    good = (root / "train" / "c0" / "0.jpg").read_bytes()
    (root / "train" / "c1" / "broken.jpg").write_bytes(good[: len(good) // 2])
    return root


@pytest.mark.slow  # integration: a few seconds on 2 cores
def test_corrupt_jpeg_in_eval_and_analyze(
        tmp_path: Path, folder_with_a_corrupt_jpeg: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    data = str(folder_with_a_corrupt_jpeg)
    base = ["eval", str(BASE_CHECKPOINT), "--data", data, "--out", str(tmp_path / "e"),
            *EVAL_QUICK]
    for workers in ("0", "2"):  # in the main process and in loader workers: one line
        assert main([*base, "--num-workers", workers]) == EXIT_INPUT
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.strip()]
        assert lines[-1].startswith("e2mc eval: error: cannot read image file")
        assert "broken.jpg" in lines[-1] and "Traceback" not in err
    with pytest.warns(UserWarning, match="skipped 1 corrupt"):
        assert main([*base, "--skip-corrupt"]) == 0
    assert main(["analyze", str(BASE_CHECKPOINT), "--data", data, "--split", "train",
                 "--out", str(tmp_path / "a"), "--image-size", "28", "--quiet",
                 "--knn-k", "3", "--device", "cpu"]) == EXIT_INPUT
    err = capsys.readouterr().err
    assert "broken.jpg" in err and "Traceback" not in err


def test_eval_numbers_out_of_range(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for option, value, says in (("--seeds", "0,0", "given twice"),
                                ("--image-size", "0", "must be >= 1"),
                                ("--svm-costs", "-1", "must be > 0"),
                                ("--fractions", "0,1.5", "must be in (0, 1]"),
                                ("--knn-k", "0", "must be >= 1"),
                                ("--lr", "0.1,0.2", "expected one number"),
                                ("--subset-file", "0.1,0.2=list.txt", "expected one number")):
        with pytest.raises(SystemExit) as exit_info:
            main(["eval", str(BASE_CHECKPOINT), "--data", "builtin", "--out", str(tmp_path),
                  option, value])
        assert exit_info.value.code == 2
        assert says in capsys.readouterr().err


def test_demo_out_naming_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "file"
    target.write_text("x")
    assert main(["demo", "--out", str(target), "--quick"]) == EXIT_INPUT
    assert "existing file" in capsys.readouterr().err


# ----------------------------------------------------------------------------- compare
def _eval_dir(root: Path, top1: float) -> Path:
    from e2mc.evaluation.results import save_predictions

    labels = np.arange(20) % 2
    preds = labels.copy()
    preds[: int(20 - top1 / 5)] = 1 - preds[: int(20 - top1 / 5)]
    rel = save_predictions(root, "linear_10_seed0", preds, labels)
    EvalDir(root).write({"entries": [{"protocol": "linear", "column": "linear 10%",
                                      "primary": "top1", "metrics": {"top1": top1},
                                      "fraction": 0.1, "seed": 0, "predictions": rel}],
                         **recorded_data(labels)})
    return root


def test_compare_with_same_named_folders_or_repeated_names(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = _eval_dir(tmp_path / "x1" / "eval", 60.0)
    b = _eval_dir(tmp_path / "x2" / "eval", 80.0)
    out = tmp_path / "cmp"
    assert main(["compare", str(a), str(b), "--out", str(out), "--resamples", "50"]) == 0
    table = (out / "comparison.csv").read_text()
    rows = {line.split(",")[0]: line for line in table.splitlines()[1:]}
    assert len(rows) == 2 and any("60" in r for r in rows.values()) \
        and any("80" in r for r in rows.values())
    capsys.readouterr()
    assert main(["compare", str(a), str(b), "--names", "a,a", "--out", str(out)]) == EXIT_INPUT
    assert "error:" in capsys.readouterr().err


def test_malformed_results_are_named(files: dict[str, Path],
                                     capsys: pytest.CaptureFixture[str]) -> None:
    bad = files["root"] / "evals" / "z"
    bad.mkdir()
    (bad / "results.json").write_text(json.dumps({"entries": [{"protocol": "knn"}]}))
    assert main(["compare", str(files["ey"]), str(bad)]) == EXIT_INPUT
    err = capsys.readouterr().err
    assert "results.json" in err and "Traceback" not in err


def test_a_nonfinite_gradient_stops_or_is_skipped(tmp_path: Path) -> None:
    """A finite loss whose gradient is NaN (d sqrt(x)/dx at 0): the run stops naming the
    parameter, or with skip_nonfinite the step is skipped and the weights stay as they were."""
    from torch import nn

    from e2mc.addons import build_addon
    from e2mc.config import RunConfig
    from e2mc.distributed import Runtime
    from e2mc.methods.base import MethodOutput, SSLMethod
    from e2mc.training.nonfinite import NonFiniteLossError
    from e2mc.training.trainer import Trainer

    class NaNGrad(SSLMethod):
        name = "nan-grad"

        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.backbone = nn.Linear(4, 3)
            self.feature_dim, self.hparams, self.calls = 3, {}, 0

        def forward(self, views):
            z = [self.backbone(v) for v in views]
            self.calls += 1
            loss = (z[0] - z[1]).pow(2).mean()
            if self.calls == 2:
                loss = loss + 0 * torch.sqrt(z[0].sum() * 0)  # value finite, gradient NaN
            return MethodOutput(loss=loss, terms={}, embeddings=z)

        def build_optimizer(self, lr, weight_decay, **kw):
            return torch.optim.SGD(self.parameters(), lr=lr)

    class Data(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 8

        def __getitem__(self, i):
            x = torch.full((4,), float(i))
            return [x, x + 1], 0

    def trainer(run_dir: Path, skip: bool) -> tuple[Trainer, NaNGrad]:
        cfg = RunConfig()
        cfg.training.batch_size, cfg.training.epochs, cfg.training.progress = 4, 1, False
        cfg.training.skip_nonfinite = skip
        cfg.optim.base_lr, cfg.optim.lr_scaling = 0.01, "none"
        method = NaNGrad()
        return Trainer(method, build_addon("none"), Data(), cfg, run_dir,
                       runtime=Runtime(torch.device("cpu"))), method

    t, _ = trainer(tmp_path / "stop", skip=False)
    with pytest.raises(NonFiniteLossError, match=r"the gradient of backbone\.\w+ is not finite "
                                                 r"at step 2.*No checkpoint was written yet"):
        t.fit()
    t, method = trainer(tmp_path / "skip", skip=True)
    t.fit()
    ckpt = torch.load(RunDir(tmp_path / "skip").checkpoint, weights_only=True)
    assert ckpt["skipped_steps"] == 1
    reference, ref_method = trainer(tmp_path / "one", skip=True)
    reference.cfg.training.max_steps = 1
    reference.fit()
    after_one = {k: v.clone() for k, v in ref_method.state_dict().items()}
    for key, value in after_one.items():  # step 2 skipped: the weights of step 1
        assert torch.equal(ckpt["model"][key], value), key


def test_a_torchvision_built_for_another_torch_is_one_line_naming_both(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A mismatched pair fails at the first torchvision operator with this RuntimeError
    (simulated: torchvision's import in the demo raises it): the demo ends in one line naming
    both versions, not a traceback."""
    from importlib.metadata import version

    import e2mc.demo

    def mismatched(*args, **kwargs):
        raise RuntimeError("operator torchvision::nms does not exist")

    monkeypatch.setattr(e2mc.demo, "run_demo", mismatched)
    assert main(["demo", "--quick"]) == EXIT_FAILURE
    err = capsys.readouterr().err
    assert err == (f"e2mc demo: error: torchvision {version('torchvision')} was not built for "
                   f"torch {version('torch')} (operator torchvision::nms does not exist): "
                   "install the torchvision release made for this torch "
                   "(pytorch.org/get-started/previous-versions lists the pairs)\n")
