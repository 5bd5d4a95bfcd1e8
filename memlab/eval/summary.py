"""Scores over a DataFrame of predictions and the per-category table every report shows."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from memlab.data.locomo import CATEGORY_LABELS
from memlab.eval.bootstrap import N_BOOT, OVERALL_GROUPS, ci_columns
from memlab.eval.scoring import bleu1, evidence_recall, exact_match, score_answer


def score_frame(
    predictions: pd.DataFrame,
    prediction_col: str = "prediction",
    answer_col: str = "answer",
    category_col: str = "category",
) -> pd.DataFrame:
    """Add ``f1``, ``bleu1`` and ``em`` columns (one row per question; input left untouched).

    If the frame carries ``retrieved_ids`` and ``evidence`` list columns, ``evidence_recall`` is added too.
    """
    missing = [c for c in (prediction_col, answer_col, category_col) if c not in predictions.columns]
    if missing:
        raise KeyError(f"score_frame: missing column(s) {missing}; have {list(predictions.columns)}")
    out = predictions.copy()
    preds = out[prediction_col].fillna("").astype(str).tolist()
    answers = [None if (a is None or (isinstance(a, float) and np.isnan(a))) else a for a in out[answer_col]]
    cats = [int(c) for c in out[category_col]]
    out["f1"] = [score_answer(p, a, c) for p, a, c in zip(preds, answers, cats)]
    out["bleu1"] = [bleu1(p, a, c) for p, a, c in zip(preds, answers, cats)]
    out["em"] = [exact_match(p, a, c) for p, a, c in zip(preds, answers, cats)]
    if "retrieved_ids" in out.columns and "evidence" in out.columns:
        out["evidence_recall"] = [
            evidence_recall(r if r is not None else [], e if e is not None else [])
            for r, e in zip(out["retrieved_ids"], out["evidence"])
        ]
    return out


def category_summary(
    scores: pd.DataFrame,
    metrics: Sequence[str] = ("f1", "bleu1", "em"),
    category_col: str = "category",
    labels: Mapping[int, str] | None = None,
    ci: bool = True,
    seed: int = 0,
    n_boot: int = N_BOOT,
    cluster_col: str = "conversation_id",
) -> pd.DataFrame:
    """Per-category means with question counts, then the two question-weighted overall rows.

    The index (``group``) is all strings, so a table round-trips through files unchanged: the
    category number as text (``"1"`` ... ``"5"``) then ``"overall 1-4"`` and ``"overall 1-5"``; the
    ``category`` column holds the number (missing on the overall rows).
    With ``ci`` each metric is followed by ``<metric>_lo`` / ``<metric>_hi``, its 95 % clustered
    bootstrap interval (conversations, then questions within them; ``seed`` fixes the draws), and
    ``f1_mdd`` / ``j_mdd`` are added (see `memlab.eval.stats`). Without a ``cluster_col`` column the
    interval treats questions as independent (a warning says so: too narrow if they are clustered).
    """
    labels = dict(CATEGORY_LABELS if labels is None else labels)
    metrics = [m for m in metrics if m in scores.columns]
    rows = []
    for cat, g in scores.groupby(category_col, sort=True):
        row = {"group": str(int(cat)), "category": int(cat), "label": labels.get(int(cat), str(cat)), "n": len(g)}
        row.update({m: float(pd.to_numeric(g[m], errors="coerce").mean()) for m in metrics})
        rows.append(row)
    for name, cats in OVERALL_GROUPS.items():
        g = scores[scores[category_col].isin(cats)]
        row = {"group": name, "category": None, "label": "", "n": len(g)}
        row.update({m: float(pd.to_numeric(g[m], errors="coerce").mean()) if len(g) else float("nan")
                    for m in metrics})
        rows.append(row)
    out = pd.DataFrame(rows).set_index("group")
    out["category"] = out["category"].astype("Int64")
    if not ci or not metrics:
        return out
    frame = scores
    if cluster_col not in scores.columns:
        warnings.warn(f"category_summary: no {cluster_col!r} column, so the intervals treat questions as "
                      "independent (too narrow when questions of one conversation are correlated)", stacklevel=2)
        frame = scores.assign(**{cluster_col: np.arange(len(scores))})
    bounds = ci_columns(frame, metrics, cluster_col=cluster_col, category_col=category_col, n_boot=n_boot,
                        seed=seed)
    out = out.join(bounds)
    order = ["category", "label", "n"] + [c for m in metrics for c in (m, f"{m}_lo", f"{m}_hi")]
    return out[order + [c for c in out.columns if c not in order]]


def format_summary(summary: pd.DataFrame, digits: int = 3) -> str:
    return summary.to_string(float_format=lambda x: f"{x:.{digits}f}")
