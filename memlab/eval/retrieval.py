"""Evidence Recall@k of retrieval arms over a LoCoMo memory set (the retrieval benchmark's engine).

An *arm* is one retrieval configuration: the memory set indexed, the index (embedder, keyword scorer,
observation-aware text) and the search options. `run_arms` answers every question with every arm
through the production search path (`MemoryService.search`), timing each search, so arms are compared
side by side in one process. `recall_table` reports the mean Recall@k per category and over categories
1-4 and 1-5 with a bootstrap CI clustered by conversation (questions of one conversation share its
memories, so they are not independent). `cross_validate` picks an arm per fold on the other folds'
conversations and reports only held-out rows: no figure is ever computed on the data it was tuned on.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from memlab.data import load_locomo
from memlab.eval.bootstrap import cluster_bootstrap, percentile_ci
from memlab.eval.scoring import evidence_recall
from memlab.eval.summary import OVERALL_GROUPS
from memlab.extract.memory_sets import observation_memories, turn_memories
from memlab.extract.pipeline import conversation_key
from memlab.index import open_service
from memlab.memory import PreparesQueries, Searcher, SearchOptions, TimesQueryEncoding
from memlab.progress import progress_bar

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

MEMORY_SETS = ("turns", "observations", "turns+observations")


@dataclass(frozen=True)
class Arm:
    """One retrieval configuration: what is indexed, the index and the search options (minus query and k).

    ``index`` is the run's own index language: `memlab.index.open_service` keywords, exactly what a config's
    ``IndexConfig.hybrid_params()`` gives (a key not given keeps its default); or ``searcher`` makes the
    arm's own `memlab.memory.Searcher` (a class or factory: one fresh searcher per arm) in place of it."""

    memory: str = "turns"
    index: Mapping[str, Any] = field(default_factory=dict)
    search: Mapping[str, Any] = field(default_factory=dict)
    searcher: Callable[[], Searcher] | None = None

    def index_key(self) -> Any:
        if self.searcher is not None:
            return (self.memory, self.searcher)
        return (self.memory, json.dumps(dict(self.index), sort_keys=True, default=str))


def memory_set(conv, memory: str, style: str) -> list[dict]:
    if memory == "turns":
        return turn_memories(conv, style)
    if memory == "observations":
        return observation_memories(conv)
    if memory == "turns+observations":
        return turn_memories(conv, style) + observation_memories(conv)
    raise ValueError(f"memory: expected one of {', '.join(MEMORY_SETS)}, got {memory!r}")


def run_arms(
    arms: Mapping[str, Arm],
    path: str | None = None,
    style: str = "speaker-context",
    ks: Sequence[int] = (1, 5, 10, 20),
    conversations: Sequence[str] | None = None,
    embedding_cache: str | None = None,
) -> pd.DataFrame:
    """One row per (question, arm): ``recall@k`` columns (NaN without usable evidence) and ``ms`` (search time)."""
    if not arms:
        raise ValueError("run_arms: no arms given")
    for name, arm in arms.items():
        if arm.memory not in MEMORY_SETS:
            raise ValueError(f"arm {name!r}: memory = {arm.memory!r}; expected one of {', '.join(MEMORY_SETS)}")
    data = load_locomo(path)
    kmax = max(ks)
    services = {}
    for arm in arms.values():
        if arm.index_key() not in services:
            services[arm.index_key()] = open_service(
                "memory", **arm.index, embedding_cache=embedding_cache,
                searcher=None if arm.searcher is None else arm.searcher())
    rows = []
    encode_ms: dict[tuple, float] = {}
    convs = [c for c in data if conversations is None or c.sample_id in conversations]
    for conv in progress_bar(convs, desc="recall", leave=False):
        key = conversation_key(conv)
        for ikey, svc in services.items():
            for it in memory_set(conv, ikey[0], style):
                svc.add(key, **it)
            load = lambda s=svc, k=key: s.list(k)  # noqa: E731
            svc.searcher.ensure_built(key, load)  # build time is not search time
            # queries are encoded ahead where the searcher can (`PreparesQueries`), so ``ms`` is the search itself;
            # the encoding cost per query (batched, cache bypassed) is timed apart as ``encode_ms`` where it says it
            # (`TimesQueryEncoding`: a `HybridIndex`)
            qs = [q.question for q in conv.questions]
            if isinstance(svc.searcher, PreparesQueries):
                svc.searcher.prepare_queries(key, qs, load)
            encode_ms[ikey] = svc.searcher.encode_ms(key, qs, load) \
                if isinstance(svc.searcher, TimesQueryEncoding) else float("nan")
        for q in conv.questions:
            for name, arm in arms.items():
                opts = SearchOptions(query=q.question, max_results=kmax, kind_fallback=False,
                                     **{"dedupe": False, **arm.search})
                t0 = time.perf_counter()
                res = services[arm.index_key()].search(key, opts)
                ms = 1000 * (time.perf_counter() - t0)
                row = {"qid": q.qid, "conversation": conv.sample_id, "category": q.category, "mode": name,
                       "ms": ms, "encode_ms": encode_ms[arm.index_key()]}
                for k in ks:
                    got = [s for h in res.hits[:k] for s in h.entry.source_ids]
                    row[f"recall@{k}"] = evidence_recall(got, q.evidence_ids)
                rows.append(row)
    return pd.DataFrame(rows)


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
    embedding_cache: str | None = None,
) -> pd.DataFrame:
    """`run_arms` over the named `MODES` on one memory set and embedder."""
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise ValueError(f"modes: unknown {bad}; expected some of {sorted(MODES)}")
    arms = {m: Arm(memory=memory, index={"embedder": embedder, "keyword": MODES[m][0], "date_in_text": date_in_text},
                   search={**MODES[m][1], "dedupe": dedupe, "rrf_k": rrf_k}) for m in modes}
    return run_arms(arms, path, style=style, ks=ks, conversations=conversations, embedding_cache=embedding_cache)


def cluster_bootstrap_ci(values: pd.Series, clusters: pd.Series, n_boot: int = 2000, level: float = 0.95,
                         seed: int = 0) -> tuple[float, float]:
    """Percentile CI of the mean, resampling whole clusters (conversations) with replacement: the one clustered
    bootstrap (`memlab.eval.bootstrap`), over the questions that have a value, clusters numbered in sorted order."""
    v = np.asarray(values, dtype=float)
    c = np.asarray(clusters)
    ok = ~np.isnan(v)
    v, c = v[ok], c[ok]
    if len(v) == 0:
        return (np.nan, np.nan)
    order = np.argsort(c, kind="stable")
    lo, hi = percentile_ci(cluster_bootstrap(v[order], list(c[order]), n_boot=n_boot, seed=seed, inner=False), level)
    return float(lo), float(hi)


def recall_table(per_question: pd.DataFrame, ks: Sequence[int] = (1, 5, 10, 20), ci_k: int | None = 10,
                 n_boot: int = 2000) -> pd.DataFrame:
    """Mean Recall@k per (mode, category) plus the two overall rows, with question counts, the search
    time p50 (ms) and a 95 % bootstrap CI of Recall@``ci_k`` clustered by conversation."""
    cols = [f"recall@{k}" for k in ks]
    out = []
    for mode, g in per_question.groupby("mode", sort=False):
        g = g.dropna(subset=cols)
        groups = [(str(cat), gc) for cat, gc in g.groupby("category")]
        groups += [(name, g[g.category.isin(cats)]) for name, cats in OVERALL_GROUPS.items()]
        for name, gc in groups:
            row = {"mode": mode, "group": name, "n": len(gc),
                   **{c: gc[c].mean() if len(gc) else np.nan for c in cols}}
            if ci_k is not None and f"recall@{ci_k}" in gc and "conversation" in gc:
                lo, hi = cluster_bootstrap_ci(gc[f"recall@{ci_k}"], gc["conversation"], n_boot=n_boot)
                row[f"ci{ci_k}_lo"], row[f"ci{ci_k}_hi"] = lo, hi
            if "ms" in gc:
                row["ms_p50"] = float(gc["ms"].median()) if len(gc) else np.nan
            if "encode_ms" in gc:
                row["encode_ms"] = float(gc["encode_ms"].mean()) if len(gc) else np.nan
            out.append(row)
    return pd.DataFrame(out).set_index(["mode", "group"])


def conversation_folds(conversations: Sequence[str], n_folds: int) -> list[list[str]]:
    """Conversations dealt round-robin (in sorted order) into ``n_folds`` folds."""
    convs = sorted(set(conversations))
    if not 2 <= n_folds <= len(convs):
        raise ValueError(f"n_folds: expected 2..{len(convs)} (the number of conversations), got {n_folds}")
    return [convs[i::n_folds] for i in range(n_folds)]


def cross_validate(per_question: pd.DataFrame, n_folds: int = 2, metric: str = "recall@10",
                   categories: Sequence[int] = (1, 2, 3, 4), label: str = "tuned (held-out)"
                   ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Choose an arm per fold by ``metric`` over ``categories`` on the *other* folds' conversations.

    Returns (held-out rows: for each fold, the chosen arm's rows of that fold's conversations only,
    relabelled ``label``; one row per fold: its conversations, the chosen arm, the training score).
    """
    folds = conversation_folds(per_question["conversation"].unique(), n_folds)
    held, choices = [], []
    for i, test in enumerate(folds):
        train = per_question[~per_question.conversation.isin(test)]
        scored = train[train.category.isin(categories)].dropna(subset=[metric])
        means = scored.groupby("mode", sort=False)[metric].mean()
        best = str(means.idxmax())
        rows = per_question[per_question.conversation.isin(test) & (per_question["mode"] == best)]
        held.append(rows.assign(mode=label, fold=i, chosen=best))
        choices.append({"fold": i, "held_out": ",".join(test), "chosen": best, f"train_{metric}": float(means.max())})
    return pd.concat(held, ignore_index=True), pd.DataFrame(choices)


def weight_grid(base: Arm, dense: Sequence[float], note_dense: Sequence[float], sigma: Sequence[float],
                keyword: float = 1.0, sparse: Sequence[float] = (), session: Sequence[float] = ()) -> dict[str, Arm]:
    """Arms over z-score fusion weights (keyword fixed: only ratios matter) and the boost size; ``sparse`` and
    ``session`` weights only where the base arm has that list."""
    optional = {"sparse": ("p", sparse if base.index.get("sparse") else ()),
                "session": ("g", session if base.index.get("session_text") else ())}
    arms = {}
    extra_axes = [ws or (None,) for _, ws in optional.values()]
    for d, nd, s, *extra in itertools.product(dense, note_dense, sigma, *extra_axes):
        w = {"dense": float(d), "keyword": float(keyword), "note_dense": float(nd)}
        name = f"z d{d:g} n{nd:g} s{s:g}"
        for (list_name, (tag, _)), x in zip(optional.items(), extra):
            if x is not None:
                w[list_name] = float(x)
                name += f" {tag}{x:g}"
        search = {**base.search, "fusion": "zscore", "fusion_weights": w,
                  "participant_boost": s > 0, "participant_boost_sigma": float(s)}
        arms[name] = replace(base, search=search)
    return arms
