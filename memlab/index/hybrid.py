"""Hybrid retrieval per user key: dense (FAISS) + keyword ranks fused by RRF, with the search options.

Each `UserKey` has its own index, so a search costs what that user's memories cost, never all users'.
A key's index is rebuilt lazily on the first search after a write: rows come from the current
entries, so a deleted memory is never returned and an updated one is re-embedded (vectors of
unchanged texts are reused). Corpus-fitted embedders (tfidf-lsa) are refitted when the key's corpus
has grown or shrunk by ``refit_growth`` since the last fit; in between, new texts are projected with
the existing fit.

Search order (DESIGN, Search options): filter by kind and time window -> dense list (similarity
threshold applies here) and keyword list (plus, with ``unit="turn"``, the ``note_dense`` list) -> fusion
(``rrf`` = sum 1/(k + rank), DESIGN's rule, or ``zscore``; `memlab.index.fusion`) -> optional participant
boost (sigma of the fused scores) -> dedupe (word-set Jaccard >= 0.80 keeps the higher-ranked) -> cut to
max_results -> kind fallback (< 3 hits: search again without the kind, merge after the kind hits) ->
optional order by event time.

Observation-aware indexing: with ``append_citing`` the keyword text of a dialog-turn record
(`is_turn_record`) carries the texts of the memories that cite that turn (LoCoMo observations or
extracted memories); the dense vectors and the bounded text score reconcile reads stay on each
memory's own text. ``SearchOptions.unit="turn"`` then returns turn records only, each also scored by
the best dense score among the memories citing it.

Two optional lists (both off by default, fused by name like the others): ``sparse`` (``sparse="splade"``,
a second lexical scorer over the same keyword texts; learned expansion finds turns that share no word
with the question) and ``session`` (``session_text=True``: each turn record also gets the keyword score of
its whole session, BM25 over the records sharing its event time, joined; a turn in the session the question
is about moves up, `benchmarks/retrieval_recall.py`). Every turn of a session shares its session score, so
the list carries no order within a session: it is meant for z-score fusion (under RRF those ties are broken
by row order, which favours a session's early turns).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from memlab.atomic import write_with
from memlab.cache_integrity import quarantine, report
from memlab.data.locomo import format_day
from memlab.index.dense import DenseIndex
from memlab.index.embedders import EMBEDDERS, Embedder, make_embedder, parse_embedder_spec
from memlab.index.fusion import RankedList, dedupe_sets, make_fusion, participant_boost
from memlab.index.keyword import KeywordScorer, TfidfScorer, make_keyword_scorer
from memlab.index.text import word_set, words
from memlab.memory.entry import MemoryEntry, UserKey
from memlab.memory.search_types import (
    DEDUPE_JACCARD,
    KIND_FALLBACK_MIN_HITS,
    SearchHit,
    SearchOptions,
    SearchResult,
)

#: Up to this many memories per key, every list is ranked in full (exact RRF); above it, each list
#: is cut at ``max(DEPTH_MIN, DEPTH_FACTOR * max_results)`` candidates.
FULL_RANK_LIMIT = 20_000
DEPTH_MIN = 100
DEPTH_FACTOR = 10
#: Rocchio weight of the feedback centroid (``SearchOptions.feedback``), measured in the recall benchmark.
FEEDBACK_WEIGHT = 0.5
#: File name of the sparse-vector cache, beside the embedding cache (`memlab.index.keyword_splade`).
SPARSE_CACHE_NAME = "sparse-vectors.sqlite"
#: Settings added after the saved-index format was fixed: written (into a manifest, into a run's index file
#: name) only when set, so an index saved before them still matches.
LATER_SETTINGS = ("sparse", "session_text")
#: Version of the saved-index format; a file of another version is ignored and rebuilt.
INDEX_FORMAT = 4


def index_text(entry: MemoryEntry, with_date: bool = True) -> str:
    """What the retrievers see of a memory: ``[8 May 2023]`` from its event_time, its text, its topics.

    The date makes "when did ..." questions and month/year words match (measured in
    ``benchmarks/retrieval_recall.py``); reconcile and dedupe compare the bare texts.
    """
    text = entry.text
    if with_date and entry.event_time is not None:
        text = f"[{format_day(entry.event_time)}] {text}"
    if entry.topics:
        text = f"{text} ({', '.join(entry.topics)})"
    return text


def is_turn_record(entry: MemoryEntry) -> bool:
    """A verbatim dialog turn (the ``turns`` extractor's records): one source id, one participant, and a
    text that starts ``"<participant>: "`` (every speaker turn style of `memlab.extract.memory_sets`).

    Everything else (LoCoMo observations, extracted memories) is a *note*: what observation-aware
    indexing folds into the turns a note cites.
    """
    return (len(entry.source_ids) == 1 and len(entry.participants) == 1
            and entry.text.startswith(f"{entry.participants[0]}: "))


def session_documents(rows: list[MemoryEntry], is_record: np.ndarray, texts: list[str]
                      ) -> tuple[np.ndarray, list[str]]:
    """Each dialog-turn record's session number (-1 for other rows) and each session's records' texts joined.

    A session is the records sharing an event time (every turn of a LoCoMo session carries its date); a
    record without one is a session of its own.
    """
    of = np.full(len(rows), -1, dtype=np.int64)
    groups: dict[Any, int] = {}
    for r, e in enumerate(rows):
        if is_record[r]:
            of[r] = groups.setdefault(e.event_time if e.event_time is not None else ("row", r), len(groups))
    parts: list[list[str]] = [[] for _ in groups]
    for r in np.flatnonzero(of >= 0):
        parts[of[r]].append(texts[r])
    return of, [" ".join(p) for p in parts]


def _lexical_list(name: str, scores: np.ndarray, mask: np.ndarray, depth: int) -> RankedList:
    """The rows the filters allow with a score > 0, best first, cut at ``depth`` (scores NaN elsewhere)."""
    cand = np.flatnonzero(mask & (scores > 0))
    rows = cand[np.argsort(-scores[cand], kind="stable")][:depth]
    kept = np.full(len(scores), np.nan, dtype=np.float32)
    kept[rows] = scores[rows]
    return RankedList(name, rows, kept)


def _h(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


@dataclass
class _KeyState:
    entries: dict[str, MemoryEntry] = field(default_factory=dict)
    dirty: bool = True
    rows: list[MemoryEntry] = field(default_factory=list)
    embedder: Embedder | None = None
    fit_n: int = 0
    fit_version: int = 0
    vectors: dict[str, tuple[str, int, np.ndarray]] = field(default_factory=dict)
    dense: DenseIndex | None = None
    keyword: KeywordScorer | None = None
    tfidf: TfidfScorer | None = None  # the bounded lexical score of every hit (the keyword scorer when tfidf)
    sparse: KeywordScorer | None = None  # the optional second lexical list (``sparse``, e.g. SPLADE)
    session_kw: KeywordScorer | None = None  # BM25 over each session's records joined (``session_text``)
    session_of: np.ndarray | None = None  # row -> session number (-1: not a record)
    is_fact: np.ndarray | None = None
    event_ts: np.ndarray | None = None  # float seconds, NaN where absent
    participants: dict[str, np.ndarray] = field(default_factory=dict)  # lower-cased name -> row mask
    word_sets: list[frozenset[str]] = field(default_factory=list)
    matrix: np.ndarray | None = None  # the rows' dense vectors, in row order
    row_of: dict[str, int] = field(default_factory=dict)
    is_record: np.ndarray | None = None  # rows that are dialog-turn records (`is_turn_record`)
    cite_note: np.ndarray | None = None  # (note row, cited record row) pairs, for SearchOptions.unit="turn"
    cite_record: np.ndarray | None = None
    stale: bool = False  # another process may have changed the store: re-read the rows before use


@dataclass
class _SavedKey:
    """A key as read from a saved index, used once the store's rows are known to match it."""

    fingerprint: str
    fit_n: int
    fit_version: int
    ids: list[str]
    hashes: list[str]
    vfit: list[int]
    vectors: np.ndarray
    embedder_meta: dict[str, Any] | None
    embedder_arrays: dict[str, np.ndarray]


def entries_fingerprint(entries: list[MemoryEntry]) -> str:
    """sha256 over a key's memories (every field): a saved index is used only for exactly these rows."""
    h = hashlib.sha256()
    for e in sorted(entries, key=lambda e: e.id):
        h.update(json.dumps([e.id, e.text, e.kind, list(e.topics), str(e.event_time), list(e.participants),
                             e.location, list(e.source_ids), str(e.created_at), str(e.updated_at)]
                            ).encode("utf-8", "surrogatepass"))
    return h.hexdigest()


class HybridIndex:
    """Implements `memlab.memory.Searcher`: one dense + keyword index per user key."""

    def __init__(
        self,
        embedder: str | Embedder = "tfidf-lsa",
        index: str = "Flat",
        keyword: str = "tfidf",
        refit_growth: float = 0.25,
        date_in_text: bool = True,
        embedder_params: dict[str, Any] | None = None,
        cache_path: str | None = None,
        persist_path: str | None = None,
        append_citing: bool = False,
        ef_search: int = 1024,
        ef_construction: int = 128,
        sparse: str | None = None,
        session_text: bool = False,
    ):
        self.embedder = embedder
        self.index = index
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
        self._states: dict[UserKey, _KeyState] = {}
        self._saved: dict[UserKey, _SavedKey] = {}
        self._shared_embedder: Embedder | None = None
        self._query_vectors: dict[str, np.ndarray] = {}  # `prepare_queries`' vectors of a pretrained embedder
        self.builds = 0
        if persist_path and Path(persist_path).is_file():
            self.load(persist_path)

    def twin(self) -> HybridIndex:
        """A new, empty index with these settings (no persist path: saving it writes only where told)."""
        return HybridIndex(embedder=self.embedder, index=self.index, keyword=self.keyword,
                           refit_growth=self.refit_growth, date_in_text=self.date_in_text,
                           embedder_params=self.embedder_params, cache_path=self.cache_path,
                           append_citing=self.append_citing, ef_search=self.ef_search,
                           ef_construction=self.ef_construction, sparse=self.sparse,
                           session_text=self.session_text)

    def _sparse_cache(self) -> str | None:
        """A model-encoded sparse scorer keeps its vectors beside the embedding cache (none without one)."""
        return None if not self.cache_path else str(Path(self.cache_path).with_name(SPARSE_CACHE_NAME))

    def keys(self) -> list[UserKey]:
        """Keys this index holds state for (loaded from disk or seen since start-up)."""
        return list(dict.fromkeys([*self._states, *self._saved]))

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
            self._shared_embedder = make_embedder(self.embedder, cache_path=self.cache_path, **self.embedder_params)
        if self._shared_embedder.needs_fit:
            return make_embedder(self.embedder, cache_path=self.cache_path, **self.embedder_params)
        return self._shared_embedder

    def _build(self, st: _KeyState) -> None:
        rows = sorted(st.entries.values(), key=lambda e: (e.created_at, e.id))
        texts = [index_text(e, self.date_in_text) for e in rows]
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
                if (c := st.vectors.get(e.id)) is None or c[0] != _h(t) or c[1] != st.fit_version]
        if todo:
            vecs = st.embedder.embed([t for _, t in todo])
            for (mid, t), v in zip(todo, vecs):
                st.vectors[mid] = (_h(t), st.fit_version, v)
        live = {e.id for e in rows}
        for mid in [m for m in st.vectors if m not in live]:
            del st.vectors[mid]
        self._derive(st, rows, texts)
        self.builds += 1

    def _derive(self, st: _KeyState, rows: list[MemoryEntry], texts: list[str]) -> None:
        """Everything cheap that follows from the rows and their vectors (FAISS, keyword scorers, masks)."""
        n = len(rows)
        st.rows = rows
        st.row_of = {e.id: i for i, e in enumerate(rows)}
        st.is_record = np.array([is_turn_record(e) for e in rows], dtype=bool)
        rec_of_source = {e.source_ids[0]: r for r, e in enumerate(rows) if st.is_record[r]}
        pairs = sorted({(r, rec_of_source[s]) for r, e in enumerate(rows) if not st.is_record[r]
                        for s in e.source_ids if s in rec_of_source})
        st.cite_note = np.array([p[0] for p in pairs], dtype=np.int64)
        st.cite_record = np.array([p[1] for p in pairs], dtype=np.int64)
        kw_texts = texts
        if self.append_citing and pairs:
            extra: dict[int, list[str]] = {}
            for note, rec in pairs:
                extra.setdefault(rec, []).append(rows[note].text)
            kw_texts = [t if r not in extra else t + " " + " ".join(extra[r]) for r, t in enumerate(texts)]
        if n:
            mat = np.vstack([st.vectors[e.id][2] for e in rows])
            st.matrix = mat
            st.dense = DenseIndex(self.index, ef_search=self.ef_search,
                                  ef_construction=self.ef_construction).build(mat)
            st.keyword = make_keyword_scorer(self.keyword, self._sparse_cache()).fit(kw_texts)
            # the bounded lexical score reconcile reads compares the memory's own text, never appended notes
            same = kw_texts is texts and isinstance(st.keyword, TfidfScorer)
            st.tfidf = st.keyword if same else TfidfScorer().fit(texts)
            st.sparse = make_keyword_scorer(self.sparse, self._sparse_cache()).fit(kw_texts) if self.sparse else None
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

    def ensure_built(self, key: UserKey, load_entries: Callable[[], list[MemoryEntry]]) -> _KeyState:
        st = self._states.get(key)
        if st is None:
            entries = load_entries()
            st = self._from_saved(key, entries) or _KeyState(entries={e.id: e for e in entries})
            self._states[key] = st
        elif st.stale:
            self.refresh(key, load_entries())
        if st.dirty:
            self._build(st)
        return st

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

    def _query_vector(self, st: _KeyState, query: str) -> np.ndarray:
        """The query's dense vector [1, d]: prepared by `prepare_queries`, else embedded now."""
        v = None if st.embedder.needs_fit else self._query_vectors.get(query)
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
                    hits.append(_with(h, via="kind-fallback"))
                    result.fallback_added.append(h.id)
                    have.add(h.id)
            dropped += [d for d in more_dropped if d[0] not in have]
        if options.order_by_event_time:
            hits.sort(key=lambda h: (h.entry.event_time is None,
                                     h.entry.event_time.timestamp() if h.entry.event_time else 0.0))
        result.hits = [h if h.rank == i else _with(h, rank=i) for i, h in enumerate(hits, start=1)]
        result.dropped_by_dedupe = dropped
        return result

    def _mask(self, st: _KeyState, options: SearchOptions, kind: str | None) -> np.ndarray:
        mask = np.ones(len(st.rows), dtype=bool)
        if not options.include_superseded:
            mask &= np.array([e.superseded_at is None for e in st.rows], dtype=bool)
        if kind is not None:
            mask &= st.is_fact if kind == "fact" else ~st.is_fact
        if options.notes_only:
            mask &= ~st.is_record
        if options.after is not None or options.before is not None:
            ts = st.event_ts
            ok = ~np.isnan(ts)
            if options.after is not None:
                ok &= ts >= options.after.timestamp()
            if options.before is not None:
                ok &= ts <= options.before.timestamp()
            mask &= ok
        return mask

    def _feedback_query(self, st: _KeyState, options: SearchOptions, kind: str | None) -> np.ndarray | None:
        """Rocchio pseudo-relevance feedback: the query vector moved toward its top ``feedback`` hits."""
        if not options.feedback or options.keyword_only:
            return None
        q = self._query_vector(st, options.query)
        first, _ = self._ranked(st, replace(options, feedback=0, dedupe=False, max_results=options.feedback), kind, q)
        if not first:
            return None
        top = np.vstack([st.matrix[st.row_of[h.id]] for h in first])
        moved = q[0] + FEEDBACK_WEIGHT * top.mean(axis=0)
        return (moved / (np.linalg.norm(moved) or 1.0)).astype(np.float32)[None, :]

    def _ranked(self, st: _KeyState, options: SearchOptions, kind: str | None, qvec: np.ndarray | None = None
                ) -> tuple[list[SearchHit], list[tuple[str, str, float]]]:
        """One ranked, deduped list under a kind filter (vectorised: ~0.1 ms at LoCoMo size).

        Lists (each over the rows the filters allow): ``dense``, ``keyword``, with ``unit="turn"``
        ``note_dense`` (the best dense score among the notes citing each turn record), and the optional
        ``sparse`` and ``session`` lists; fused by ``options.fusion``, then the participant boost, dedupe
        and the cut.
        """
        mask = self._mask(st, options, kind)
        n = len(st.rows)
        notes_on = options.unit == "turn"
        dense_mask = mask
        if notes_on:
            mask = mask & st.is_record
            dense_mask = mask | ~st.is_record  # notes are scored (then projected), never returned
        if not mask.any():
            return [], []
        depth = n if n <= FULL_RANK_LIMIT else max(DEPTH_MIN, DEPTH_FACTOR * options.max_results)
        lists: list[RankedList] = []
        d_rank = np.zeros(n, dtype=np.int64)  # 0 = not in the list
        d_score = np.full(n, np.nan, dtype=np.float32)
        k_rank = np.zeros(n, dtype=np.int64)
        k_score = np.full(n, np.nan, dtype=np.float32)
        if not options.keyword_only:
            q = qvec if qvec is not None else self._query_vector(st, options.query)
            want = depth if dense_mask.all() else min(n, depth * 4)
            while True:
                D, Ids = st.dense.search(q, want)
                valid = Ids[0] >= 0
                D, Ids = D[0][valid], Ids[0][valid]
                keep = dense_mask[Ids]
                if want >= n or int(keep.sum()) >= depth:
                    break
                want = min(n, want * 4)
            if options.similarity_threshold is not None:
                keep &= D >= options.similarity_threshold
            note_d = None
            if notes_on:
                note_d = np.full(n, np.nan, dtype=np.float32)
                note_d[Ids[keep]] = D[keep]
                keep &= mask[Ids]
            dl = Ids[keep][:depth]
            d_rank[dl] = np.arange(1, len(dl) + 1)
            d_score[dl] = D[keep][:depth]
            lists.append(RankedList("dense", dl, d_score))
            if note_d is not None and len(st.cite_note):
                proj = np.full(n, -np.inf, dtype=np.float64)
                s = note_d[st.cite_note].astype(np.float64)
                ok = ~np.isnan(s)
                np.maximum.at(proj, st.cite_record[ok], s[ok])
                proj[~mask] = -np.inf
                nrows = np.flatnonzero(np.isfinite(proj))
                nrows = nrows[np.argsort(-proj[nrows], kind="stable")][:depth]
                nscore = np.where(np.isfinite(proj), proj, np.nan)
                lists.append(RankedList("note_dense", nrows, nscore))
        if options.hybrid or options.keyword_only:
            klist = _lexical_list("keyword", st.keyword.score(options.query), mask, depth)
            k_rank[klist.rows] = np.arange(1, len(klist.rows) + 1)
            k_score = klist.scores
            lists = [klist] if options.keyword_only else [lists[0], klist, *lists[1:]]
            if st.sparse is not None:
                lists.append(_lexical_list("sparse", st.sparse.score(options.query), mask, depth))
            if st.session_kw is not None:
                per_session = st.session_kw.score(options.query)
                per_row = np.where(st.session_of >= 0, per_session[np.maximum(st.session_of, 0)], 0.0)
                lists.append(_lexical_list("session", per_row, mask, depth))
        fused = None
        if len(lists) >= 2:
            fused = make_fusion(options.fusion, options.rrf_k, options.fusion_weights).fuse(lists, n)
            base = fused
        else:
            base = np.full(n, -np.inf, dtype=np.float64)
            only = lists[0]
            base[only.rows] = only.scores[only.rows]
        boosted = False
        if options.participant_boost and st.participants and options.participant_boost_sigma > 0:
            qwords = set(words(options.query))
            named = [m for p, m in st.participants.items() if p in qwords or p.split()[0] in qwords]
            if named:
                base = participant_boost(base, np.logical_or.reduce(named), options.participant_boost_sigma)
                boosted = True
        if fused is not None or boosted:
            cand = np.flatnonzero(np.isfinite(base))
            tie = np.nan_to_num(d_score[cand], nan=-9.0)
            ranked = cand[np.lexsort((-tie, -base[cand]))]
        else:
            ranked = lists[0].rows
        main_score = base
        f_rank = np.zeros(n, dtype=np.int64)
        if fused is not None:
            f_rank[ranked] = np.arange(1, len(ranked) + 1)
        if options.dedupe:
            kept, dropped_pos = dedupe_sets((st.word_sets[i] for i in ranked), DEDUPE_JACCARD, options.max_results)
            chosen = [int(ranked[i]) for i in kept]
            dropped = [(st.rows[ranked[a]].id, st.rows[ranked[b]].id, j) for a, b, j in dropped_pos]
        else:
            chosen, dropped = [int(i) for i in ranked[: options.max_results]], []

        if options.hybrid and st.tfidf is st.keyword and not np.isnan(k_score).all():
            text = np.nan_to_num(k_score, nan=0.0)
        else:
            text = st.tfidf.score(options.query)

        def opt(arr: np.ndarray, i: int) -> int | None:
            return int(arr[i]) or None

        def optf(arr: np.ndarray, i: int) -> float | None:
            v = arr[i]
            return None if np.isnan(v) else float(v)

        hits = [
            SearchHit(
                entry=st.rows[i], score=float(main_score[i]), rank=r,
                dense_rank=opt(d_rank, i), dense_score=optf(d_score, i),
                keyword_rank=opt(k_rank, i), keyword_score=optf(k_score, i),
                fused_rank=opt(f_rank, i), fused_score=None if fused is None else float(fused[i]),
                text_score=float(text[i]),
            )
            for r, i in enumerate(chosen, start=1)
        ]
        return hits, dropped

    # ------------------------------------------------------------------------- persistence
    def save(self, path: str | os.PathLike[str] | None = None) -> Path:
        """Write every key's fitted embedder and vectors (atomic; NumPy ``.npz``, no pickle).

        The file holds a JSON manifest (format version, settings, per-key fingerprint of the store's
        rows) and a sha256 of the manifest and of every array, checked on load. FAISS and keyword
        structures are rebuilt from the vectors on load (milliseconds at LoCoMo size); what is kept is
        what costs: the embedder fit and the embeddings.
        """
        target = Path(path or self.persist_path or "")
        if not str(target):
            raise ValueError("HybridIndex.save: no path given and no persist_path set")
        target.parent.mkdir(parents=True, exist_ok=True)
        keys: list[dict[str, Any]] = []
        arrays: dict[str, np.ndarray] = {}
        saved = dict(self._saved)
        for key, st in self._states.items():
            if st.dirty or st.stale:
                continue  # not built from the store's current rows: nothing trustworthy to save
            fitted = st.embedder.fitted_state() if st.embedder is not None and st.embedder.needs_fit else None
            if st.embedder is not None and st.embedder.needs_fit and fitted is None and st.rows:
                continue
            ids = [e.id for e in st.rows]
            mat = st.matrix if st.matrix is not None and ids else np.zeros((0, 0))
            saved[key] = _SavedKey(
                fingerprint=entries_fingerprint(list(st.entries.values())), fit_n=st.fit_n,
                fit_version=st.fit_version, ids=ids, hashes=[st.vectors[i][0] for i in ids],
                vfit=[int(st.vectors[i][1]) for i in ids],
                vectors=np.asarray(mat, dtype=np.float32), embedder_meta=None if fitted is None else fitted[0],
                embedder_arrays={} if fitted is None else fitted[1])
        for i, (key, sk) in enumerate(saved.items()):
            prefix = f"k{i}"
            arrays[f"{prefix}.vectors"] = sk.vectors
            for name, arr in sk.embedder_arrays.items():
                arrays[f"{prefix}.emb.{name}"] = np.asarray(arr)
            keys.append({"app_name": key.app_name, "user_id": key.user_id, "prefix": prefix,
                         "fingerprint": sk.fingerprint, "fit_n": sk.fit_n, "fit_version": sk.fit_version,
                         "ids": sk.ids, "hashes": sk.hashes, "vfit": sk.vfit, "embedder_meta": sk.embedder_meta,
                         "embedder_arrays": sorted(sk.embedder_arrays)})
        manifest = {"format": "memlab-index", "version": INDEX_FORMAT, "config": self._config(), "keys": keys,
                    "sha256": {name: _array_sha(arr) for name, arr in arrays.items()}}
        mbytes = json.dumps(manifest, sort_keys=True).encode("utf-8", "surrogatepass")
        arrays["manifest"] = np.frombuffer(mbytes, dtype=np.uint8)
        arrays["manifest_sha256"] = np.frombuffer(hashlib.sha256(mbytes).hexdigest().encode("ascii"), dtype=np.uint8)
        write_with(target, lambda f: np.savez(f, **arrays), binary=True)
        return target

    def _config(self) -> dict[str, Any]:
        emb = self.embedder if isinstance(self.embedder, str) else self.embedder.embedder_id
        params = {k: v for k, v in self.embedder_params.items() if k != "api_key"}  # never written to disk
        config = {"embedder": emb, "index": self.index, "keyword": self.keyword,
                  "embedder_params": params, "date_in_text": self.date_in_text, "append_citing": self.append_citing,
                  "ef_search": self.ef_search, "ef_construction": self.ef_construction}
        config.update({k: getattr(self, k) for k in LATER_SETTINGS if getattr(self, k)})
        return config

    def load(self, path: str | os.PathLike[str]) -> bool:
        """Read a saved index; False when there is none for these settings. A file that is
        unreadable, truncated, of another format version or fails a checksum is reported (by path),
        moved aside and rebuilt from the store -- never used."""
        try:
            manifest, arrays = _read_index_file(path)
        except _BadIndex as e:
            moved = quarantine(path)
            report("index", path, str(e), "rebuilt from the store", moved)
            return False
        if manifest.get("config") != self._config():
            return False  # built with other settings: not corrupt, just not this index
        for k in manifest["keys"]:
            pre = k["prefix"]
            self._saved[UserKey(k["app_name"], k["user_id"])] = _SavedKey(
                fingerprint=k["fingerprint"], fit_n=int(k["fit_n"]), fit_version=int(k["fit_version"]),
                ids=list(k["ids"]), hashes=list(k["hashes"]), vfit=[int(x) for x in k["vfit"]],
                vectors=arrays[f"{pre}.vectors"], embedder_meta=k["embedder_meta"],
                embedder_arrays={n: arrays[f"{pre}.emb.{n}"] for n in k["embedder_arrays"]})
        return True

    def _from_saved(self, key: UserKey, entries: list[MemoryEntry]) -> _KeyState | None:
        """A key's state from the saved index, if it was saved for exactly these rows."""
        sk = self._saved.pop(key, None)
        if sk is None or sk.fingerprint != entries_fingerprint(entries) or set(sk.ids) != {e.id for e in entries}:
            return None
        emb = self._new_embedder()
        if sk.embedder_meta is not None:
            try:
                emb.load_fitted_state(sk.embedder_meta, sk.embedder_arrays)
            except (ValueError, KeyError, NotImplementedError):
                return None
        elif emb.needs_fit and entries:
            return None
        st = _KeyState(entries={e.id: e for e in entries}, embedder=emb, fit_n=sk.fit_n, fit_version=sk.fit_version)
        rows = sorted(entries, key=lambda e: (e.created_at, e.id))
        texts = [index_text(e, self.date_in_text) for e in rows]
        if len(sk.ids) != len(sk.vectors) and sk.ids:
            return None
        st.vectors = {mid: (hsh, fv, sk.vectors[i]) for i, (mid, hsh, fv) in enumerate(zip(sk.ids, sk.hashes, sk.vfit))}
        if any(st.vectors[e.id][0] != _h(t) for e, t in zip(rows, texts)):
            return None  # saved for other index texts (e.g. date_in_text changed)
        self._derive(st, rows, texts)
        return st

    def verify_against(self, key: UserKey, entries: list[MemoryEntry]) -> None:
        """Use the saved state of a key only if the store holds exactly the rows it was built from
        (the store is the truth); a live key whose rows changed is refreshed."""
        if key in self._states:
            self.refresh(key, entries)
            return
        st = self._from_saved(key, entries)
        if st is not None:
            self._states[key] = st

    def export_key(self, key: UserKey) -> bytes | None:
        """One key's fitted state (embedder fit, vectors) in the saved-index format; None when not built.

        The fit depends on the order memories were written in (a corpus-fitted embedder is refitted only when
        the key grew by ``refit_growth``), so it travels with the rows rather than being rebuilt."""
        st = self._states.get(key)
        if st is None:
            return None
        one = self.twin()
        one._states = {key: st}
        with tempfile.TemporaryDirectory(prefix="memlab-index-") as d:
            return one.save(Path(d) / "key.npz").read_bytes()

    def import_key(self, key: UserKey, blob: bytes, entries: list[MemoryEntry]) -> bool:
        with tempfile.TemporaryDirectory(prefix="memlab-index-") as d:
            p = Path(d) / "key.npz"
            p.write_bytes(blob)
            if not self.load(p):
                return False
        self._states.pop(key, None)
        self.verify_against(key, entries)
        return key in self._states

    def close(self) -> None:
        if self.persist_path:
            self.save(self.persist_path)


class _BadIndex(Exception):
    pass


def _array_sha(arr: np.ndarray) -> str:
    a = np.ascontiguousarray(arr)
    return hashlib.sha256(f"{a.dtype.str}{a.shape}".encode() + a.tobytes()).hexdigest()


def _read_index_file(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The manifest and arrays of a saved index, every checksum verified (`_BadIndex` says what is wrong)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {name: z[name] for name in z.files}
    except Exception as e:  # zipfile.BadZipFile, CRC errors, truncation, ValueError on object arrays
        raise _BadIndex(f"unreadable ({type(e).__name__}: {str(e)[:120]})") from None
    if "manifest" not in arrays or "manifest_sha256" not in arrays:
        raise _BadIndex("no manifest (not a memlab index file)")
    mbytes = arrays.pop("manifest").tobytes()
    if hashlib.sha256(mbytes).hexdigest().encode("ascii") != arrays.pop("manifest_sha256").tobytes():
        raise _BadIndex("manifest fails its sha256")
    try:
        manifest = json.loads(mbytes)
    except ValueError as e:
        raise _BadIndex(f"manifest is not JSON ({e})") from None
    if manifest.get("format") != "memlab-index" or manifest.get("version") != INDEX_FORMAT:
        raise _BadIndex(f"format {manifest.get('format')!r} version {manifest.get('version')!r}, "
                        f"this memlab reads memlab-index version {INDEX_FORMAT}")
    sums = manifest.get("sha256", {})
    if set(sums) != set(arrays):
        raise _BadIndex("arrays do not match the manifest")
    for name, arr in arrays.items():
        if _array_sha(arr) != sums[name]:
            raise _BadIndex(f"array {name} fails its sha256")
    return manifest, arrays


def _with(h: SearchHit, **changes: Any) -> SearchHit:
    from dataclasses import replace

    return replace(h, **changes)
