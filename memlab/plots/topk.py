"""Top-k ablation plots: F1 and tokens against k, and per k what retrieval delivered next to what the reader
made of it (`topk_measures` is that table)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from memlab.plots.style import (
    ARM_COLORS,
    interval,
    keys_of,
    metric_label,
    quality_ylim,
    save_figure,
    sends_prompt,
    summary_of,
    tokens_per_qa,
)
from memlab.run.labels import category_name


def topk_curve(runs: Sequence[Any], group: Any = "overall 1-4", metric: str = "f1",
               save_to: str | Path | None = None) -> Figure:
    """F1 with its interval (left axis) and tokens/QA (right axis) against the retrieval top-k of each run."""
    rows = []
    group = str(group)
    for r in runs:
        s = summary_of(r)
        iv = interval(r, metric)
        rows.append({"k": r.config.retrieval.top_k, "y": float(s.loc[group, metric]),
                     "lo": float(iv[0].loc[group]) if iv is not None else np.nan,
                     "hi": float(iv[1].loc[group]) if iv is not None else np.nan,
                     "tokens": float(tokens_per_qa(s).loc[group]), "offline": not sends_prompt(s),
                     "n": int(s.loc[group, "n"]) if "n" in s.columns else None})
    df = pd.DataFrame(rows).sort_values("k")
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    err = np.vstack([(df.y - df.lo).clip(lower=0), (df.hi - df.y).clip(lower=0)]) if df.lo.notna().all() else None
    h1 = ax.errorbar(df.k, df.y, yerr=err, fmt="o-", color="#1f77b4", capsize=3, label=f"{metric_label(metric)} "
                     "(95 % interval)")
    ax.set_xlabel("top-k (memories retrieved)")
    ns = sorted({n for n in df.n if n is not None})
    ax.set_ylabel(f"{metric_label(metric)}, {category_name(group)}" + (f" (n={ns[0]:,})" if len(ns) == 1 else ""),
                  color="#1f77b4")
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(df.k))
    ax.set_xticklabels([str(k) for k in df.k])
    ax.minorticks_off()
    quality_ylim(ax, float(np.nanmax(df.hi.fillna(df.y))) if len(df) else 1.0)
    ax2 = ax.twinx()
    tok_label = "context tokens/QA (no prompt sent)" if df.offline.all() else "prompt + completion tokens/QA"
    (h2,) = ax2.plot(df.k, df.tokens, "s--", color="#d62728", label=tok_label)
    ax2.set_ylabel(tok_label, color="#d62728")
    ax2.set_ylim(0, max(1.0, float(df.tokens.max()) * 1.1) if len(df) else 1.0)
    ax.set_title("Top-k ablation: quality and cost")
    ax.grid(True, alpha=0.3)
    ax.legend(handles=[h1, h2], fontsize=8, loc="lower right")
    fig.tight_layout()
    save_figure(fig, save_to, "topk")
    return fig


#: What `topk_panels` draws per k: (summary column, legend label, line style); the ceiling and the
#: bearing share are reader-independent (`memlab.eval.ceiling`), F1 is what this reader made of it.
TOPK_MEASURES = (("f1", "F1 (official LoCoMo)", "o-"),
                 ("answer_ceiling", "answer ceiling@k (best span of the context)", "^--"),
                 ("answer_bearing", "answer-bearing@k (every gold word in the context)", "s:"),
                 ("context_recall", "evidence Recall@k (the reader's whole context)", "D-."))


def topk_measures(runs: Sequence[Any], groups: Sequence[Any] = ("overall 1-4", "1")) -> pd.DataFrame:
    """One row per (group, k): n, each `TOPK_MEASURES` value with its 95 % interval where the run has one,
    and context tokens/QA; rows in k order. Runs without the ceiling columns (older runs) get NaN there."""
    rows = []
    for r in runs:
        s = summary_of(r)
        for g in keys_of(groups):
            if g not in s.index:
                continue
            row: dict[str, Any] = {"group": g, "label": category_name(g), "k": int(r.config.retrieval.top_k),
                                   "n": int(s.loc[g, "n"]) if "n" in s.columns else None}
            for col, _, _ in TOPK_MEASURES:
                row[col] = float(s.loc[g, col]) if col in s.columns else np.nan
                for end in ("lo", "hi"):
                    c = f"{col}_{end}"
                    row[c] = float(s.loc[g, c]) if c in s.columns else np.nan
            row["context_tokens_qa"] = float(s.loc[g, "context_tokens_qa"]) if "context_tokens_qa" in s.columns \
                else np.nan
            rows.append(row)
    order = {g: i for i, g in enumerate(keys_of(groups))}
    df = pd.DataFrame(rows)
    if not len(df):
        return df
    return df.assign(_o=df.group.map(order)).sort_values(["_o", "k"]).drop(columns="_o").reset_index(drop=True)


def topk_panels(runs: Sequence[Any], groups: Sequence[Any] = ("overall 1-4", "1"),
                save_to: str | Path | None = None) -> Figure:
    """Per k, F1 with its interval next to what retrieval put in front of the reader (answer ceiling with its
    interval, answer-bearing share, evidence recall of the context) and context tokens/QA (right axis,
    dashed grey), one panel per group, so a flat F1 over a rising ceiling reads as a reader limit."""
    df = topk_measures(runs, groups)
    keys = [g for g in keys_of(groups) if g in set(df.group)]
    fig, axes = plt.subplots(1, max(len(keys), 1), figsize=(6.2 * max(len(keys), 1), 4.6), squeeze=False)
    handles: list[Any] = []
    for ax, g in zip(axes[0], keys):
        d = df[df.group == g]
        hs = []
        for i, (col, label, style) in enumerate(TOPK_MEASURES):
            if d[col].isna().all():
                continue
            lo, hi = d[f"{col}_lo"], d[f"{col}_hi"]
            err = np.vstack([(d[col] - lo).clip(lower=0), (hi - d[col]).clip(lower=0)]) \
                if lo.notna().all() and hi.notna().all() else None
            hs.append(ax.errorbar(d.k, d[col], yerr=err, fmt=style, capsize=3, color=ARM_COLORS[i],
                                  label=label + (" (95 % interval)" if err is not None else "")))
        ns = sorted({n for n in d.n if n is not None})
        ax.set_title(f"{category_name(g)}" + (f" (n={ns[0]:,})" if len(ns) == 1 else ""))
        ax.set_xlabel("top-k (memories retrieved)")
        ax.set_ylabel("score / share")
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(d.k))
        ax.set_xticklabels([str(k) for k in d.k])
        ax.minorticks_off()
        ax.set_ylim(0, 1.0)
        ax.grid(True, alpha=0.3)
        ax2 = ax.twinx()
        (ht,) = ax2.plot(d.k, d.context_tokens_qa, "x--", color="#999999", label="context tokens/QA (right axis)")
        ax2.set_ylim(0, max(1.0, float(np.nanmax(df.context_tokens_qa)) * 1.1) if len(df) else 1.0)
        ax2.set_ylabel("context tokens/QA")
        handles = hs + [ht]
    if handles:
        fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.suptitle("Top-k: what retrieval delivered (reader-independent) and what the reader made of it")
    fig.tight_layout(rect=(0, 0.1, 1, 0.95))
    save_figure(fig, save_to, "topk_measures")
    return fig

