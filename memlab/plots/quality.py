"""Quality per category: bars per arm, quality against token cost (with Pareto fronts), evidence recall
against k."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.transforms import ScaledTranslation

from memlab.plots.style import (
    ARM_COLORS,
    CATEGORY_COLORS,
    CONTEXT_AXIS,
    DODGE_PT,
    HATCHES,
    MARKERS,
    TOKENS_AXIS,
    category_color,
    error_span,
    group_label,
    interval,
    keys_of,
    metric_label,
    plain_log_ticks,
    quality_ylim,
    save_figure,
    sends_prompt,
    summary_of,
    tokens_per_qa,
)
from memlab.run.labels import category_name


def category_bars(runs: Mapping[str, Any], metric: str = "f1",
                  categories: Sequence[Any] = (1, 2, 3, 4, 5, "overall 1-4"), ax: plt.Axes | None = None,
                  save_to: str | Path | None = None) -> Figure:
    """One group of bars per category (its number, label and n), one bar per arm, 95 % interval error bars."""
    arms = list(runs)
    cats = [c for c in keys_of(categories) if any(c in summary_of(r).index for r in runs.values())]
    fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(figsize=(max(7, 1.3 * len(cats) + 2), 4.8))
    width = 0.8 / max(1, len(arms))
    top = 0.0
    for j, arm in enumerate(arms):
        s = summary_of(runs[arm])
        iv = interval(runs[arm], metric)
        xs, ys, errs = [], [], []
        for i, c in enumerate(cats):
            if c not in s.index or metric not in s.columns:
                continue
            v = float(s.loc[c, metric])
            xs.append(i + (j - (len(arms) - 1) / 2) * width)
            ys.append(v)
            e = error_span(v, *(float(iv[0].loc[c]), float(iv[1].loc[c])) if iv is not None else (None, None))
            errs.append(e if e is not None else np.zeros((2, 1)))
            top = max(top, v if e is None else v + float(e[1, 0]))
        yerr = np.hstack(errs) if errs else None
        ax.bar(xs, ys, width * 0.92, color=ARM_COLORS[j % len(ARM_COLORS)], hatch=HATCHES[j % len(HATCHES)],
               edgecolor="white", label=arm, yerr=yerr if iv is not None else None, capsize=3,
               error_kw={"elinewidth": 1, "ecolor": "#222222"})
    ax.set_xticks(range(len(cats)))
    ax.set_xticklabels([group_label(runs, c).replace(" (n=", "\n(n=") for c in cats], fontsize=8)
    ax.set_ylabel(metric_label(metric))
    quality_ylim(ax, top)
    ax.set_title(f"{metric_label(metric)} per category (bars: 95 % clustered-bootstrap interval)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, title="arm", title_fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    save_figure(fig, save_to, f"{metric}_by_category")
    return fig



def pareto_front(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points not dominated by another (fewer or equal tokens and higher or equal F1), by tokens."""
    front: list[tuple[float, float]] = []
    for x, y in sorted(points, key=lambda p: (p[0], -p[1])):
        if not front or y > front[-1][1]:
            front.append((x, y))
    return front


def f1_vs_tokens(runs: Mapping[str, Any], categories: Sequence[Any] = (1, 2, 3, 4, 5, "overall 1-4"),
                 metric: str = "f1", ax: plt.Axes | None = None, save_to: str | Path | None = None,
                 tokens: str = "answer") -> Figure:
    """One point per (arm, category): x Tokens/QA (log), y F1 with its interval; dashed Pareto front per category.

    Colour = category, marker = arm (two legends say which; hollow, so coinciding arms stay visible); each
    category is drawn a few points to the side of its tokens so that one arm's categories do not hide each
    other. Offline arms sit at their context tokens.
    ``tokens="answer"``: answering tokens only (what the reference reports); ``"total"``: plus the
    memory-building tokens per question (extraction + embeddings, amortized; `memlab.eval.cost`).
    """
    if tokens not in ("answer", "total"):
        raise ValueError(f"tokens: expected 'answer' or 'total', got {tokens!r}")
    fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(figsize=(9, 5.5))
    arms = list(runs)
    top = 0.0
    shown = []
    fronts = 0
    intervals = {arm: interval(runs[arm], metric) for arm in arms}
    keys = keys_of(categories)
    for ci, c in enumerate(keys):
        # categories of one arm sit at nearly the same tokens: each category is drawn a few points to the side
        # (a display offset: the data, and the tick it sits at, are unchanged) so points and bars stay apart
        dodge = ax.transData + ScaledTranslation((ci - (len(keys) - 1) / 2) * DODGE_PT / 72, 0, fig.dpi_scale_trans)
        pts = []
        for i, arm in enumerate(arms):
            s = summary_of(runs[arm])
            if c not in s.index:
                continue
            x, y = float(tokens_per_qa(s).loc[c]), float(s.loc[c, metric])
            if tokens == "total":
                if "build_tokens_qa" not in s:
                    raise ValueError(f"{arm}: its summary has no build_tokens_qa (a run from before build costs "
                                     "were counted); rerun it, or plot tokens='answer'")
                x += float(s.loc[c, "build_tokens_qa"])
            iv = intervals[arm]
            e = error_span(y, float(iv[0].loc[c]), float(iv[1].loc[c])) if iv is not None else None
            pts.append((x, y))
            ax.update_datalim([(x, y)])  # a display-offset artist does not extend the data limits itself
            ax.errorbar([x], [y], yerr=e, fmt=MARKERS[i % len(MARKERS)], color=category_color(c), mfc="white", mew=1.5,
                        ms=7, capsize=3, elinewidth=1, zorder=3 + i * 0.01, transform=dodge)
            top = max(top, y if e is None else y + float(e[1, 0]))
        if pts:
            shown.append(c)
        front = pareto_front(pts)
        if len(front) > 1:
            fronts += 1
            ax.plot([p[0] for p in front], [p[1] for p in front], ls="--", lw=1, color=category_color(c),
                    transform=dodge)
    ax.set_xscale("log")
    ax.margins(x=0.07)  # room for the outer categories' side offset
    ax.autoscale_view()
    plain_log_ticks(ax)
    offline = [not sends_prompt(summary_of(r)) for r in runs.values()]
    ax.set_xlabel((CONTEXT_AXIS if all(offline) else TOKENS_AXIS + ("; offline arms: context tokens"
                                                                     if any(offline) else ""))
                  + (" + memory-building tokens/QA" if tokens == "total" else ""))
    ax.set_ylabel(metric_label(metric))
    quality_ylim(ax, top)
    ax.set_title("Per-category quality against token cost (bars: 95 % interval; categories drawn side by side)")
    ax.grid(True, alpha=0.3)
    cat_handles = [Line2D([], [], color=category_color(c), marker="s", ls="", ms=8,
                          label=group_label(runs, c)) for c in shown]
    arm_handles = [Line2D([], [], color="#555555", marker=MARKERS[i % len(MARKERS)], ls="", ms=7, mfc="white",
                          mew=1.5,
                          label=arm + (" (context tokens)" if off and not all(offline) else ""))
                   for i, (arm, off) in enumerate(zip(arms, offline))]
    if fronts:
        arm_handles.append(Line2D([], [], color="#555555", ls="--", lw=1, label="Pareto front of a category"))
    # one legend (a second one added with add_artist is left out of a tight bounding box and was cut off)
    ax.legend(handles=cat_handles + arm_handles, fontsize=8, title="colour = category, marker = arm",
              title_fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    save_figure(fig, save_to, "f1_vs_tokens")
    return fig



def recall_curves(run: Any, ks: Sequence[int] = (1, 5, 10, 20), save_to: str | Path | None = None) -> Figure:
    """Evidence Recall@k against k, one line per category with its interval; k above the run's top-k is not
    drawn (a top-10 run cannot show Recall@20)."""
    s = summary_of(run)
    top_k = getattr(getattr(getattr(run, "config", None), "retrieval", None), "top_k", None)
    ks = [k for k in ks if (top_k is None or k <= top_k) and f"recall@{k}" in s.columns]
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    ivs = {k: interval(run, f"recall@{k}") for k in ks}
    for c in [i for i in s.index if i in CATEGORY_COLORS]:  # string keys (see summary_of)
        ys = [float(s.loc[c, f"recall@{k}"]) for k in ks]
        err = None
        if ks and all(ivs[k] is not None for k in ks):
            err = np.array([[max(y - float(ivs[k][0].loc[c]), 0) for k, y in zip(ks, ys)],
                            [max(float(ivs[k][1].loc[c]) - y, 0) for k, y in zip(ks, ys)]])
        n = int(s.loc[c, "n"]) if "n" in s.columns else None
        ax.errorbar(list(ks), ys, yerr=err, fmt="o-", color=CATEGORY_COLORS[c], capsize=3,
                    label=category_name(c, n))
    ax.set_xticks(list(ks))  # only the k values measured (no 2.5, 7.5 in between)
    ax.set_xlabel("k" + (f" (up to the run's top-k = {top_k})" if top_k is not None else ""))
    ax.set_ylabel("evidence Recall@k")
    ax.set_ylim(0, 1)
    ax.set_title("Evidence recall by category (bars: 95 % interval)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    save_figure(fig, save_to, "recall")
    return fig
