"""The selection rule and paired differences of ``benchmarks/search_fashion_mnist.py``."""

from __future__ import annotations

import numpy as np
import pytest

from search_fashion_mnist import TRIALS, paired, selection


def _result(method: str, trial: str, continued: list[float], e2mc: list[float]) -> dict:
    return {"method": method, "trial": trial,
            "none": {"linear 1%": {str(i): v for i, v in enumerate(continued)}},
            "e2mc": {"linear 1%": {str(i): v for i, v in enumerate(e2mc)}}}


def test_paired_difference_is_per_label_seed_in_points() -> None:
    r = _result("vicreg", "a", [50.0, 60.0, 70.0], [52.0, 59.0, 73.0])
    cont, e2mc, delta, se = paired(r, "linear 1%")
    assert cont == pytest.approx(60.0) and e2mc == pytest.approx(61.333333)
    assert delta == pytest.approx((2 - 1 + 3) / 3)
    assert se == pytest.approx(np.std([2, -1, 3], ddof=1) / np.sqrt(3))


def test_selection_takes_the_largest_positive_difference_per_method() -> None:
    results = [_result("vicreg", "a", [0.5], [0.51]), _result("vicreg", "b", [0.5], [0.53]),
               _result("vicreg", "c", [0.6], [0.62]), _result("swav", "a", [0.5], [0.5]),
               _result("swav", "b", [0.5], [0.49])]
    assert selection(results, "linear 1%") == {"vicreg": "b", "swav": None}


def test_every_method_has_a_preset_trial_and_unique_names() -> None:
    for method, trials in TRIALS.items():
        names = [t.name for t in trials]
        assert names[0] == "preset" and len(set(names)) == len(names), method
