"""LongMemEval's own tables for a run: accuracy per question type and the official retrieval metrics.

*Accuracy per type* follows ``print_qa_metrics``: every question counts in its published type (an
abstention question too), plus an ``abstention`` row and ``overall``; J (the judge's yes/no) is the
official metric, F1 / EM are memlab's offline stand-ins and labelled so. Each row has its 95 % interval
(a bootstrap over questions: every question has its own haystack, so questions are the clusters).

*Retrieval* (``src/retrieval/eval_utils.py``), abstention questions skipped, from the first query's full
ranking (the trace-only search to depth 100, `memlab.answer.base.evidence_ranks`):

- turn level: the ranking's turns in order of their first memory; relevant = the ``has_answer`` turns;
- session level: sessions in order of their first retrieved turn; relevant = ``answer_session_ids``
  (LongMemEval's session-granularity metric; its turn-to-session variant also counts a session once
  per retrieved turn in NDCG, which a memory ranking has no equivalent for);
- ``recall_all@k`` = 1 when every relevant item is in the top k; ``ndcg_any@k`` = DCG of the top k over
  the ideal DCG, with the official discount (rank 1 and 2 weigh 1, rank r > 1 weighs 1 / log2(r)).

Each is shown next to memlab's evidence Recall@k (the share of evidence turns among the first query's
top-k memories), per category and overall.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from memlab.data.locomo import LoCoMo
from memlab.data.longmemeval import ABSTENTION, LONGMEMEVAL_LABELS, QUESTION_TYPES, LongMemEval
from memlab.eval.bootstrap import N_BOOT, cluster_bootstrap, percentile_ci
from memlab.eval.summary import category_summary

TURN_KS = (5, 10, 50)
SESSION_KS = (5, 10)
NOT_OFFICIAL = "not the official metric"


def dcg(relevances: Sequence[float], k: int) -> float:
    """LongMemEval's DCG@k: the first relevance plus each later one over log2 of its rank."""
    r = list(relevances)[:k]
    return float(r[0] + sum(v / math.log2(i) for i, v in enumerate(r[1:], start=2))) if r else 0.0


def ndcg_any(ranked: Sequence[str], relevant: set[str], k: int) -> float:
    """Binary-relevance NDCG@k; the ideal ranking puts every relevant item first."""
    ideal = dcg([1.0] * min(len(relevant), k), k)
    if ideal == 0:
        return 0.0
    return dcg([1.0 if d in relevant else 0.0 for d in ranked[:k]], k) / ideal


def recall_all(ranked: Sequence[str], relevant: set[str], k: int) -> float:
    return float(relevant <= set(ranked[:k]))


def turn_ranking(ranked_sources: Iterable[Sequence[str]]) -> list[str]:
    """Distinct turn ids in the order of the first memory citing each."""
    return list(dict.fromkeys(s for srcs in ranked_sources for s in srcs))


def session_ranking(turns: Sequence[str]) -> list[str]:
    """Distinct sessions (``S3`` of ``S3:7``) in the order of their first turn."""
    return list(dict.fromkeys(t.split(":")[0] for t in turns))


def question_retrieval(ranked_sources: Iterable[Sequence[str]], evidence: Sequence[str],
                       answer_sessions: Sequence[int]) -> dict[str, float]:
    """Official turn- and session-level metrics of one question (NaN where it has nothing relevant)."""
    turns = turn_ranking(ranked_sources)
    sessions = session_ranking(turns)
    rel_t, rel_s = set(evidence), {f"S{i}" for i in answer_sessions}
    out: dict[str, float] = {}
    for level, ranked, rel, ks in (("turn", turns, rel_t, TURN_KS), ("session", sessions, rel_s, SESSION_KS)):
        for k in ks:
            out[f"{level}_recall_all@{k}"] = recall_all(ranked, rel, k) if rel else math.nan
            out[f"{level}_ndcg_any@{k}"] = ndcg_any(ranked, rel, k) if rel else math.nan
    out["ranking_depth"] = float(len(turns))
    return out


def retrieval_frame(retrieval_rows: Iterable[Mapping[str, Any]], data: LoCoMo) -> pd.DataFrame:
    """One row per traced question (abstention questions skipped): its category and the official metrics.

    ``retrieval_rows`` are the run's retrieval trace records (``traces/retrieval.jsonl``); the first
    query's ``ranked_sources`` is read, else its hits (only the reader's top k deep)."""
    qs = {q.qid: q for q in data.questions}
    rows = []
    for r in retrieval_rows:
        q = qs.get(r["qid"])
        if q is None or getattr(q, "abstention", False) or not r.get("queries"):
            continue
        first = r["queries"][0] or {}
        ranked = first.get("ranked_sources")
        if ranked is None:
            ranked = [h.get("source_ids", []) for h in first.get("hits", [])]
        rows.append({"qid": q.qid, "conversation_id": q.conversation_id, "category": q.category,
                     **question_retrieval(ranked, q.evidence_ids, getattr(q, "answer_sessions", ()))})
    return pd.DataFrame(rows)


def retrieval_table(retrieval: pd.DataFrame, predictions: pd.DataFrame | None = None, seed: int = 0,
                    n_boot: int = N_BOOT) -> pd.DataFrame:
    """Per category and overall: the official metrics next to memlab's evidence Recall@5/@10, with 95 % CIs."""
    frame = retrieval
    if predictions is not None:
        cols = [c for c in ("recall@5", "recall@10") if c in predictions.columns]
        frame = frame.merge(predictions[["qid", *cols]], on="qid", how="left")
    metrics = [c for c in frame.columns if "@" in c]
    out = category_summary(frame, metrics=metrics, labels=LONGMEMEVAL_LABELS, seed=seed, n_boot=n_boot)
    return out.drop(index=[g for g in ("overall 1-5",) if g in out.index]).rename(index={"overall 1-4": "overall"})


def differs_from_j(pred: pd.DataFrame, col: str) -> bool:
    """Whether a J column under another verdict rule (``j_official``, ``j_strict``) differs from the run's J on any
    question (NaN against a number counts: one rule could read a reply the other could not)."""
    if col not in pred.columns or "j" not in pred.columns:
        return False
    a, b = pd.to_numeric(pred[col], errors="coerce"), pd.to_numeric(pred["j"], errors="coerce")
    return bool(((a != b) & ~(a.isna() & b.isna())).any())


def type_accuracy(predictions: pd.DataFrame, data: LoCoMo,
                  metrics: Sequence[str] = ("j", "j_strict", "j_official", "f1", "em"), seed: int = 0,
                  n_boot: int = N_BOOT) -> pd.DataFrame:
    """Mean of each metric per published type (abstention questions in their type), then ``abstention``
    and ``overall``, each with ``<metric>_lo`` / ``_hi``; F1 and EM columns are renamed to say they are
    not the official metric. Errored or unscored questions drop out (NaN). J under the other verdict rule
    (``j_official`` / ``j_strict``, `memlab.eval.profiles.judge_rule_columns`) is shown where it differs from J."""
    qs = {q.qid: q for q in data.questions}
    pred = predictions[predictions["qid"].isin(qs)].copy()
    if "scored" in pred.columns:
        for m in metrics:
            if m in pred.columns:
                pred.loc[~pred["scored"].astype(bool), m] = np.nan
    pred["question_type"] = [qs[q].question_type for q in pred["qid"]]  # type: ignore[attr-defined]
    pred["abstention"] = [qs[q].category == ABSTENTION for q in pred["qid"]]
    metrics = [m for m in metrics if m in pred.columns and pd.to_numeric(pred[m], errors="coerce").notna().any()
               and (not m.startswith("j_") or differs_from_j(pred, m))]
    groups = [(t, pred[pred.question_type == t]) for t in QUESTION_TYPES]
    groups += [("abstention", pred[pred.abstention]), ("overall", pred)]
    rows = []
    for name, g in groups:
        if not len(g):
            continue
        row: dict[str, Any] = {"group": name, "n": len(g)}
        for m in metrics:
            vals = pd.to_numeric(g[m], errors="coerce").to_numpy(dtype=float)
            if np.isnan(vals).all():
                row[m], row[f"{m}_lo"], row[f"{m}_hi"] = math.nan, math.nan, math.nan
                continue
            lo, hi = percentile_ci(cluster_bootstrap(vals, g["qid"].tolist(), n_boot=n_boot, seed=seed))
            row[m], row[f"{m}_lo"], row[f"{m}_hi"] = float(np.nanmean(vals)), float(lo), float(hi)
        rows.append(row)
    out = pd.DataFrame(rows).set_index("group")
    rename = {}
    for m in ("f1", "em", "bleu1"):
        for suffix in ("", "_lo", "_hi"):
            if f"{m}{suffix}" in out.columns:
                rename[f"{m}{suffix}"] = f"{m}{suffix} ({NOT_OFFICIAL})"
    return out.rename(columns=rename)


def report(run_dir: str | Path, data: LoCoMo | None = None, seed: int = 0) -> dict[str, pd.DataFrame]:
    """Both tables for a finished run folder: ``{"accuracy": ..., "retrieval": ...}``."""
    d = Path(run_dir)
    info = json.loads((d / "run.json").read_text()) if (d / "run.json").is_file() else {}
    if data is None:
        from memlab.data import load_dataset

        data = load_dataset(info.get("dataset"))
    if not isinstance(data, LongMemEval):
        raise ValueError(f"{d}: the run's dataset {data.report.path} is not a LongMemEval file")
    pred = pd.read_parquet(d / "predictions.parquet").reset_index()
    rows = [json.loads(x) for x in open(d / "traces" / "retrieval.jsonl", encoding="utf-8") if x.strip()]
    retr = retrieval_frame(rows, data)
    return {"accuracy": type_accuracy(pred, data, seed=seed),
            "retrieval": retrieval_table(retr, pred, seed=seed) if len(retr) else pd.DataFrame()}


def format_table(table: pd.DataFrame, digits: int = 3) -> str:
    """A table with each metric as ``mean [lo, hi]`` (n and labels kept), for printing."""
    out = pd.DataFrame(index=table.index)
    for c in ("label", "n"):
        if c in table.columns:
            out[c] = table[c]
    for c in table.columns:
        if c.endswith(("_lo", "_hi")) or "_lo (" in c or "_hi (" in c or c in ("label", "n", "category"):
            continue
        lo = f"{c}_lo" if f"{c}_lo" in table.columns else c.replace(" (", "_lo (", 1)
        hi = f"{c}_hi" if f"{c}_hi" in table.columns else c.replace(" (", "_hi (", 1)
        if lo in table.columns and hi in table.columns:
            out[c] = [f"{m:.{digits}f} [{a:.{digits}f}, {b:.{digits}f}]" if not math.isnan(m) else "-"
                         for m, a, b in zip(table[c], table[lo], table[hi])]
        else:
            out[c] = table[c]
    return out.to_string()


if __name__ == "__main__":  # python -m memlab.eval.longmemeval_tables RUN_DIR
    import sys

    tables = report(sys.argv[1])
    print("accuracy per type (J is the official metric):")
    print(format_table(tables["accuracy"]))
    print("\nretrieval, official definitions (abstention questions skipped), next to memlab's Recall@k:")
    print(format_table(tables["retrieval"]))
