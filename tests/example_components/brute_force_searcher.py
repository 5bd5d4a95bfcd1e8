"""A second `memlab.memory.Searcher`, written only against the protocol: exact cosine over word counts.

No FAISS, no fitted embedder, no fusion: every search scores every memory of the key. It honours the query,
``max_results`` and the ``kind`` filter; the other search options are `HybridIndex`'s business and ignored
here. It proves that a run, its traces and the retrieval benchmark need nothing of a searcher but the protocol:
of the optional abilities (`memlab.memory.capabilities`) it has only `ReleasesKeys`; it encodes nothing ahead
and ships no built state (a copied store's key is rebuilt from its rows).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

from memlab.index.text import words
from memlab.memory import MemoryEntry, SearchHit, SearchOptions, SearchResult, UserKey


def _vector(text: str) -> tuple[Counter[str], float]:
    c = Counter(words(text))
    return c, math.sqrt(sum(v * v for v in c.values()))


class BruteForceSearcher:
    """Implements `memlab.memory.Searcher` (and `ReleasesKeys`): the store's write hooks keep a copy of each key's
    memories."""

    reconcile_signal = "dense"  # its score is a cosine in [0, 1]

    def __init__(self) -> None:
        self._entries: dict[UserKey, dict[str, MemoryEntry]] = {}
        self.searches = 0

    def cache_id(self) -> str:
        return "brute-force-cosine"

    # the store's write hooks: a key not yet loaded is read from the store on its first search
    def on_upsert(self, entry: MemoryEntry) -> None:
        if entry.key in self._entries:
            self._entries[entry.key][entry.id] = entry

    def on_delete(self, key: UserKey, memory_id: str) -> None:
        self._entries.get(key, {}).pop(memory_id, None)

    def on_clear(self, key: UserKey) -> None:
        if key in self._entries:
            self._entries[key] = {}

    def ensure_built(self, key: UserKey, load_entries: Callable[[], list[MemoryEntry]]) -> None:
        if key not in self._entries:
            self._entries[key] = {e.id: e for e in load_entries()}

    def entries(self, key: UserKey, load_entries: Callable[[], list[MemoryEntry]]) -> list[MemoryEntry]:
        self.ensure_built(key, load_entries)
        return list(self._entries[key].values())

    def search(self, key: UserKey, options: SearchOptions,
               load_entries: Callable[[], list[MemoryEntry]]) -> SearchResult:
        self.searches += 1
        result = SearchResult(query=options.query, options=options)
        q, qn = _vector(options.query)
        if not qn or options.max_results <= 0:
            return result
        scored = []
        for e in self.entries(key, load_entries):
            if options.kind is not None and e.kind != options.kind:
                continue
            v, vn = _vector(e.text)
            s = sum(q[w] * v[w] for w in q) / (qn * vn) if vn else 0.0
            if s > 0:
                scored.append((s, e.id, e))
        scored.sort(key=lambda t: (-t[0], t[1]))
        result.hits = [SearchHit(entry=e, score=s, rank=r, dense_rank=r, dense_score=s)
                       for r, (s, _, e) in enumerate(scored[:options.max_results], start=1)]
        return result

    def mark_stale(self) -> None:
        self._entries.clear()  # re-read every key from the store on its next use

    def keys(self) -> list[UserKey]:
        return list(self._entries)

    def verify_against(self, key: UserKey, entries: list[MemoryEntry]) -> None:
        if key in self._entries:
            self._entries[key] = {e.id: e for e in entries}

    def release(self, key: UserKey) -> None:
        self._entries.pop(key, None)

    def close(self) -> None:
        self._entries.clear()
