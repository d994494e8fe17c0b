"""The run's estimate of its remaining training time (e2mc.training.estimate): after the
warm-up steps, from the measured rate, once per invocation, printed and logged."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest

from e2mc.training import estimate
from e2mc.training.estimate import RunEstimate, duration


class _Trainer:
    def __init__(self, total_steps: int) -> None:
        self.total_steps = total_steps
        self.cfg = SimpleNamespace(training=SimpleNamespace(batch_size=256))
        self.runtime = SimpleNamespace(is_main=True)
        self.logged: list[tuple[int, dict]] = []

    def log(self, step: int, metrics: dict) -> None:
        self.logged.append((step, metrics))


def test_the_estimate_is_the_steps_left_at_the_measured_rate(monkeypatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(estimate.time, "perf_counter", lambda: clock[0])
    out = io.StringIO()
    trainer = _Trainer(total_steps=1000)
    cb = RunEstimate(warmup=5, min_steps=10, min_seconds=5.0, stream=out)
    cb.on_fit_start(trainer, 0)
    for step in range(1, 101):
        clock[0] += 9.0 if step <= 5 else 0.5  # slow warm-up steps, then 0.5 s per step
        cb.on_step_end(trainer, step, 0, {})
    # measured from step 5's end over steps 6..15 (10 steps, 5 s), 985 steps left
    assert trainer.logged == [(15, {"time/seconds_per_step": pytest.approx(0.5),
                                    "time/estimated_remaining_s": pytest.approx(492.5)})]
    assert out.getvalue() == ("estimate: 0.5 s per step (512 images/s over steps 6-15); 985 "
                              "step(s) left: about 8.2 min more of training (validation "
                              "evaluations and checkpoints come on top)\n")


def test_a_resumed_invocation_estimates_again_from_its_own_steps(monkeypatch) -> None:
    clock = [0.0]
    monkeypatch.setattr(estimate.time, "perf_counter", lambda: clock[0])
    trainer = _Trainer(total_steps=100)
    cb = RunEstimate(warmup=2, min_steps=3, min_seconds=0.0, stream=io.StringIO())
    cb.on_fit_start(trainer, 40)  # resumed at step 40
    for step in range(41, 50):
        clock[0] += 2.0
        cb.on_step_end(trainer, step, 0, {})
    assert [s for s, _ in trainer.logged] == [45]  # steps 43..45 after 41, 42 of warm-up
    assert trainer.logged[0][1]["time/estimated_remaining_s"] == pytest.approx(55 * 2.0)


@pytest.mark.parametrize("seconds,text", [(45, "45 s"), (750, "12.5 min"), (11520, "3.2 h")])
def test_durations_in_words(seconds: float, text: str) -> None:
    assert duration(seconds) == text
