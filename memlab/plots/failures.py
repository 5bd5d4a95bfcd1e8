"""Failure attribution plot: labels (`memlab.attribution`) stacked per category and arm."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from memlab.attribution import LABELS
from memlab.plots.style import HATCHES, LABEL_COLORS, save_figure
from memlab.run.labels import category_name


def _n_of(counts: Mapping[Any, Any], c: int) -> int:
    """Questions of category ``c`` in a mapping keyed by int or by string (a summary's ``n`` column)."""
    v = counts.get(c, counts.get(str(c), 0))
    return int(v) if v == v else 0


def attribution_bars(attributions: Mapping[str, pd.DataFrame], n: Mapping[str, Mapping[int, int]] | None = None,
                     save_to: str | Path | None = None) -> Figure:
    """Failure labels stacked per category and arm, as shares with the count written in each segment.

    With ``n`` (questions per arm and category, e.g. a run's ``summary["n"]``), a bar's height is the share of
    the category's questions that failed, split by label; without it, the shares of the failed questions.
    """
    cats = sorted({int(c) for att in attributions.values() for c in att["category"]})
    arms = list(attributions)
    fig, ax = plt.subplots(figsize=(min(14, max(7, 0.9 * len(cats) * max(1, len(arms)) + 3.5)), 5))
    width = 0.8 / max(1, len(arms))
    for j, arm in enumerate(arms):
        att = attributions[arm]
        counts = att.groupby(["category", "label"]).size().unstack(fill_value=0).reindex(
            index=cats, columns=list(LABELS), fill_value=0)
        if n is not None:
            totals = np.array([max(_n_of(n[arm], c), 1) for c in cats], dtype=float)
        else:
            totals = np.maximum(counts.sum(axis=1).to_numpy(dtype=float), 1)
        bottom = np.zeros(len(cats))
        xs = np.array([i + (j - (len(arms) - 1) / 2) * width for i in range(len(cats))])
        for lab in LABELS:
            cnt = counts[lab].to_numpy()
            share = cnt / totals
            ax.bar(xs, share, width * 0.92, bottom=bottom, color=LABEL_COLORS[lab], hatch=HATCHES[j % len(HATCHES)],
                   label=lab if j == 0 else None, edgecolor="white", linewidth=0.5)
            for x, b, s_, c_ in zip(xs, bottom, share, cnt):
                if c_ and s_ >= 0.045:  # small segments stay unlabelled rather than overlap
                    ax.text(x, b + s_ / 2, str(int(c_)), ha="center", va="center", fontsize=7, color="black",
                            bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.85})
            bottom = bottom + share
    if len(arms) > 1:
        ticks = [i + (j - (len(arms) - 1) / 2) * width for i in range(len(cats)) for j in range(len(arms))]
        ax.set_xticks(ticks, minor=True)
        ax.set_xticklabels([f"{chr(65 + j)}" for _ in cats for j in range(len(arms))], minor=True, fontsize=7)
        ax.tick_params(axis="x", which="minor", length=0, pad=2)
        ax.tick_params(axis="x", which="major", pad=14)
    ax.set_xticks(range(len(cats)))
    if n is not None:
        ax.set_xticklabels([category_name(c) + "\n(n=" + "/".join(f"{_n_of(n[a], c):,}" for a in arms) + ")"
                            for c in cats], fontsize=8)
    else:
        ax.set_xticklabels([category_name(c) for c in cats], fontsize=8)
    ax.set_ylabel("share of the category's questions" if n is not None else "share of the failed questions")
    ax.set_ylim(0, 1)
    ax.set_title("Why answers failed, per category and arm (numbers: failed questions)")
    stack = list(LABELS)[::-1]  # the legend reads top-down like the stack (its first label is the bottom segment)
    handles = [plt.Rectangle((0, 0), 1, 1, color=LABEL_COLORS[lab]) for lab in stack]
    names = stack
    if len(arms) > 1:
        handles += [plt.Rectangle((0, 0), 1, 1, facecolor="#dddddd", hatch=HATCHES[j % len(HATCHES)],
                                  edgecolor="#555555") for j in range(len(arms))]
        names += [f"{chr(65 + j)}: {a}" for j, a in enumerate(arms)]
    ax.legend(handles, names, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    save_figure(fig, save_to, "attribution")
    return fig

