"""Evidence Recall@k of the retrieval modes over a LoCoMo memory set (the retrieval benchmark's engine)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from memlab.data import load_locomo
from memlab.eval.scoring import evidence_recall
from memlab.eval.summary import OVERALL_GROUPS
from memlab.extract.memory_sets import observation_memories, turn_memories
from memlab.extract.pipeline import conversation_key
from memlab.index import open_service
from memlab.memory import SearchOptions

#: mode -> (keyword scorer of the index, SearchOptions overrides)
MODES: dict[str, tuple[str, dict]] = {
    "dense": ("tfidf", {"hybrid": False}),
    "tfidf": ("tfidf", {"keyword_only": True}),
    "bm25": ("bm25", {"keyword_only": True}),
    "hybrid": ("tfidf", {"hybrid": True}),
    "hybrid-bm25": ("bm25", {"hybrid": True}),
    "hybrid+who": ("tfidf", {"hybrid": True, "participant_boost": True}),
    "hybrid-bm25+who": ("bm25", {"hybrid": True, "participant_boost": True}),
    "hybrid-bm25+who+prf": ("bm25", {"hybrid": True, "participant_boost": True, "feedback": 3}),
    "hybrid+prf": ("tfidf", {"hybrid": True, "feedback": 3}),
}


def memory_set(conv, memory: str, style: str) -> list[dict]:
    if memory == "turns":
        return turn_memories(conv, style)
    if memory == "observations":
        return observation_memories(conv)
    if memory == "turns+observations":
        return turn_memories(conv, style) + observation_memories(conv)
    raise ValueError(f"memory: expected turns, observations or turns+observations, got {memory!r}")


def run_recall(
    path: str | None = None,
    memory: str = "turns",
    style: str = "speaker-context",
    embedder: str = "tfidf-lsa",
    modes: Sequence[str] = ("dense", "tfidf", "bm25", "hybrid"),
    ks: Sequence[int] = (1, 5, 10, 20),
    dedupe: bool = False,
    conversations: Sequence[str] | None = None,
    rrf_k: int = 60,
    date_in_text: bool = True,
) -> pd.DataFrame:
    """One row per (question, mode) with ``recall@k`` columns (NaN where a question has no evidence)."""
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise ValueError(f"modes: unknown {bad}; expected some of {sorted(MODES)}")
    data = load_locomo(path)
    kmax = max(ks)
    services = {kw: open_service("memory", embedder=embedder, keyword=kw, date_in_text=date_in_text)
                for kw in {MODES[m][0] for m in modes}}
    rows = []
    convs = [c for c in data if conversations is None or c.sample_id in conversations]
    for conv in tqdm(convs, desc=f"recall {memory}", leave=False):
        key = conversation_key(conv)
        items = memory_set(conv, memory, style)
        for svc in services.values():
            for it in items:
                svc.add(key, **it)
        for q in conv.questions:
            for mode in modes:
                kw, over = MODES[mode]
                opts = SearchOptions(query=q.question, max_results=kmax, dedupe=dedupe, kind_fallback=False,
                                     rrf_k=rrf_k, **over)
                res = services[kw].search(key, opts)
                row = {"qid": q.qid, "category": q.category, "mode": mode}
                for k in ks:
                    got = [s for h in res.hits[:k] for s in h.entry.source_ids]
                    row[f"recall@{k}"] = evidence_recall(got, q.evidence_ids)
                rows.append(row)
    return pd.DataFrame(rows)


def recall_table(per_question: pd.DataFrame, ks: Sequence[int] = (1, 5, 10, 20)) -> pd.DataFrame:
    """Mean Recall@k per (mode, category) plus the two overall rows, with question counts."""
    cols = [f"recall@{k}" for k in ks]
    out = []
    for mode, g in per_question.groupby("mode", sort=False):
        g = g.dropna(subset=cols)
        for cat, gc in g.groupby("category"):
            out.append({"mode": mode, "group": str(cat), "n": len(gc), **{c: gc[c].mean() for c in cols}})
        for name, cats in OVERALL_GROUPS.items():
            gc = g[g.category.isin(cats)]
            out.append({"mode": mode, "group": name, "n": len(gc),
                        **{c: gc[c].mean() if len(gc) else np.nan for c in cols}})
    return pd.DataFrame(out).set_index(["mode", "group"])
