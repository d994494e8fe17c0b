"""Figures are written at the requested pixel size with the requested content; the report
embeds and names every figure and its JSON holds the numbers."""

from __future__ import annotations

import base64
import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from e2mc.artifacts import read_jsonl
from e2mc.diagnostics.embedding_stats import embedding_statistics, nearest_neighbor_distances
from e2mc.diagnostics.figures import (
    choose_pair,
    loss_terms,
    plot_accuracy_curves,
    plot_loss_terms,
    plot_marginal_pair,
    plot_nn_histograms,
    position_colors,
)
from e2mc.diagnostics.report import STAT_ROWS, RunDiagnostics, write_report


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from the PNG header (IHDR chunk)."""
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def _metrics(path: Path) -> Path:
    lines = [json.dumps({"step": s, "epoch": s // 5, "loss": 5.0 - 0.1 * s,
                         "e2mc/entropy": -0.3 + 0.01 * s, "lr": 0.001, "done": False})
             for s in range(20)]
    path.write_text("\n".join(lines) + "\n\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def compact() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return torch.sigmoid(torch.randn(300, 6)), torch.rand(300, 6)


def test_marginal_pair_size_and_dims(tmp_path, compact):
    before, after = compact
    path = plot_marginal_pair(before, {"e2mc": after, "continued": before}, tmp_path / "m.png",
                              figsize=(9.0, 3.0), dpi=50)
    assert png_size(path) == (450, 150)
    assert path.stat().st_size > 2000
    # The default size scales with the number of panels.
    assert png_size(plot_marginal_pair(before, {"a": after}, tmp_path / "m2.png")) == (800, 420)
    with pytest.raises(ValueError, match="same images"):
        plot_marginal_pair(before, {"a": after[:10]}, tmp_path / "bad.png")
    with pytest.raises(ValueError, match="distinct"):
        plot_marginal_pair(before, {"a": after}, tmp_path / "bad.png", dims=(2, 2))


def test_pair_is_seeded_and_colours_follow_position():
    assert choose_pair(10, seed=3) == choose_pair(10, seed=3)
    assert len({choose_pair(10, seed=s) for s in range(10)}) > 1
    i, j = choose_pair(2, seed=0)
    assert {i, j} == {0, 1}
    colors = position_colors(np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
    assert colors.min() >= 0 and colors.max() <= 1
    assert colors[1, 0] > colors[0, 0] and colors[2, 2] > colors[0, 2]  # red ~ x, blue ~ y
    assert len({tuple(c) for c in colors}) == 4


def test_nn_histograms_size(tmp_path, compact):
    before, after = compact
    dist = {"before": nearest_neighbor_distances(before, 20),
            "after": nearest_neighbor_distances(after, 20)}
    path = plot_nn_histograms(dist, tmp_path / "nn.png", k=20, dpi=80)
    assert png_size(path) == (640, 272)  # default (4 * runs, 3.4) inches
    assert path.stat().st_size > 2000


def test_accuracy_curves_size_and_validation(tmp_path):
    runs = [("e2mc", [0, 1, 2], [60.0, 61.5, 62.0]), ("continued", [0, 1, 2], [60.0, 60.1, 60.0])]
    path = plot_accuracy_curves(runs, tmp_path / "acc.png", figsize=(5.0, 3.0), dpi=60)
    assert png_size(path) == (300, 180)
    with pytest.raises(ValueError, match="2 accuracies"):
        plot_accuracy_curves([("x", [0, 1, 2], [1.0, 2.0])], tmp_path / "bad.png")


def test_metrics_parsing_and_loss_terms_figure(tmp_path):
    metrics = _metrics(tmp_path / "metrics.jsonl")
    records = read_jsonl(metrics)
    assert len(records) == 20
    terms = loss_terms(records)
    assert list(terms) == ["loss", "e2mc/entropy", "lr"]  # not step/epoch, not booleans
    steps, values = terms["loss"]
    assert steps == [float(s) for s in range(20)]
    assert values[3] == pytest.approx(4.7)
    path = plot_loss_terms(metrics, tmp_path / "loss.png", dpi=50)
    assert png_size(path) == (540, 130)  # 3 panels in one row: (3.6 * 3, 2.6) inches
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"step": 0, "loss": 1}\n{not json\n', encoding="utf-8")
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        read_jsonl(bad)
    with pytest.raises(ValueError, match="no numeric loss terms"):
        plot_loss_terms([{"step": 0}, {"step": 1}], tmp_path / "none.png")


def test_report_embeds_and_names_every_figure(tmp_path, compact):
    before, after = compact
    out = tmp_path / "report"
    figs = [
        ("2-D marginals", plot_marginal_pair(before, {"after": after}, out / "marginals.png")),
        ("accuracy", plot_accuracy_curves([("a", [0, 1], [1.0, 2.0])], out / "accuracy.png")),
    ]
    loss = plot_loss_terms(_metrics(tmp_path / "metrics.jsonl"), out / "after_loss.png")
    runs = [
        RunDiagnostics("before", "base.pt",
                       {"projector embeddings": embedding_statistics(before, "unit", k=10)}),
        RunDiagnostics("after", "run/checkpoint.pt",
                       {"projector embeddings": embedding_statistics(after, "unit", k=10)},
                       info={"epoch": 3}, figures=[("loss terms", loss)]),
    ]
    json_path, html_path = write_report(out, runs, figs, title="t")
    page = html_path.read_text(encoding="utf-8")
    for _, png in [*figs, ("loss", loss)]:
        assert base64.b64encode(png.read_bytes()).decode() in page  # self-contained
        assert png.name in page
    for label, _ in STAT_ROWS.values():
        assert label.replace("<", "&lt;") in page
    assert page.count("<table>") == 1 and "run/checkpoint.pt" in page
    data = json.loads(json_path.read_text(encoding="utf-8"))
    assert data["figures"] == {"2-D marginals": "marginals.png", "accuracy": "accuracy.png"}
    assert [r["name"] for r in data["runs"]] == ["before", "after"]
    got = data["runs"][1]["statistics"]["projector embeddings"]["effective_rank"]
    assert got == pytest.approx(runs[1].statistics["projector embeddings"].effective_rank)
    assert data["runs"][1]["figures"] == {"loss terms": "after_loss.png"}
    with pytest.raises(ValueError, match="does not exist"):
        write_report(out, runs, [("missing", out / "nope.png")])


def test_few_points_get_markers_and_one_point_an_axis_around_it():
    """A short run's one logged step is a visible point on an axis step-1 .. step+1 with integer
    ticks (not an empty panel with ticks 3.8 .. 4.2); a long series is a plain line."""
    import matplotlib.pyplot as plt

    from e2mc.diagnostics.figures import FEW_POINTS, draw_series

    fig, (one, few, many) = plt.subplots(1, 3)
    draw_series(one, [4.0], [19.7])
    draw_series(few, [0, 3, 4], [1.0, 2.0, 3.0])
    draw_series(many, list(range(FEW_POINTS + 1)), [0.0] * (FEW_POINTS + 1))
    assert one.lines[0].get_marker() == "o" and one.get_xlim() == (3.0, 5.0)
    assert list(one.get_xticks()) == [3.0, 4.0, 5.0]
    assert few.lines[0].get_marker() == "o"
    assert all(float(t).is_integer() for t in few.get_xticks())
    assert many.lines[0].get_marker() == "None"
    plt.close(fig)


def test_loss_panels_say_what_they_show_and_keys_select_them(tmp_path, monkeypatch):
    from e2mc.diagnostics import figures

    shown = {}
    monkeypatch.setattr(figures, "_save", lambda fig, path, dpi: shown.setdefault(
        "titles", [ax.get_title() for ax in fig.axes if ax.get_visible()]) and Path(path))
    records = [{"step": 4, "loss": 19.7, "lr": 0.003, "val/knn": 62.5, "val/linear_1%": 40.9}]
    figures.plot_loss_terms(records, tmp_path / "m.png", keys=["val/knn", "val/linear_1%"])
    assert shown["titles"] == ["val/knn: kNN top-1 (%)",
                               "val/linear_1%: linear probe top-1 (%), 1% labels"]
    assert figures.term_title("base/invariance") == "base/invariance"


def test_accuracy_of_one_epoch_per_run_is_bars_with_their_values(tmp_path, monkeypatch):
    from e2mc.diagnostics import figures

    seen = {}

    def keep(fig, path, dpi):
        ax = fig.axes[0]
        seen["bars"] = [p.get_height() for p in ax.patches]
        seen["labels"] = [t.get_text() for t in ax.texts]
        return Path(path)

    monkeypatch.setattr(figures, "_save", keep)
    figures.plot_accuracy_curves([("continued", [1], [75.39]), ("e2mc", [1], [75.0])],
                                 tmp_path / "a.png")
    assert seen["bars"] == [75.39, 75.0] and seen["labels"] == ["75.39", "75.00"]


def test_report_opens_on_the_verdict_and_marks_the_better_direction(tmp_path, compact):
    """Verdict, figures, training curves and statistics before the runs' details and settings;
    each row with a direction says which is better; the verdict counts what moved which way
    from the first run (known changes: effective rank up = better, |correlation| up = worse)."""
    import dataclasses
    import re

    before, _ = compact
    stats = embedding_statistics(before, "unit", k=10)
    moved = dataclasses.replace(stats, effective_rank=stats.effective_rank * 1.02,
                                abs_corr_mean=stats.abs_corr_mean * 1.5,
                                entropy_mean=stats.entropy_mean * 0.995)  # within 1%: same
    out = tmp_path / "report"
    loss = plot_loss_terms(_metrics(tmp_path / "metrics.jsonl"), out / "loss.png")
    runs = [RunDiagnostics("base", "base.pt", {"emb": stats}),
            RunDiagnostics("same", "same.pt", {"emb": stats}, info={"model": "last step"}),
            RunDiagnostics("e2mc", "e2mc.pt", {"emb": moved}, figures=[("training", loss)])]
    marg = plot_marginal_pair(before, {"x": before}, out / "marginals.png")
    _, html_path = write_report(out, runs, [("marginals", marg)],
                                extra={"settings": {"data": "builtin", "split": "test",
                                                    "num_samples": 300},
                                       "accuracy": {"e2mc": {"epochs": [0, 1],
                                                             "top1": [70.0, 71.25]}}})
    page = html_path.read_text(encoding="utf-8")
    order = [page.index(h) for h in ("<h2>Verdict</h2>", "<h2>Figures</h2>",
                                     "<h2>Training curves</h2>", "<h2>Statistics</h2>",
                                     "<h2>Runs</h2>", "<h2>Settings</h2>")]
    assert order == sorted(order)
    assert "300 images of <code>builtin</code> (test split)" in page[:order[0]]
    verdict = page[order[0]:order[1]]
    directed = sum(1 for _, better in STAT_ROWS.values() if better)
    assert (f"<b>same</b> against <b>base</b>, emb: all {directed} statistics with a direction "
            "are within 1% of base's (the same model, or one that barely moved; analysed: last "
            "step)" in verdict)
    a, b = stats.abs_corr_mean, moved.abs_corr_mean
    assert (f'<b>e2mc</b> against <b>base</b>, emb: <span class="better">1 of {directed}</span> '
            "statistics moved the better way (effective rank); <span class=\"worse\">1 the other "
            f"way</span>: |correlation| off-diagonal, mean ({a:.4g} → {b:.4g}); "
            f"{directed - 2} within 1% of base's") in verdict
    assert "<b>e2mc</b> 71.25 % (epoch 1)" in verdict
    rows = {label: cls for cls, label in re.findall(r'<tr class="(\w+)"><th>([^<]+)</th>', page)}
    for label, better in STAT_ROWS.values():
        mark = {"higher": "↑ higher", "lower": "↓ lower"}.get(better, "")
        assert rows[label.replace("<", "&lt;")] == (better or "plain")
        assert f'<th>{label.replace("<", "&lt;")}</th><td class="dir">{mark}</td>' in page
    rank = page[page.index("<th>effective rank</th>"):]
    rank = rank[:rank.index("</tr>")]
    assert rank.endswith(f'<td class="better">{moved.effective_rank:.4g}</td>')
    corr = page[page.index("<th>|correlation| off-diagonal, mean</th>"):]
    assert corr[:corr.index("</tr>")].endswith(f'<td class="worse">{b:.4g}</td>')
