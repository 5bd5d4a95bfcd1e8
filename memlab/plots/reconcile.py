"""A reconcile sweep's plot (`memlab.studies.reconcile_sweep`): ops, duplicates left, recall and F1 per
update policy and threshold setting."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from memlab.plots.style import ARM_COLORS, save_figure


def _bar_counts(ax: plt.Axes, bars: Any) -> None:
    """Each bar's count above it, so a 0 or a 3 next to a 500 is still read (a bar that small is invisible)."""
    for p in bars:
        ax.annotate(f"{int(round(p.get_height())):,}", (p.get_x() + p.get_width() / 2, p.get_height()),
                    xytext=(0, 1), textcoords="offset points", ha="center", va="bottom", fontsize=6)


def reconcile_thresholds(table: pd.DataFrame, save_to: str | Path | None = None) -> Figure:
    """A reconcile sweep (`memlab.studies.reconcile_sweep`): one column of panels per update policy; rows: the ops
    reconcile rewrote or skipped and the versions superseded, the near-duplicate pairs left in the store (its own
    scale, so a few pairs beside hundreds of ops stay visible), and Recall@10 and F1 with their 95 % intervals."""
    policies = list(dict.fromkeys(table.policy))
    settings = list(dict.fromkeys(table.setting))
    fig, axes = plt.subplots(3, len(policies), figsize=(max(6.0, 3.6 * len(policies)), 8.5), sharex=True,
                             sharey="row", squeeze=False)
    x = np.arange(len(settings))
    ops = (("rewritten", "rewritten to an update"), ("skipped", "skipped (duplicate)"),
           ("superseded", "superseded versions kept"))
    width = 0.8 / len(ops)
    handles: dict[str, Any] = {}
    for j, policy in enumerate(policies):
        t = table[table.policy == policy].set_index("setting").reindex(settings)
        ax = axes[0, j]
        for i, (col, name) in enumerate(ops):
            bars = ax.bar(x + (i - (len(ops) - 1) / 2) * width, t[col].fillna(0), width * 0.95,
                          color=ARM_COLORS[i], label=name)
            _bar_counts(ax, bars)
            handles[name] = bars
        ax.set_title(policy, fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
        ax = axes[1, j]
        bars = ax.bar(x, t["near_duplicates"].fillna(0), 0.5, color="#8c564b", label="near-duplicate pairs left")
        _bar_counts(ax, bars)
        handles["near-duplicate pairs left"] = bars
        ax.grid(True, axis="y", alpha=0.3)
        ax = axes[2, j]
        for i, (m, name) in enumerate((("recall@10", "evidence Recall@10"), ("f1", "F1 (official LoCoMo)"))):
            y = t[m].astype(float).to_numpy()
            err = None
            if f"{m}_lo" in t and f"{m}_hi" in t and t[[f"{m}_lo", f"{m}_hi"]].notna().all().all():
                err = np.vstack([(y - t[f"{m}_lo"]).clip(lower=0), (t[f"{m}_hi"] - y).clip(lower=0)])
            handles[name + " (95 % interval)"] = ax.errorbar(x + (i - 0.5) * 0.12, y, yerr=err, fmt="os"[i] + "-",
                                                             color=("#1f77b4", "#d62728")[i], capsize=3, ms=5)
        ax.set_ylim(0, 1)
        ax.grid(True, alpha=0.3)
        ax.set_xticks(x)
        ax.set_xticklabels([s if s == "off" else "skip " + "/".join(s.split("/")[:2]) + "\nupd " +
                            "/".join(s.split("/")[2:]) for s in settings], fontsize=7)
    axes[0, 0].set_ylabel("ops (count)")
    axes[1, 0].set_ylabel("near-duplicate pairs\n(count)")
    n = sorted(set(table["n"])) if "n" in table else []
    axes[2, 0].set_ylabel("quality, categories 1-4" + (f"\n(n={n[0]:,})" if len(n) == 1 else ""))
    for ax in axes[:2].ravel():  # counts start at 0 (all zeros must not centre the axis on 0)
        ax.margins(y=0.12)  # room for the counts above the bars
        ax.set_ylim(0, max(1.0, ax.get_ylim()[1]))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    fig.supxlabel("reconcile setting (skip score/Jaccard, update score/Jaccard)", fontsize=9, y=0.075)
    fig.suptitle("Reconcile thresholds per update policy: what reconcile did, duplicates left, recall and F1")
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=3, fontsize=8,
               bbox_to_anchor=(0.5, 0.0))
    fig.tight_layout(rect=(0, 0.09, 1, 0.97))
    save_figure(fig, save_to, "reconcile")
    return fig

