"""Plots render with Agg and draw the data they are given."""

from __future__ import annotations

from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from memlab import plots  # noqa: E402


def summary(f1, tokens, ctx=100.0, recall=(0.1, 0.4, 0.6, 0.8)):
    idx = [1, 2, 3, 4, 5, "overall 1-4", "overall 1-5"]
    d = pd.DataFrame(index=idx)
    d["f1"] = f1
    d["tokens_qa"] = tokens
    d["context_tokens_qa"] = ctx
    for k, r in zip((1, 5, 10, 20), recall):
        d[f"recall@{k}"] = r
    return d


def fake_run(f1, tokens, k=10, **kw):
    return SimpleNamespace(summary=summary(f1, tokens, **kw), config=SimpleNamespace(retrieval=SimpleNamespace(
        top_k=k)))


def test_pareto_front():
    assert plots.pareto_front([(100, 0.3), (50, 0.2), (200, 0.25), (300, 0.5)]) == [(50, 0.2), (100, 0.3),
                                                                                    (300, 0.5)]


def test_f1_vs_tokens_draws_each_arm_and_category(tmp_path):
    runs = {"a": fake_run(0.3, 1000.0), "b": fake_run(0.5, 3000.0), "offline": fake_run(0.2, 0.0, ctx=400.0)}
    fig = plots.f1_vs_tokens(runs, categories=(1, 4), save_to=tmp_path)
    ax = fig.axes[0]
    pts = sorted(tuple(np.round(c.get_offsets()[0], 3)) for c in ax.collections)
    assert pts == sorted([(1000.0, 0.3), (3000.0, 0.5), (400.0, 0.2)] * 2)  # offline arm at its context tokens
    fronts = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert len(fronts) == 2 and list(fronts[0].get_xdata()) == [400.0, 1000.0, 3000.0]
    assert (tmp_path / "f1_vs_tokens.png").is_file() and (tmp_path / "f1_vs_tokens.svg").is_file()


def test_f1_vs_tokens_total_adds_the_build_tokens(tmp_path):
    a, b = fake_run(0.3, 1000.0), fake_run(0.5, 3000.0)
    a.summary["build_tokens_qa"], b.summary["build_tokens_qa"] = 5000.0, 10.0
    fig = plots.f1_vs_tokens({"a": a, "b": b}, categories=(1,), tokens="total")
    pts = sorted(tuple(np.round(c.get_offsets()[0], 3)) for c in fig.axes[0].collections)
    assert pts == [(3010.0, 0.5), (6000.0, 0.3)] and "memory-building" in fig.axes[0].get_xlabel()
    del b.summary["build_tokens_qa"]
    with pytest.raises(ValueError, match="b: its summary has no build_tokens_qa"):
        plots.f1_vs_tokens({"a": a, "b": b}, categories=(1,), tokens="total")


def test_topk_curve_orders_by_k():
    runs = [fake_run(0.33, 900.0, k=20), fake_run(0.30, 300.0, k=5), fake_run(0.32, 500.0, k=10)]
    fig = plots.topk_curve(runs)
    f1_line = fig.axes[0].get_lines()[0]
    tok_line = fig.axes[1].get_lines()[0]
    assert list(f1_line.get_xdata()) == [5, 10, 20] and list(f1_line.get_ydata()) == [0.30, 0.32, 0.33]
    assert list(tok_line.get_ydata()) == [300.0, 500.0, 900.0]


def test_attribution_bars_stack_counts():
    att = pd.DataFrame({"category": [1, 1, 1, 2], "label": ["write-miss", "reading-miss", "reading-miss",
                                                           "retrieval-miss"]})
    fig = plots.attribution_bars({"arm": att})
    ax = fig.axes[0]
    heights = {}
    for container, label in zip(ax.containers, plots.LABELS):
        heights[label] = [round(p.get_height()) for p in container]
    assert heights["reading-miss"] == [2, 0] and heights["write-miss"] == [1, 0] and heights["retrieval-miss"] == [0, 1]


def test_recall_curves_plot_summary_values():
    fig = plots.recall_curves(fake_run(0.3, 10.0))
    lines = fig.axes[0].get_lines()
    assert len(lines) == 7 and list(lines[0].get_ydata()) == [0.1, 0.4, 0.6, 0.8]
