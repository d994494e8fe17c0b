"""Progress display (issue 24): a bar on a terminal, whole lines without carriage returns in a
log file, nothing with --quiet."""

from __future__ import annotations

import importlib.util
import io
import re
import threading

import numpy as np
import pytest

from e2mc.progress import PlainProgress, heartbeat, is_terminal, progress_bar


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_stream_gets_plain_lines_at_each_quarter() -> None:
    stream = io.StringIO()
    seen = list(progress_bar(range(8), desc="features", unit="batch", file=stream))
    assert seen == list(range(8))
    text = stream.getvalue()
    assert "\r" not in text and "\x1b" not in text
    lines = text.splitlines()
    assert [line.split(",")[0] for line in lines] == [
        "features: 2/8 batch (25%)", "features: 4/8 batch (50%)",
        "features: 6/8 batch (75%)", "features: 8/8 batch (100%)"]


def test_by_hand_with_postfix_and_a_time_limit() -> None:
    stream = io.StringIO()
    with progress_bar(total=1000, desc="epoch 1/2", unit="step", file=stream, every=0) as bar:
        assert isinstance(bar, PlainProgress)
        bar.set_postfix({"loss": "1.5"}, img_s="20")
        bar.update(1)  # every=0: a line at each update
        bar.set_postfix_str("2 queued")
        bar.update(2)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and "\r" not in stream.getvalue()
    assert lines[0].startswith("epoch 1/2: 1/1000 step (0%)") and lines[0].endswith(
        "loss=1.5, img_s=20")
    assert lines[1].startswith("epoch 1/2: 3/1000 step") and lines[1].endswith("2 queued")


def test_close_reports_where_an_early_stop_left_it_and_time_limits_lines() -> None:
    stream = io.StringIO()
    bar = progress_bar(total=100, initial=10, file=stream)  # every 10 s: no line before 25%
    for _ in range(5):
        bar.update()
    assert stream.getvalue() == ""
    bar.close()
    bar.close()
    assert stream.getvalue().splitlines()[0].startswith("15/100 it (15%)")
    assert len(stream.getvalue().splitlines()) == 1
    unsized = io.StringIO()
    list(progress_bar(iter(range(3)), desc="x", file=unsized))  # no total: one line at the end
    assert unsized.getvalue().splitlines()[0].startswith("x: 3 it, elapsed")


def test_quiet_prints_nothing_and_a_terminal_gets_tqdm() -> None:
    stream = io.StringIO()
    assert list(progress_bar(range(4), file=stream, disable=True)) == [0, 1, 2, 3]
    with progress_bar(total=4, file=stream, disable=True) as bar:
        bar.update(4)
        bar.set_postfix(loss=1)
    assert stream.getvalue() == ""
    terminal = _Terminal()
    assert is_terminal(terminal) and not is_terminal(stream)
    from tqdm.std import tqdm

    bar = progress_bar(total=4, desc="t", file=terminal)
    assert isinstance(bar, tqdm)
    bar.update(4)
    bar.close()
    assert "\r" in terminal.getvalue()  # the bar redraws in place on a terminal
    disabled = progress_bar(total=4, file=terminal, disable=True)
    disabled.update(4)
    disabled.close()
    assert not isinstance(disabled, tqdm)


def test_feature_extraction_logs_lines_or_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.data import TensorDataset

    from e2mc.evaluation.features import extract_features

    data = TensorDataset(torch.randn(16, 3), torch.arange(16))
    backbone = torch.nn.Linear(3, 2)
    feats, labels = extract_features(backbone, data, batch_size=4, num_workers=0)
    err = capsys.readouterr().err  # pytest's captured stderr is no terminal
    assert "\r" not in err and err.count("\n") == 4 and "features: 4/4 it (100%)" in err
    assert feats.shape == (16, 2) and np.array_equal(labels, np.arange(16))
    extract_features(backbone, data, batch_size=4, num_workers=0, progress=False)
    assert capsys.readouterr().err == ""


def test_a_phase_with_nothing_to_count_prints_a_line_while_it_lasts() -> None:
    """``heartbeat`` prints ``DESC, elapsed Ts`` while its block runs and stops after it: the
    block here waits until two lines came (a hang guard of 60 s, not a clock assertion)."""
    two_lines = threading.Event()

    class Stream(io.StringIO):
        def write(self, text: str) -> int:
            written = super().write(text)
            if self.getvalue().count("\n") >= 2:
                two_lines.set()
            return written

    stream = Stream()
    with heartbeat("loading PyTorch", every=0.01, file=stream):
        assert two_lines.wait(60), "no heartbeat line within 60 s"
    after = stream.getvalue()
    lines = after.splitlines()
    assert len(lines) >= 2 and all(re.fullmatch(r"loading PyTorch, elapsed \d+s", x) for x in lines)
    threading.Event().wait(0.05)
    assert stream.getvalue() == after, "the heartbeat went on after its block"
    quiet = io.StringIO()
    with heartbeat("short", every=60, file=quiet):
        pass
    assert quiet.getvalue() == ""


@pytest.mark.parametrize("argv", [["demo"], ["eval", "x", "--data", "d", "--out", "y"],
                                  ["analyze", "x", "--data", "d", "--out", "y"],
                                  ["compare", "x"], ["continue", "--config", "x", "--out", "y"],
                                  ["pretrain", "--config", "x", "--out", "y"]])
def test_commands_that_load_pytorch_load_it_under_a_heartbeat(argv: list[str]) -> None:
    """Each command that waits on PyTorch names its heavy modules, which ``e2mc.cli`` imports
    under :func:`heartbeat` before the command runs (no start-up silent for minutes)."""
    from e2mc.cli import build_parser

    modules = build_parser().parse_args(argv).libraries
    assert modules and all(importlib.util.find_spec(m) is not None for m in modules)
