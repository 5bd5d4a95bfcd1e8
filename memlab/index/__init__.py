"""Retrieval: embedders, FAISS dense index, keyword scorers, RRF hybrid search per user key."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from memlab.index.dense import DenseIndex
from memlab.index.embedders import (
    CachedEmbedder,
    Embedder,
    LiteLLMEmbedder,
    MiniLMEmbedder,
    TfidfLSAEmbedder,
    make_embedder,
)
from memlab.index.fusion import dedupe, rrf
from memlab.index.hybrid import HybridIndex, index_text
from memlab.index.keyword import BM25Scorer, KeywordScorer, TfidfScorer, make_keyword_scorer
from memlab.memory import InMemoryMemoryService, MemoryService, SQLiteMemoryService
from memlab.memory.search_types import Searcher

BACKENDS = ("sqlite", "memory")


def open_service(
    backend: str = "sqlite",
    path: str | os.PathLike[str] | None = None,
    embedder: str | Embedder = "tfidf-lsa",
    factory: str = "Flat",
    keyword: str = "tfidf",
    embedding_cache: str | os.PathLike[str] | None = None,
    index_path: str | os.PathLike[str] | None = None,
    on_corrupt: str = "raise",
    searcher: Searcher | None = None,
    **index_params: Any,
) -> MemoryService:
    """A `MemoryService` with a `HybridIndex` attached; with SQLite at ``path`` the index is saved
    (``index_path``, default ``<path>.index``) on close and reused on open where it still matches
    the store (the store is the truth: a key whose memories changed is rebuilt). ``on_corrupt``:
    what a store file failing its integrity check does -- ``"raise"`` (a durable store) or
    ``"rebuild"`` (a cache: reported, set aside, started empty). ``searcher``: any `memlab.memory.Searcher`
    instead of the `HybridIndex` the index settings describe (they are then not used)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")
    if searcher is not None and not isinstance(searcher, Searcher):
        members = [*Searcher.__annotations__, *(n for n in vars(Searcher) if not n.startswith("_"))]
        missing = [m for m in members if not hasattr(searcher, m)]
        raise TypeError(f"searcher: {type(searcher).__name__} is not a memlab.memory.Searcher (it lacks "
                        f"{', '.join(missing)})")
    if searcher is None:
        persist = None
        if backend == "sqlite" and path is not None and str(path) != ":memory:":
            persist = str(index_path or Path(path).with_name(Path(path).name + ".index"))
        searcher = HybridIndex(embedder=embedder, factory=factory, keyword=keyword, persist_path=persist,
                               cache_path=None if embedding_cache is None else str(embedding_cache), **index_params)
    if backend == "memory":
        return InMemoryMemoryService(searcher)
    svc = SQLiteMemoryService(":memory:" if path is None else path, searcher, on_corrupt=on_corrupt)
    for key in searcher.keys():
        searcher.verify_against(key, svc.list(key))
    return svc


__all__ = [
    "BM25Scorer", "CachedEmbedder", "DenseIndex", "Embedder", "HybridIndex", "KeywordScorer", "LiteLLMEmbedder",
    "MiniLMEmbedder", "TfidfLSAEmbedder", "TfidfScorer", "dedupe", "index_text", "make_embedder",
    "make_keyword_scorer", "open_service", "rrf",
]
