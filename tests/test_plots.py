"""Plots render with Agg and draw the data they are given: values, intervals, legends, honest axes."""

from __future__ import annotations

from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from memlab import plots  # noqa: E402

IDX = [1, 2, 3, 4, 5, "overall 1-4", "overall 1-5"]
N = [282, 321, 96, 841, 446, 1540, 1986]


def summary(f1, tokens, ctx=100.0, recall=(0.1, 0.4, 0.6, 0.8), half=0.05):
    d = pd.DataFrame(index=IDX)
    d["n"] = N
    d["f1"] = f1
    d["f1_lo"], d["f1_hi"] = d.f1 - half, d.f1 + 2 * half  # asymmetric on purpose
    d["answer_tokens_qa"] = tokens
    d["context_tokens_qa"] = ctx
    for k, r in zip((1, 5, 10, 20), recall):
        d[f"recall@{k}"] = r
        d[f"recall@{k}_lo"], d[f"recall@{k}_hi"] = r - 0.05, min(r + 0.05, 1.0)
    return d


def fake_run(f1, tokens, k=10, **kw):
    return SimpleNamespace(summary=summary(f1, tokens, **kw), config=SimpleNamespace(retrieval=SimpleNamespace(
        top_k=k)))


def error_segments(ax):
    """(x, y_low, y_high) of every vertical error bar drawn on ax."""
    out = []
    for coll in ax.collections:
        if isinstance(coll, matplotlib.collections.LineCollection):
            for seg in coll.get_segments():
                if len(seg) == 2 and np.isclose(seg[0][0], seg[1][0]):
                    out.append((round(float(seg[0][0]), 3), round(float(seg[0][1]), 3), round(float(seg[1][1]), 3)))
    return sorted(out)


def test_pareto_front():
    assert plots.pareto_front([(100, 0.3), (50, 0.2), (200, 0.25), (300, 0.5)]) == [(50, 0.2), (100, 0.3),
                                                                                    (300, 0.5)]


def test_f1_vs_tokens_points_intervals_and_legends(tmp_path):
    runs = {"a": fake_run(0.3, 1000.0), "b": fake_run(0.5, 3000.0), "offline": fake_run(0.2, 0.0, ctx=400.0)}
    fig = plots.f1_vs_tokens(runs, categories=(1, 4), save_to=tmp_path)
    ax = fig.axes[0]
    pts = sorted((round(float(line.get_xdata()[0]), 3), round(float(line.get_ydata()[0]), 3))
                 for line in ax.get_lines() if line.get_linestyle() == "None" and line.get_marker() != "_")
    assert pts == sorted([(1000.0, 0.3), (3000.0, 0.5), (400.0, 0.2)] * 2)  # offline arm at its context tokens
    assert error_segments(ax) == sorted([(x, round(y - 0.05, 3), round(y + 0.1, 3)) for x, y in pts])
    fronts = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert len(fronts) == 2 and list(fronts[0].get_xdata()) == [400.0, 1000.0, 3000.0]
    legends = [c for c in ax.get_children() if isinstance(c, matplotlib.legend.Legend)]
    texts = {t.get_text() for leg in legends for t in leg.get_texts()}
    assert {"1 multi-hop (n=282)", "4 single-hop (n=841)", "a", "b", "offline (context tokens)"} <= texts
    markers = {t.get_text(): h.get_marker() for leg in legends for t, h in zip(leg.get_texts(), leg.legend_handles)}
    assert len({markers["a"], markers["b"], markers["offline (context tokens)"]}) == 3
    assert "offline arms: context tokens" in ax.get_xlabel()
    assert ax.get_ylim()[0] == 0  # quality axis not truncated
    assert not any(t.get_text() for t in ax.texts)  # no point labels that could overlap
    assert (tmp_path / "f1_vs_tokens.png").is_file() and (tmp_path / "f1_vs_tokens.svg").is_file()
    assert "Pareto front of a category" in texts  # the dashed lines say what they are
    # categories 1 and 4 of an arm have the same tokens and F1 here: drawn side by side, not on top of each other
    drawn = [tuple(np.round(line.get_transform().transform((line.get_xdata()[0], line.get_ydata()[0])), 1))
             for line in ax.get_lines() if line.get_linestyle() == "None" and line.get_marker() != "_"]
    assert len(set(drawn)) == len(drawn) == 6
    fig.canvas.draw()
    ticks = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert ticks == ["500", "1,000", "2,000"]  # plain numbers at 1-2-5 steps, never "2×10²"
    assert not any(t.get_text() for t in ax.get_xticklabels(minor=True))


def test_f1_vs_tokens_total_adds_the_build_tokens(tmp_path):
    a, b = fake_run(0.3, 1000.0), fake_run(0.5, 3000.0)
    a.summary["build_tokens_qa"], b.summary["build_tokens_qa"] = 5000.0, 10.0
    fig = plots.f1_vs_tokens({"a": a, "b": b}, categories=(1,), tokens="total")
    ax = fig.axes[0]
    pts = sorted((round(float(line.get_xdata()[0]), 3), round(float(line.get_ydata()[0]), 3))
                 for line in ax.get_lines() if line.get_linestyle() == "None" and line.get_marker() != "_")
    assert pts == [(3010.0, 0.5), (6000.0, 0.3)] and "memory-building" in ax.get_xlabel()
    del b.summary["build_tokens_qa"]
    with pytest.raises(ValueError, match="b: its summary has no build_tokens_qa"):
        plots.f1_vs_tokens({"a": a, "b": b}, categories=(1,), tokens="total")


def test_all_offline_runs_say_context_tokens():
    fig = plots.f1_vs_tokens({"x": fake_run(0.2, 0.0, ctx=300.0), "y": fake_run(0.3, 0.0, ctx=600.0)}, categories=(1,))
    assert fig.axes[0].get_xlabel().startswith("context tokens/QA")


def test_category_bars_values_intervals_and_labels():
    fig = plots.category_bars({"a": fake_run(0.3, 10.0), "b": fake_run(0.6, 10.0)}, categories=(1, 2, "overall 1-4"))
    ax = fig.axes[0]
    heights = [round(p.get_height(), 3) for p in ax.patches]
    assert heights == [0.3] * 3 + [0.6] * 3
    tops = sorted(e[2] for e in error_segments(ax))
    assert tops == [0.4] * 3 + [0.7] * 3
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1 multi-hop\n(n=282)", "2 temporal\n(n=321)",
                                                           "overall 1-4\n(n=1,540)"]
    assert ax.get_ylim()[0] == 0 and ax.get_ylim()[1] >= 0.7


def test_topk_curve_orders_by_k_with_intervals_and_context_axis():
    runs = [fake_run(0.33, 0.0, k=20, ctx=900.0), fake_run(0.30, 0.0, k=5, ctx=300.0),
            fake_run(0.32, 0.0, k=10, ctx=500.0)]
    fig = plots.topk_curve(runs)
    f1_line = fig.axes[0].get_lines()[0]
    tok_line = fig.axes[1].get_lines()[0]
    assert list(f1_line.get_xdata()) == [5, 10, 20] and list(f1_line.get_ydata()) == [0.30, 0.32, 0.33]
    assert list(tok_line.get_ydata()) == [300.0, 500.0, 900.0]
    assert [e[1:] for e in error_segments(fig.axes[0])] == [(0.25, 0.4), (0.27, 0.42), (0.28, 0.43)]
    assert "context tokens" in fig.axes[1].get_ylabel() and fig.axes[0].get_ylim()[0] == 0
    assert fig.axes[1].get_ylim()[0] == 0


def test_attribution_bars_are_shares_with_counts():
    att = pd.DataFrame({"category": [1, 1, 1, 2], "label": ["write-miss", "reading-miss", "reading-miss",
                                                           "retrieval-miss"]})
    fig = plots.attribution_bars({"arm": att}, n={"arm": {1: 10, 2: 4}})
    ax = fig.axes[0]
    heights = {label: [round(p.get_height(), 3) for p in container]
               for container, label in zip(ax.containers, plots.LABELS)}
    assert heights["reading-miss"] == [0.2, 0] and heights["write-miss"] == [0.1, 0]
    assert heights["retrieval-miss"] == [0, 0.25]
    assert sorted(t.get_text() for t in ax.texts) == ["1", "1", "2"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1 multi-hop\n(n=10)", "2 temporal\n(n=4)"]
    assert "share" in ax.get_ylabel() and ax.get_ylim() == (0.0, 1.0)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == list(plots.LABELS)[::-1]  # top-down like the stack: its bottom segment is listed last
    shares = plots.attribution_bars({"arm": att})  # without n: shares of the failed questions
    tops = [sum(p.get_height() for c in shares.axes[0].containers for p in [c[i]]) for i in range(2)]
    assert np.allclose(tops, [1.0, 1.0])


def test_recall_curves_stop_at_the_runs_top_k():
    fig = plots.recall_curves(fake_run(0.3, 10.0, k=10))
    lines = [line for line in fig.axes[0].get_lines() if line.get_linestyle() == "-"]  # not the error caps
    assert len(lines) == 7 and list(lines[0].get_xdata()) == [1, 5, 10]
    assert list(lines[0].get_ydata()) == [0.1, 0.4, 0.6]
    assert fig.axes[0].get_legend().get_texts()[0].get_text() == "1 multi-hop (n=282)"
    assert list(fig.axes[0].get_xticks()) == [1, 5, 10]  # ticks at the k measured, not 2, 4, 6, 8


def sweep_table():
    rows = []
    for p, policy in enumerate(("merge-similar", "append-only")):
        for s, setting in enumerate(("off", "0.95/0.90/0.80/0.60", "0.90/0.70/0.60/0.40")):
            rows.append({"policy": policy, "setting": setting, "rewritten": 100 * s, "skipped": 300 + s,
                         "superseded": 50 * p, "near_duplicates": 3 - s, "n": 1540, "recall@10": 0.7 + 0.01 * s,
                         "recall@10_lo": 0.65, "recall@10_hi": 0.8, "f1": 0.2 + 0.01 * p, "f1_lo": 0.15,
                         "f1_hi": 0.25})
    return pd.DataFrame(rows)


def test_reconcile_thresholds_panels_legend_and_file(tmp_path):
    """Issue 23 (notebook 05): labels did not overlap-proof, F1 was missing, Recall@10 had no legend entry, a few
    near-duplicates beside hundreds of ops were invisible, nothing was saved."""
    fig = plots.reconcile_thresholds(sweep_table(), save_to=tmp_path)
    axes = np.array(fig.axes).reshape(3, 2)
    assert [a.get_title() for a in axes[0]] == ["merge-similar", "append-only"] and fig.get_suptitle()
    assert axes[0, 0].get_ylabel() and axes[1, 0].get_ylabel() and "n=1,540" in axes[2, 0].get_ylabel()
    dup = [round(p.get_height()) for p in axes[1, 0].patches]
    assert dup == [3, 2, 1] and axes[1, 0].get_ylim()[1] < 10  # its own scale, not the ops' hundreds
    assert sorted(t.get_text() for t in axes[1, 0].texts) == ["1", "2", "3"]  # counts written on the bars
    lines = [ln for ln in axes[2, 1].get_lines() if ln.get_linestyle() == "-"]
    assert [list(np.round(ln.get_ydata(), 3)) for ln in lines] == [[0.7, 0.71, 0.72], [0.21, 0.21, 0.21]]
    assert [e[1:] for e in error_segments(axes[2, 1])][:1] in ([(0.15, 0.25)], [(0.65, 0.8)])
    legend = {t.get_text() for t in fig.legends[0].get_texts()}
    assert {"evidence Recall@10 (95 % interval)", "F1 (official LoCoMo) (95 % interval)",
            "near-duplicate pairs left", "rewritten to an update"} <= legend
    ticks = [t.get_text() for t in axes[2, 0].get_xticklabels()]
    assert ticks[0] == "off" and ticks[1] == "skip 0.95/0.90\nupd 0.80/0.60"
    assert (tmp_path / "reconcile.png").is_file()
    zeros = sweep_table().assign(near_duplicates=0)
    assert plots.reconcile_thresholds(zeros).axes[3].get_ylim() == (0.0, 1.0)  # no axis centred on 0


def test_a_narrow_token_range_still_gets_plain_ticks():
    """Token-matched arms all sit near one budget (e.g. 460-480 tokens): no 1-2-5 step falls in that range, and the
    axis had no tick at all; it gets even steps, as plain numbers."""
    import matplotlib.pyplot as plt

    from memlab.plots.style import plain_log_ticks

    fig, ax = plt.subplots()
    ax.set_xscale("log")
    ax.set_xlim(455, 485)
    plain_log_ticks(ax)
    ticks = [t for t in ax.get_xticks() if 455 <= t <= 485]
    assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks)
    assert ax.xaxis.get_major_formatter()(ticks[0], 0) == f"{ticks[0]:,.0f}"
    ax.set_xlim(100, 5000)
    plain_log_ticks(ax)
    assert {200.0, 1000.0, 2000.0} <= set(ax.get_xticks())  # a wide range keeps its 1-2-5 steps
    plt.close(fig)
