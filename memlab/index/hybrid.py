"""Hybrid retrieval per user key: dense (FAISS) + keyword ranks fused by RRF, with the search options.

Each `UserKey` has its own index, so a search costs what that user's memories cost, never all users'.
A key's index is rebuilt lazily on the first search after a write: rows come from the current
entries, so a deleted memory is never returned and an updated one is re-embedded (vectors of
unchanged texts are reused). Corpus-fitted embedders (tfidf-lsa) are refitted when the key's corpus
has grown or shrunk by ``refit_growth`` since the last fit; in between, new texts are projected with
the existing fit.

Observation-aware indexing: with ``append_citing`` the keyword text of a dialog-turn record
(`is_turn_record`) carries the texts of the memories that cite that turn (LoCoMo observations or
extracted memories); the dense vectors and the bounded text score reconcile reads stay on each
memory's own text. ``SearchOptions.unit="turn"`` then returns turn records only, each also scored by
the best dense score among the memories citing it.

The ranking itself (filters, the fused lists' producers, fusion, boost, dedupe) is `memlab.index.ranking`;
saving and restoring keys is `memlab.index.saved` (the format: `memlab.index.persist`); what the index reads of a
memory is `memlab.index.memory_fields`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import numpy as np

from memlab.index.dense import DenseIndex
from memlab.index.embedders import (
    EMBEDDERS,
    CachedEmbedder,
    Embedder,
    embed_checked,
    make_embedder,
    parse_embedder_spec,
)
from memlab.index.keyword import KEYWORD_SCORERS, TfidfScorer, make_keyword_scorer
from memlab.index.machine_cache import SPARSE
from memlab.index.memory_fields import (  # noqa: F401
    citing_pairs,
    index_text,
    is_turn_record,
    session_documents,
    with_citing_notes,
)
from memlab.index.persist import SavedKey, text_hash
from memlab.index.ranking import (
    PRODUCERS,
    KeyState,
    Producer,
    feedback_query,
    rank,
)
from memlab.index.saved import SavedIndex
from memlab.index.text import word_set
from memlab.memory.entry import MemoryEntry, UserKey
from memlab.memory.search_types import KIND_FALLBACK_MIN_HITS, SearchHit, SearchOptions, SearchResult
from memlab.params import SEP, Component, Pattern, Range, parse_spec, resolved_params, secret_names

#: File name of the sparse-vector cache, beside the embedding cache (`memlab.index.keyword_splade`).
SPARSE_CACHE_NAME = SPARSE
#: Guards `HybridIndex.builds` (a module lock keeps an index copyable and picklable, as its embedders are).
_BUILDS_LOCK = threading.Lock()
#: FAISS factory strings memlab builds (FAISS aborts the process on some malformed ones, e.g. ``HNSW0``, so they
#: are checked before any index is built).
FACTORY = Pattern(r"Flat|HNSW[1-9][0-9]*(,Flat)?|IVF[1-9][0-9]*,(Flat|PQ[1-9][0-9]*)|PQ[1-9][0-9]*|LSH",
                  "a FAISS factory string memlab builds: Flat, HNSW<M> (M >= 1), IVF<n>,Flat, IVF<n>,PQ<m>, PQ<m> "
                  "or LSH")


class HybridIndex(SavedIndex, Component):
    """Implements `memlab.memory.Searcher`: one dense + keyword index per user key.

    A component whose parts are components: ``embedder`` (an `Embedder` or its registered name, with
    ``embedder_params``), ``keyword`` and ``sparse`` (keyword scorers as ``name(setting=value,...)``,
    `memlab.params.spec_text`). Its own settings are the rest of the constructor: a config gives them under
    ``index.params``, the parts under ``index.embedder``, ``index.keyword`` and ``index.sparse``
    (`memlab.run.config_sections.IndexConfig`); the saved-index manifest and the run's index file name are
    derived from them (`memlab.index.persist.manifest_settings`)."""

    #: The parts are given by their own config keys; the paths by the run (`memlab.run.extraction.open_store`).
    fixed_params = {"embedder": "index.embedder.name", "embedder_params": "index.embedder.params",
                    "keyword": "index.keyword", "sparse": "index.sparse",
                    "cache_path": "run.cache_dir (the machine cache)", "persist_path": "the run's cache folder"}
    #: Where vectors are cached and the index saved decide nothing it returns.
    cache_exclude = ("cache_path", "persist_path")

    #: The ranked lists a search fuses, in fusion order (`memlab.index.ranking.PRODUCERS`; a subclass may
    #: set its own).
    producers: Sequence[Producer] = PRODUCERS

    def __init__(
        self,
        embedder: str | Embedder = "tfidf-lsa",
        factory: Annotated[str, FACTORY] = "Flat",
        keyword: str = "tfidf",
        refit_growth: Annotated[float, Range(0, 1, lo_open=True)] = 0.25,
        date_in_text: bool = True,
        embedder_params: dict[str, Any] | None = None,
        cache_path: str | None = None,
        persist_path: str | None = None,
        append_citing: bool = False,
        ef_search: Annotated[int, Range(1)] = 1024,
        ef_construction: Annotated[int, Range(1)] = 128,
        sparse: str | None = None,
        session_text: bool = False,
    ):
        """``factory``: the FAISS index (`memlab.index.dense`); ``refit_growth``: how far a key's corpus grows or
        shrinks before a corpus-fitted embedder is fitted again; ``date_in_text``: a memory's event date is part
        of its index text; ``append_citing``: observation-aware keyword text (a dialog-turn record's text plus
        every memory citing that turn); ``ef_search`` / ``ef_construction``: HNSW's search and build breadth;
        ``session_text``: each dialog-turn record also scored by BM25 over its whole session (the ``session``
        list, meant for ``retrieval.fusion: zscore``)."""
        self.embedder = embedder
        self.factory = factory
        self.keyword = keyword
        self.sparse = sparse
        self.session_text = session_text
        self.refit_growth = refit_growth
        self.date_in_text = date_in_text
        self.append_citing = append_citing
        self.ef_search = ef_search
        self.ef_construction = ef_construction
        self.embedder_params = embedder_params or {}
        self.cache_path = cache_path
        self.persist_path = persist_path
        self._states: dict[UserKey, KeyState] = {}
        self._saved: dict[UserKey, SavedKey] = {}
        self._shared_embedder: Embedder | None = None
        self._query_vectors: dict[str, np.ndarray] = {}  # `prepare_queries`' vectors of a pretrained embedder
        self._ahead: dict[UserKey, dict[str, np.ndarray]] = {}  # `encode_ahead`'s vectors, per key until it builds
        self.builds = 0
        if persist_path and Path(persist_path).is_file():
            self.load(persist_path)

    def parts(self) -> dict[str, tuple[type, dict[str, Any]] | None]:
        """Each part named by spec (embedder, keyword, sparse): its class and the settings it is built with (None:
        no sparse list). An embedder given as an object is its own component (`get_params` nests it)."""
        out: dict[str, tuple[type, dict[str, Any]] | None] = {}
        if not isinstance(self.embedder, Embedder):
            name, params = parse_embedder_spec(self.embedder, self.embedder_params)
            out["embedder"] = (EMBEDDERS.get(name), params)
        for part in ("keyword", "sparse"):
            spec = getattr(self, part)
            out[part] = None if spec is None else (KEYWORD_SCORERS.get(parse_spec(spec)[0]), parse_spec(spec)[1])
        return out

    def get_params(self, deep: bool = False) -> dict[str, Any]:
        """The constructor's arguments; ``deep``: each part's settings too, defaults filled in, as ``part__setting``
        (``embedder__n_components``, ``keyword__k1``; scikit-learn's spelling), never a secret."""
        out = super().get_params(deep)
        for part, got in (self.parts() if deep else {}).items():
            if got is not None:
                out.update({f"{part}{SEP}{k}": v for k, v in resolved_params(*got).items() if k not in
                            secret_names(got[0])})
        return out

    def twin(self) -> HybridIndex:
        """A new, empty index with these settings (no persist path: saving it writes only where told)."""
        return self.clone(persist_path=None)

    def sparse_cache_path(self) -> str | None:
        """A model-encoded sparse scorer keeps its vectors beside the embedding cache (none without one)."""
        return None if not self.cache_path else str(Path(self.cache_path).with_name(SPARSE_CACHE_NAME))

    def keys(self) -> list[UserKey]:
        """Keys this index holds state for (loaded from disk or seen since start-up)."""
        return list(dict.fromkeys([*self._states, *self._saved]))

    @property
    def model_free(self) -> bool:
        """Whether building and searching a key is computation on its rows alone (a corpus-fitted embedder,
        word-count scorers: no model pass, no endpoint): several keys may then build side by side and answer in
        forked processes (`memlab.run.forked`); a model pass keeps one process, with all its threads."""
        models = [s for s in (self.keyword, self.sparse) if s and KEYWORD_SCORERS.get(parse_spec(s)[0]).uses_cache]
        return self._new_embedder().needs_fit and not models

    def needs_build(self, key: UserKey) -> bool:
        """Whether using the key now would fit or embed: no state in memory and none saved, or rows changed."""
        st = self._states.get(key)
        return key not in self._saved if st is None else (st.dirty or st.stale)

    def release(self, key: UserKey) -> None:
        """Drop a key's state from memory (fit, vectors, dense and keyword structures); the store keeps its rows
        and the next use of the key builds it again (or `import_key` restores it). A run over many independent
        keys (LongMemEval: one per question) releases each once answered (`memlab.run.streaming`)."""
        self._states.pop(key, None)
        self._saved.pop(key, None)

    def mark_stale(self) -> None:
        """Another writer changed the store: every key re-reads its rows before its next search."""
        for st in self._states.values():
            st.stale = True

    def refresh(self, key: UserKey, entries: list[MemoryEntry]) -> None:
        """Take the store's current rows for a key (the store is the truth); vectors of unchanged
        texts are kept, so only what changed is embedded again."""
        st = self._states.get(key)
        if st is None:
            return
        new = {e.id: e for e in entries}
        if new != st.entries:
            st.entries = new
            st.dirty = True
        st.stale = False

    # ------------------------------------------------------------------ store hooks (Searcher)
    def on_upsert(self, entry: MemoryEntry) -> None:
        st = self._states.get(entry.key)
        if st is not None:
            st.entries[entry.id] = entry
            st.dirty = True

    def on_delete(self, key: UserKey, memory_id: str) -> None:
        st = self._states.get(key)
        if st is not None and st.entries.pop(memory_id, None) is not None:
            st.dirty = True

    def on_clear(self, key: UserKey) -> None:
        st = self._states.get(key)
        if st is not None:
            st.entries.clear()
            st.dirty = True

    @property
    def reconcile_signal(self) -> str:
        """Which hit score reconcile may compare with its thresholds (see `memlab.extract.reconcile`)."""
        if isinstance(self.embedder, Embedder):
            fitted = self.embedder.needs_fit
        else:
            fitted = EMBEDDERS.get(parse_embedder_spec(self.embedder)[0]).needs_fit
        return "tfidf" if fitted else "dense"

    # ---------------------------------------------------------------------------- building
    def _new_embedder(self) -> Embedder:
        if isinstance(self.embedder, Embedder):
            proto = self.embedder
            if proto.needs_fit:
                return proto.clone()
            return proto
        if self._shared_embedder is None:
            self._shared_embedder = make_embedder(self.embedder, self._vector_cache(), **self.embedder_params)
        if self._shared_embedder.needs_fit:
            return make_embedder(self.embedder, self._vector_cache(), **self.embedder_params)
        return self._shared_embedder

    def _vector_cache(self) -> str | None:
        """The embedding cache for a pretrained embedder; none for a corpus-fitted one (its vectors depend on the fit
        the saved index keeps, cost a sparse product, and would grow the machine cache by a copy per corpus)."""
        return None if EMBEDDERS.get(parse_embedder_spec(self.embedder)[0]).needs_fit else self.cache_path

    def _rows(self, entries: Sequence[MemoryEntry]) -> tuple[list[MemoryEntry], list[str]]:
        """A key's rows in index order and their index texts."""
        rows = sorted(entries, key=lambda e: (e.created_at, e.id))
        return rows, [index_text(e, self.date_in_text) for e in rows]

    def encode_ahead(self, entries_by_key: Mapping[UserKey, Sequence[MemoryEntry]]) -> int:
        """Encode the memories of every key that is about to build in one pass per model (minilm, SPLADE)
        before any key builds, and return how many texts. Passes key by key, between each key's structures,
        fragmented the heap: retrieval-best's minilm passes grew its resident size by 100-280 MB each and set
        the run's peak. A corpus-fitted embedder and word-count scorers have nothing to encode."""
        if self.model_free:
            return 0
        embedder, dense, lexical = self._new_embedder(), {}, []
        for key, entries in entries_by_key.items():
            if not self.needs_build(key):
                continue
            rows, dense[key] = self._rows(entries)
            lexical += (with_citing_notes(rows, dense[key], citing_pairs(rows, [is_turn_record(e) for e in rows]))
                        if self.append_citing else dense[key])
        todo = list(dict.fromkeys(t for texts in dense.values() for t in texts))
        if todo and not embedder.needs_fit:
            vectors = dict(zip(todo, embed_checked(embedder, todo)))
            self._ahead.update({key: {t: vectors[t] for t in texts} for key, texts in dense.items()})
        for spec in (self.keyword, self.sparse):
            if spec and lexical:
                make_keyword_scorer(spec, self.sparse_cache_path()).encode_ahead(list(dict.fromkeys(lexical)))
        return sum(map(len, dense.values()))

    def _build(self, st: KeyState, ahead: Mapping[str, np.ndarray] | None = None) -> None:
        rows, texts = self._rows(list(st.entries.values()))
        if st.embedder is None:
            st.embedder = self._new_embedder()
        n = len(rows)
        if st.embedder.needs_fit and (
            st.fit_n == 0 or n > st.fit_n * (1 + self.refit_growth) or n < st.fit_n * (1 - self.refit_growth)
        ):
            st.embedder.fit(texts)
            st.fit_n = n
            st.fit_version += 1
            st.vectors.clear()
        todo = [(e.id, t) for e, t in zip(rows, texts)
                if (c := st.vectors.get(e.id)) is None or c[0] != text_hash(t) or c[1] != st.fit_version]
        if todo:
            wanted = [t for _, t in todo]
            if ahead:  # `encode_ahead` made these; what it did not see is embedded now
                fresh = [t for t in dict.fromkeys(wanted) if t not in ahead]
                made = {**ahead, **dict(zip(fresh, embed_checked(st.embedder, fresh)))} if fresh else ahead
                vecs = [made[t] for t in wanted]
            else:
                vecs = embed_checked(st.embedder, wanted)
            for (mid, t), v in zip(todo, vecs):
                st.vectors[mid] = (text_hash(t), st.fit_version, v)
        live = {e.id for e in rows}
        for mid in [m for m in st.vectors if m not in live]:
            del st.vectors[mid]
        self._derive(st, rows, texts)
        with _BUILDS_LOCK:  # keys of a model-free index build in threads (`memlab.run.extraction.build_indexes`)
            self.builds += 1

    def _derive(self, st: KeyState, rows: list[MemoryEntry], texts: list[str]) -> None:
        """Everything cheap that follows from the rows and their vectors (FAISS, keyword scorers, masks)."""
        n = len(rows)
        st.rows = rows
        st.row_of = {e.id: i for i, e in enumerate(rows)}
        st.is_record = np.array([is_turn_record(e) for e in rows], dtype=bool)
        pairs = citing_pairs(rows, st.is_record)
        st.cite_note = np.array([p[0] for p in pairs], dtype=np.int64)
        st.cite_record = np.array([p[1] for p in pairs], dtype=np.int64)
        kw_texts = with_citing_notes(rows, texts, pairs) if self.append_citing else texts
        if n:
            mat = np.vstack([st.vectors[e.id][2] for e in rows])
            st.matrix = mat
            st.dense = DenseIndex(self.factory, ef_search=self.ef_search,
                                  ef_construction=self.ef_construction).build(mat)
            st.keyword = make_keyword_scorer(self.keyword, self.sparse_cache_path()).fit(kw_texts)
            # the bounded lexical score reconcile reads compares the memory's own text, never appended notes
            same = kw_texts is texts and isinstance(st.keyword, TfidfScorer)
            st.tfidf = st.keyword if same else TfidfScorer().fit(texts)
            st.sparse = (make_keyword_scorer(self.sparse, self.sparse_cache_path()).fit(kw_texts)
                         if self.sparse else None)
            st.session_kw, st.session_of = None, None
            if self.session_text:
                st.session_of, docs = session_documents(rows, st.is_record, kw_texts)
                if docs:
                    st.session_kw = make_keyword_scorer("bm25").fit(docs)  # whole sessions: BM25's length norm
        else:
            st.dense, st.keyword, st.tfidf, st.sparse, st.session_kw, st.session_of = None, None, None, None, None, None
        st.is_fact = np.array([e.kind == "fact" for e in rows], dtype=bool)
        st.event_ts = np.array([e.event_time.timestamp() if e.event_time else np.nan for e in rows], dtype=float)
        st.word_sets = [word_set(e.text) for e in rows]
        st.participants = {}
        for r, e in enumerate(rows):
            for p in e.participants:
                st.participants.setdefault(p.lower(), np.zeros(n, dtype=bool))[r] = True
        st.dirty = False

    def ensure_built(self, key: UserKey, load_entries: Callable[[], list[MemoryEntry]]) -> KeyState:
        st = self._states.get(key)
        if st is None:
            entries = load_entries()
            st = self._from_saved(key, entries) or KeyState(entries={e.id: e for e in entries})
            self._states[key] = st
        elif st.stale:
            self.refresh(key, load_entries())
        if st.dirty:
            self._build(st, self._ahead.pop(key, None))
        return st

    def entries(self, key: UserKey, load_entries: Callable[[], list[MemoryEntry]]) -> list[MemoryEntry]:
        return list(self.ensure_built(key, load_entries).entries.values())

    # ----------------------------------------------------------------------------- search
    def prepare_queries(self, key: UserKey, queries: list[str],
                        load_entries: Callable[[], list[MemoryEntry]]) -> int:
        """Encode a run's queries for a key in batched passes before answering (a model pass per question costs
        far more, and under contention each pass pays the thread pools' start again); returns how many.

        Dense vectors of a pretrained embedder are kept by query text for `search`; a model-encoded lexical
        scorer (SPLADE) keeps its own. A corpus-fitted embedder (tfidf-lsa) projects a query in microseconds
        and is left to `search`, so its vectors stay exactly what a lone search computes.
        """
        st = self.ensure_built(key, load_entries)
        qs = [q for q in dict.fromkeys(queries) if q.strip()]
        if not st.rows or not qs:
            return 0
        if not st.embedder.needs_fit:
            todo = [q for q in qs if q not in self._query_vectors]
            if todo:
                self._query_vectors.update(zip(todo, st.embedder.embed_query(todo)))
        for lexical in (st.keyword, st.sparse):
            if lexical is not None:
                lexical.encode_queries(qs)
        return len(qs)

    def encode_ms(self, key: UserKey, queries: list[str], load_entries: Callable[[], list[MemoryEntry]]) -> float:
        """Milliseconds per query to encode ``queries`` (dense and lexical, batched, every cache bypassed): the
        encoding cost the retrieval benchmark reports apart from search time."""
        st = self.ensure_built(key, load_entries)
        t0 = time.perf_counter()
        (st.embedder.embedder if isinstance(st.embedder, CachedEmbedder) else st.embedder).embed_query(queries)
        for lexical in (st.keyword, st.sparse):
            if lexical is not None:
                lexical.encode_queries(queries, cached=False)
        return 1000 * (time.perf_counter() - t0) / max(1, len(queries))

    def _query_vector(self, st: KeyState, query: str) -> np.ndarray:
        """The query's dense vector [1, d]: prepared by `prepare_queries`, else embedded now."""
        if st.embedder.needs_fit:
            return st.fitted_query_vector(query)
        v = self._query_vectors.get(query)
        return st.embedder.embed_query([query]) if v is None else v[None, :]

    def search(self, key: UserKey, options: SearchOptions,
               load_entries: Callable[[], list[MemoryEntry]]) -> SearchResult:
        result = SearchResult(query=options.query, options=options)
        if not options.query.strip() or options.max_results <= 0:
            return result
        st = self.ensure_built(key, load_entries)
        if not st.rows:
            return result
        hits, dropped = self._ranked(st, options, options.kind, self._feedback_query(st, options, options.kind))
        if options.kind and options.kind_fallback and len(hits) < KIND_FALLBACK_MIN_HITS:
            more, more_dropped = self._ranked(st, options, None, self._feedback_query(st, options, None))
            have = {h.id for h in hits}
            for h in more:
                if len(hits) >= options.max_results:
                    break
                if h.id not in have:
                    hits.append(replace(h, via="kind-fallback"))
                    result.fallback_added.append(h.id)
                    have.add(h.id)
            dropped += [d for d in more_dropped if d[0] not in have]
        if options.order_by_event_time:
            hits.sort(key=lambda h: (h.entry.event_time is None,
                                     h.entry.event_time.timestamp() if h.entry.event_time else 0.0))
        result.hits = [h if h.rank == i else replace(h, rank=i) for i, h in enumerate(hits, start=1)]
        result.dropped_by_dedupe = dropped
        return result

    def _ranked(self, st: KeyState, options: SearchOptions, kind: str | None, qvec: np.ndarray | None = None
                ) -> tuple[list[SearchHit], list[tuple[str, str, float]]]:
        """`memlab.index.ranking.rank` with this index's producers; ``qvec`` replaces the query's vector."""
        return rank(st, options, kind, lambda: qvec if qvec is not None else self._query_vector(st, options.query),
                    self.producers)

    def _feedback_query(self, st: KeyState, options: SearchOptions, kind: str | None) -> np.ndarray | None:
        """Rocchio pseudo-relevance feedback (``SearchOptions.feedback``), or None when off."""
        if not options.feedback or options.keyword_only:
            return None
        return feedback_query(st, options, kind, self._query_vector(st, options.query), self.producers)
