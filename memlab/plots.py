"""Plots (matplotlib): each returns the `Figure` and, with ``save_to``, writes PNG and SVG there.

- `category_bars`: a metric per category, one bar per arm, with 95 % interval error bars;
- `f1_vs_tokens`: per-category F1 against Tokens/QA, one point per arm and category, Pareto fronts;
- `topk_curve`: F1 and tokens against k (a top-k ablation);
- `topk_panels`: per k, F1 beside what retrieval delivered (answer ceiling, answer-bearing, evidence recall of
  the context, context tokens), one panel per group (overall 1-4, multi-hop); `topk_measures` is its table;
- `reconcile_thresholds`: a reconcile sweep's ops, near-duplicates left, recall and F1 per update policy;
- `attribution_bars`: failure labels stacked per category and arm, as shares with their counts;
- `recall_curves`: evidence Recall@k against k per category.

Conventions every plot keeps: error bars from the ``<metric>_lo`` / ``<metric>_hi`` interval columns (taken
from the summary, or bootstrapped from a `Run`'s per-question scores, `memlab.run.report.ci_frame`);
category labels carry their number and n (``1 multi-hop (n=282)``); quality axes start at 0; a legend names
each arm's marker; no text is drawn next to points (labels would overlap); Tokens/QA of an arm that sends no
prompt is its context tokens, and the axis says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, MaxNLocator, NullFormatter
from matplotlib.transforms import ScaledTranslation

from memlab.attribution import LABELS
from memlab.run.report import category_name, ci_frame

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
    """The run's summary with string group keys ("1".."5", "overall 1-4"), whatever the index type on disk."""
    s = run.summary if hasattr(run, "summary") else run
    if not all(isinstance(i, str) for i in s.index):
        s = s.set_axis([str(i) for i in s.index])
    return s


def _keys(categories: Sequence[Any]) -> list[str]:
    return [str(c) for c in categories]


def _color(c: Any) -> str:
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
    s = _summary(run)
    if f"{metric}_lo" in s.columns and f"{metric}_hi" in s.columns:
        return s[f"{metric}_lo"].astype(float), s[f"{metric}_hi"].astype(float)
    if hasattr(run, "predictions") and hasattr(run, "config"):
        ci = ci_frame(run, [metric])
        if f"{metric}_lo" in ci.columns:
            ci = ci.set_axis([str(i) for i in ci.index])
            return ci[f"{metric}_lo"].astype(float), ci[f"{metric}_hi"].astype(float)
    return None


def _yerr(value: float, lo: float | None, hi: float | None) -> np.ndarray | None:
    if lo is None or hi is None or np.isnan(lo) or np.isnan(hi):
        return None
    return np.array([[max(value - lo, 0.0)], [max(hi - value, 0.0)]])


def _group_n(runs: Mapping[str, Any], group: Any) -> str:
    ns = sorted({int(_summary(r).loc[group, "n"]) for r in runs.values() if group in _summary(r).index
                 and "n" in _summary(r).columns})
    if not ns:
        return category_name(group)
    return f"{category_name(group)} (n={'/'.join(f'{n:,}' for n in ns)})"


def _metric_label(metric: str) -> str:
    return {"f1": "F1 (official LoCoMo)", "bleu1": "BLEU-1", "j": "J (LLM judge)", "em": "EM"}.get(metric, metric)


def _quality_ylim(ax: plt.Axes, top: float) -> None:
    """Quality axes start at 0 (never truncated to magnify a difference) and end near 1 or the data."""
    ax.set_ylim(0, 1.0 if not np.isfinite(top) or top > 0.8 else max(0.1, top * 1.15))


def category_bars(runs: Mapping[str, Any], metric: str = "f1",
                  categories: Sequence[Any] = (1, 2, 3, 4, 5, "overall 1-4"), ax: plt.Axes | None = None,
                  save_to: str | Path | None = None) -> Figure:
    """One group of bars per category (its number, label and n), one bar per arm, 95 % interval error bars."""
    arms = list(runs)
    cats = [c for c in _keys(categories) if any(c in _summary(r).index for r in runs.values())]
    fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(figsize=(max(7, 1.3 * len(cats) + 2), 4.8))
    width = 0.8 / max(1, len(arms))
    top = 0.0
    for j, arm in enumerate(arms):
        s = _summary(runs[arm])
        iv = interval(runs[arm], metric)
        xs, ys, errs = [], [], []
        for i, c in enumerate(cats):
            if c not in s.index or metric not in s.columns:
                continue
            v = float(s.loc[c, metric])
            xs.append(i + (j - (len(arms) - 1) / 2) * width)
            ys.append(v)
            e = _yerr(v, *(float(iv[0].loc[c]), float(iv[1].loc[c])) if iv is not None else (None, None))
            errs.append(e if e is not None else np.zeros((2, 1)))
            top = max(top, v if e is None else v + float(e[1, 0]))
        yerr = np.hstack(errs) if errs else None
        ax.bar(xs, ys, width * 0.92, color=ARM_COLORS[j % len(ARM_COLORS)], hatch=HATCHES[j % len(HATCHES)],
               edgecolor="white", label=arm, yerr=yerr if iv is not None else None, capsize=3,
               error_kw={"elinewidth": 1, "ecolor": "#222222"})
    ax.set_xticks(range(len(cats)))
    ax.set_xticklabels([_group_n(runs, c).replace(" (n=", "\n(n=") for c in cats], fontsize=8)
    ax.set_ylabel(_metric_label(metric))
    _quality_ylim(ax, top)
    ax.set_title(f"{_metric_label(metric)} per category (bars: 95 % clustered-bootstrap interval)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, title="arm", title_fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    _save(fig, save_to, f"{metric}_by_category")
    return fig


def _plain_log_ticks(ax: plt.Axes) -> None:
    """Token counts on a log axis as plain numbers at 1-2-5 steps ("200", "1,000"), never "2×10²"."""
    lo, hi = ax.get_xlim()
    steps = (1, 2, 5) if hi / lo > 6 else (1, 1.5, 2, 3, 5, 7)
    ticks = [m * 10.0 ** e for e in range(int(np.floor(np.log10(lo))), int(np.ceil(np.log10(hi))) + 1)
             for m in steps if lo <= m * 10.0 ** e <= hi]
    ax.set_xticks(ticks)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlim(lo, hi)


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
    keys = _keys(categories)
    for ci, c in enumerate(keys):
        # categories of one arm sit at nearly the same tokens: each category is drawn a few points to the side
        # (a display offset: the data, and the tick it sits at, are unchanged) so points and bars stay apart
        dodge = ax.transData + ScaledTranslation((ci - (len(keys) - 1) / 2) * DODGE_PT / 72, 0, fig.dpi_scale_trans)
        pts = []
        for i, arm in enumerate(arms):
            s = _summary(runs[arm])
            if c not in s.index:
                continue
            x, y = float(tokens_per_qa(s).loc[c]), float(s.loc[c, metric])
            if tokens == "total":
                if "build_tokens_qa" not in s:
                    raise ValueError(f"{arm}: its summary has no build_tokens_qa (a run from before build costs "
                                     "were counted); rerun it, or plot tokens='answer'")
                x += float(s.loc[c, "build_tokens_qa"])
            iv = intervals[arm]
            e = _yerr(y, float(iv[0].loc[c]), float(iv[1].loc[c])) if iv is not None else None
            pts.append((x, y))
            ax.update_datalim([(x, y)])  # a display-offset artist does not extend the data limits itself
            ax.errorbar([x], [y], yerr=e, fmt=MARKERS[i % len(MARKERS)], color=_color(c), mfc="white", mew=1.5,
                        ms=7, capsize=3, elinewidth=1, zorder=3 + i * 0.01, transform=dodge)
            top = max(top, y if e is None else y + float(e[1, 0]))
        if pts:
            shown.append(c)
        front = pareto_front(pts)
        if len(front) > 1:
            fronts += 1
            ax.plot([p[0] for p in front], [p[1] for p in front], ls="--", lw=1, color=_color(c), transform=dodge)
    ax.set_xscale("log")
    ax.margins(x=0.07)  # room for the outer categories' side offset
    ax.autoscale_view()
    _plain_log_ticks(ax)
    offline = [not sends_prompt(_summary(r)) for r in runs.values()]
    ax.set_xlabel((CONTEXT_AXIS if all(offline) else TOKENS_AXIS + ("; offline arms: context tokens"
                                                                     if any(offline) else ""))
                  + (" + memory-building tokens/QA" if tokens == "total" else ""))
    ax.set_ylabel(_metric_label(metric))
    _quality_ylim(ax, top)
    ax.set_title("Per-category quality against token cost (bars: 95 % interval; categories drawn side by side)")
    ax.grid(True, alpha=0.3)
    cat_handles = [Line2D([], [], color=_color(c), marker="s", ls="", ms=8,
                          label=_group_n(runs, c)) for c in shown]
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
    _save(fig, save_to, "f1_vs_tokens")
    return fig


def topk_curve(runs: Sequence[Any], group: Any = "overall 1-4", metric: str = "f1",
               save_to: str | Path | None = None) -> Figure:
    """F1 with its interval (left axis) and tokens/QA (right axis) against the retrieval top-k of each run."""
    rows = []
    group = str(group)
    for r in runs:
        s = _summary(r)
        iv = interval(r, metric)
        rows.append({"k": r.config.retrieval.top_k, "y": float(s.loc[group, metric]),
                     "lo": float(iv[0].loc[group]) if iv is not None else np.nan,
                     "hi": float(iv[1].loc[group]) if iv is not None else np.nan,
                     "tokens": float(tokens_per_qa(s).loc[group]), "offline": not sends_prompt(s),
                     "n": int(s.loc[group, "n"]) if "n" in s.columns else None})
    df = pd.DataFrame(rows).sort_values("k")
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    err = np.vstack([(df.y - df.lo).clip(lower=0), (df.hi - df.y).clip(lower=0)]) if df.lo.notna().all() else None
    h1 = ax.errorbar(df.k, df.y, yerr=err, fmt="o-", color="#1f77b4", capsize=3, label=f"{_metric_label(metric)} "
                     "(95 % interval)")
    ax.set_xlabel("top-k (memories retrieved)")
    ns = sorted({n for n in df.n if n is not None})
    ax.set_ylabel(f"{_metric_label(metric)}, {category_name(group)}" + (f" (n={ns[0]:,})" if len(ns) == 1 else ""),
                  color="#1f77b4")
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(df.k))
    ax.set_xticklabels([str(k) for k in df.k])
    ax.minorticks_off()
    _quality_ylim(ax, float(np.nanmax(df.hi.fillna(df.y))) if len(df) else 1.0)
    ax2 = ax.twinx()
    tok_label = "context tokens/QA (no prompt sent)" if df.offline.all() else "prompt + completion tokens/QA"
    (h2,) = ax2.plot(df.k, df.tokens, "s--", color="#d62728", label=tok_label)
    ax2.set_ylabel(tok_label, color="#d62728")
    ax2.set_ylim(0, max(1.0, float(df.tokens.max()) * 1.1) if len(df) else 1.0)
    ax.set_title("Top-k ablation: quality and cost")
    ax.grid(True, alpha=0.3)
    ax.legend(handles=[h1, h2], fontsize=8, loc="lower right")
    fig.tight_layout()
    _save(fig, save_to, "topk")
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
        s = _summary(r)
        for g in _keys(groups):
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
    order = {g: i for i, g in enumerate(_keys(groups))}
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
    keys = [g for g in _keys(groups) if g in set(df.group)]
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
    _save(fig, save_to, "topk_measures")
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
    _save(fig, save_to, "reconcile")
    return fig


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
    _save(fig, save_to, "attribution")
    return fig


def recall_curves(run: Any, ks: Sequence[int] = (1, 5, 10, 20), save_to: str | Path | None = None) -> Figure:
    """Evidence Recall@k against k, one line per category with its interval; k above the run's top-k is not
    drawn (a top-10 run cannot show Recall@20)."""
    s = _summary(run)
    top_k = getattr(getattr(getattr(run, "config", None), "retrieval", None), "top_k", None)
    ks = [k for k in ks if (top_k is None or k <= top_k) and f"recall@{k}" in s.columns]
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    ivs = {k: interval(run, f"recall@{k}") for k in ks}
    for c in [i for i in s.index if i in CATEGORY_COLORS]:  # string keys (see _summary)
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
    _save(fig, save_to, "recall")
    return fig
