"""What every plot shares: colours, markers and axis labels, a run's summary with string group keys, its
95 % intervals, and where a figure is saved (`memlab.plots` states the conventions)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator, NullFormatter

from memlab.run.labels import category_name
from memlab.run.report import ci_frame

CATEGORY_COLORS = {"1": "#1f77b4", "2": "#ff7f0e", "3": "#2ca02c", "4": "#d62728", "5": "#9467bd",
                   "overall 1-4": "#333333", "overall 1-5": "#888888"}
LABEL_COLORS = {"label-issue": "#bbbbbb", "judge-error": "#7f7f7f", "abstain-error": "#9467bd",
                "reconcile-loss": "#8c564b", "write-miss": "#d62728", "retrieval-miss": "#ff7f0e",
                "partial-retrieval": "#ffbb78", "reading-miss": "#1f77b4"}
MARKERS = "osD^vP*X"
ARM_COLORS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c")
HATCHES = ("", "//", "..", "xx", "\\\\", "++", "oo", "--")
TOKENS_AXIS = "Tokens/QA (provider prompt + completion)"
DODGE_PT = 7.0  # f1_vs_tokens: horizontal display offset between categories, in points
CONTEXT_AXIS = "context tokens/QA (no prompt sent: the retrieved context a model would read)"


def save_figure(fig: Figure, save_to: str | Path | None, name: str) -> None:
    """PNG and SVG of ``fig`` as ``name`` in ``save_to`` (a run folder: its ``plots/``); None saves nothing."""
    if save_to is None:
        return
    d = Path(save_to)
    if (d / "config.yaml").is_file():  # a run folder: plots/ inside it
        d = d / "plots"
    d.mkdir(parents=True, exist_ok=True)
    fig.savefig(d / f"{name}.png", dpi=120, bbox_inches="tight")
    fig.savefig(d / f"{name}.svg", bbox_inches="tight")


def summary_of(run: Any) -> pd.DataFrame:
    """The run's summary with string group keys ("1".."5", "overall 1-4"), whatever the index type on disk."""
    s = run.summary if hasattr(run, "summary") else run
    if not all(isinstance(i, str) for i in s.index):
        s = s.set_axis([str(i) for i in s.index])
    return s


def keys_of(categories: Sequence[Any]) -> list[str]:
    """Category keys as the summary index spells them (`summary_of`)."""
    return [str(c) for c in categories]


def category_color(c: Any) -> str:
    """The colour of a category (black for a group without one)."""
    return CATEGORY_COLORS.get(str(c), "k")


def tokens_per_qa(summary: pd.DataFrame) -> pd.Series:
    """Tokens/QA: the provider's prompt + completion tokens; for offline arms (no model call), the
    reader's context tokens a model would have been sent (counted offline)."""
    t = summary["answer_tokens_qa"].astype(float)
    return t.where(t > 0, summary["context_tokens_qa"].astype(float))


def sends_prompt(summary: pd.DataFrame) -> bool:
    """Whether the arm sent any prompt to a model (else its token figure is context tokens)."""
    return bool((summary["answer_tokens_qa"].astype(float) > 0).any())


def interval(run: Any, metric: str) -> tuple[pd.Series, pd.Series] | None:
    """(lo, hi) of a metric per summary group: the summary's columns, else bootstrapped from a `Run`."""
    s = summary_of(run)
    if f"{metric}_lo" in s.columns and f"{metric}_hi" in s.columns:
        return s[f"{metric}_lo"].astype(float), s[f"{metric}_hi"].astype(float)
    if hasattr(run, "predictions") and hasattr(run, "config"):
        ci = ci_frame(run, [metric])
        if f"{metric}_lo" in ci.columns:
            ci = ci.set_axis([str(i) for i in ci.index])
            return ci[f"{metric}_lo"].astype(float), ci[f"{metric}_hi"].astype(float)
    return None


def error_span(value: float, lo: float | None, hi: float | None) -> np.ndarray | None:
    """Matplotlib's 2 x 1 ``yerr`` for one value and its interval; None when a bound is missing."""
    if lo is None or hi is None or np.isnan(lo) or np.isnan(hi):
        return None
    return np.array([[max(value - lo, 0.0)], [max(hi - value, 0.0)]])


def group_label(runs: Mapping[str, Any], group: Any) -> str:
    """A category's name with every arm's n (``1 multi-hop (n=282)``; differing n joined by ``/``)."""
    ns = sorted({int(summary_of(r).loc[group, "n"]) for r in runs.values() if group in summary_of(r).index
                 and "n" in summary_of(r).columns})
    if not ns:
        return category_name(group)
    return f"{category_name(group)} (n={'/'.join(f'{n:,}' for n in ns)})"


def metric_label(metric: str) -> str:
    """The axis name of a metric."""
    return {"f1": "F1 (official LoCoMo)", "bleu1": "BLEU-1", "j": "J (LLM judge)", "em": "EM"}.get(metric, metric)


def quality_ylim(ax: plt.Axes, top: float) -> None:
    """Quality axes start at 0 (never truncated to magnify a difference) and end near 1 or the data."""
    ax.set_ylim(0, 1.0 if not np.isfinite(top) or top > 0.8 else max(0.1, top * 1.15))


def plain_log_ticks(ax: plt.Axes) -> None:
    """Token counts on a log axis as plain numbers at 1-2-5 steps ("200", "1,000"), never "2×10²"."""
    lo, hi = ax.get_xlim()
    steps = (1, 2, 5) if hi / lo > 6 else (1, 1.5, 2, 3, 5, 7)
    ticks = [m * 10.0 ** e for e in range(int(np.floor(np.log10(lo))), int(np.ceil(np.log10(hi))) + 1)
             for m in steps if lo <= m * 10.0 ** e <= hi]
    if len(ticks) < 2:  # a narrow range (a token-matched comparison: every arm near one budget): even steps
        ticks = [t for t in MaxNLocator(4).tick_values(lo, hi) if lo <= t <= hi]
    ax.set_xticks(ticks)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlim(lo, hi)

