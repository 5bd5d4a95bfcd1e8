"""Plots (matplotlib): each returns the `Figure` and, with ``save_to``, writes PNG and SVG there.

- `f1_vs_tokens`: per-category F1 against Tokens/QA, one point per arm and category, Pareto fronts;
- `topk_curve`: F1 and prompt tokens against k (a top-k ablation);
- `attribution_bars`: failure labels stacked per category and arm;
- `recall_curves`: evidence Recall@k against k per category.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from memlab.attribution import LABELS
from memlab.data.locomo import CATEGORY_LABELS

CATEGORY_COLORS = {1: "#1f77b4", 2: "#ff7f0e", 3: "#2ca02c", 4: "#d62728", 5: "#9467bd",
                   "overall 1-4": "#333333", "overall 1-5": "#888888"}
LABEL_COLORS = {"label-issue": "#bbbbbb", "judge-error": "#7f7f7f", "abstain-error": "#9467bd",
                "reconcile-loss": "#8c564b", "write-miss": "#d62728", "retrieval-miss": "#ff7f0e",
                "partial-retrieval": "#ffbb78", "reading-miss": "#1f77b4"}


def _save(fig: Figure, save_to: str | Path | None, name: str) -> None:
    if save_to is None:
        return
    d = Path(save_to)
    if (d / "config.yaml").is_file():  # a run folder: plots/ inside it
        d = d / "plots"
    d.mkdir(parents=True, exist_ok=True)
    fig.savefig(d / f"{name}.png", dpi=120, bbox_inches="tight")
    fig.savefig(d / f"{name}.svg", bbox_inches="tight")


def _summary(run: Any) -> pd.DataFrame:
    return run.summary if hasattr(run, "summary") else run


def tokens_per_qa(summary: pd.DataFrame) -> pd.Series:
    """Tokens/QA: the provider's prompt + completion tokens; for offline arms (no model call), the
    reader's context tokens a model would have been sent (counted offline)."""
    t = summary["tokens_qa"].astype(float)
    return t.where(t > 0, summary["context_tokens_qa"].astype(float))


def pareto_front(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points not dominated by another (fewer or equal tokens and higher or equal F1), by tokens."""
    front: list[tuple[float, float]] = []
    for x, y in sorted(points, key=lambda p: (p[0], -p[1])):
        if not front or y > front[-1][1]:
            front.append((x, y))
    return front


def f1_vs_tokens(runs: Mapping[str, Any], categories: Sequence[Any] = (1, 2, 3, 4, 5, "overall 1-4"),
                 metric: str = "f1", ax: plt.Axes | None = None, save_to: str | Path | None = None) -> Figure:
    """One point per (arm, category): x Tokens/QA (log), y F1; dashed Pareto front per category."""
    fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(figsize=(8, 5.5))
    markers = "osD^vP*X"
    for c in categories:
        pts = []
        for i, (arm, run) in enumerate(runs.items()):
            s = _summary(run)
            if c not in s.index:
                continue
            x, y = float(tokens_per_qa(s).loc[c]), float(s.loc[c, metric])
            pts.append((x, y))
            label = f"{CATEGORY_LABELS.get(c, c)}" if i == 0 else None
            ax.scatter([x], [y], color=CATEGORY_COLORS.get(c, "k"), marker=markers[i % len(markers)], s=55,
                       label=label, zorder=3)
            ax.annotate(arm, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
        front = pareto_front(pts)
        if len(front) > 1:
            ax.plot([p[0] for p in front], [p[1] for p in front], ls="--", lw=1, color=CATEGORY_COLORS.get(c, "k"))
    ax.set_xscale("log")
    ax.set_xlabel("Tokens/QA (provider usage; offline arms: reader context tokens)")
    ax.set_ylabel(metric.upper() if metric != "f1" else "F1 (official LoCoMo)")
    ax.set_title("Per-category quality against token cost")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, title="category (marker = arm)", title_fontsize=8)
    _save(fig, save_to, "f1_vs_tokens")
    return fig


def topk_curve(runs: Sequence[Any], group: Any = "overall 1-4", save_to: str | Path | None = None) -> Figure:
    """F1 (left axis) and prompt tokens/QA (right axis) against the retrieval top-k of each run."""
    rows = []
    for r in runs:
        s = _summary(r)
        rows.append({"k": r.config.retrieval.top_k, "f1": float(s.loc[group, "f1"]),
                     "tokens": float(tokens_per_qa(s).loc[group]),
                     "recall": float(s.loc[group, "recall@10"]) if "recall@10" in s else float("nan")})
    df = pd.DataFrame(rows).sort_values("k")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(df.k, df.f1, "o-", color="#1f77b4", label="F1")
    ax.set_xlabel("top-k")
    ax.set_ylabel(f"F1 ({group})", color="#1f77b4")
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(df.k))
    ax.set_xticklabels([str(k) for k in df.k])
    ax2 = ax.twinx()
    ax2.plot(df.k, df.tokens, "s--", color="#d62728", label="tokens/QA")
    ax2.set_ylabel("prompt tokens/QA", color="#d62728")
    ax.set_title("Top-k ablation: quality and cost")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    _save(fig, save_to, "topk")
    return fig


def attribution_bars(attributions: Mapping[str, pd.DataFrame], save_to: str | Path | None = None) -> Figure:
    """Stacked failure labels: one bar per (category, arm)."""
    cats = sorted({int(c) for att in attributions.values() for c in att["category"]})
    arms = list(attributions)
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(cats) * len(arms)), 4.8))
    width = 0.8 / max(1, len(arms))
    for j, arm in enumerate(arms):
        att = attributions[arm]
        counts = att.groupby(["category", "label"]).size().unstack(fill_value=0).reindex(
            index=cats, columns=list(LABELS), fill_value=0)
        bottom = [0] * len(cats)
        xs = [i + (j - (len(arms) - 1) / 2) * width for i in range(len(cats))]
        for lab in LABELS:
            vals = counts[lab].tolist()
            ax.bar(xs, vals, width * 0.95, bottom=bottom, color=LABEL_COLORS[lab],
                   label=lab if j == 0 else None, edgecolor="white", linewidth=0.5)
            bottom = [b + v for b, v in zip(bottom, vals)]
        for x, total in zip(xs, bottom):
            ax.text(x, total, arm, ha="center", va="bottom", fontsize=7, rotation=90)
    ax.set_xticks(range(len(cats)))
    ax.set_xticklabels([f"{c} {CATEGORY_LABELS.get(c, '')}" for c in cats])
    ax.set_ylabel("failed questions")
    ax.set_title("Why answers failed, per category and arm")
    ax.legend(fontsize=8)
    fig.tight_layout()
    _save(fig, save_to, "attribution")
    return fig


def recall_curves(run: Any, ks: Sequence[int] = (1, 5, 10, 20), save_to: str | Path | None = None) -> Figure:
    """Evidence Recall@k against k, one line per category (from a run's summary)."""
    s = _summary(run)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for c in [i for i in s.index if i in CATEGORY_COLORS]:
        ys = [float(s.loc[c, f"recall@{k}"]) for k in ks]
        ax.plot(list(ks), ys, "o-", color=CATEGORY_COLORS[c], label=f"{c} {CATEGORY_LABELS.get(c, '')}".strip())
    ax.set_xlabel("k")
    ax.set_ylabel("evidence Recall@k")
    ax.set_ylim(0, 1)
    ax.set_title("Evidence recall by category")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, save_to, "recall")
    return fig
