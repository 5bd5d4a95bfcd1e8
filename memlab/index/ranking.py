"""One key's ranking: the filters, the ranked lists a search fuses (each from a pluggable producer), fusion,
the participant boost, dedupe and the cut (DESIGN, Search options). `memlab.index.hybrid` builds the state
this reads (`KeyState`) and keeps it in sync with the store; nothing here writes it.

A *producer* turns a `RankRequest` into one named `RankedList` (or None when its signal is off for these
options or this index). `PRODUCERS` lists them in fusion order (`memlab.index.fusion.LIST_NAMES`): the
order is part of the result, since RRF sums floating-point terms in it. A `HybridIndex` subclass may set
its own ``producers``.

Search order (DESIGN, Search options): filter by kind and time window -> dense list (similarity
threshold applies here) and keyword list (plus, with ``unit="turn"``, the ``note_dense`` list) -> fusion
(``rrf`` = sum 1/(k + rank), DESIGN's rule, or ``zscore``; `memlab.index.fusion`) -> optional participant
boost (sigma of the fused scores) -> dedupe (word-set Jaccard >= 0.80 keeps the higher-ranked) -> cut to
max_results -> kind fallback (< 3 hits: search again without the kind, merge after the kind hits) ->
optional order by event time.

Two optional lists (both off by default, fused by name like the others): ``sparse`` (``sparse="splade"``,
a second lexical scorer over the same keyword texts; learned expansion finds turns that share no word
with the question) and ``session`` (``session_text=True``: each turn record also gets the keyword score of
its whole session, BM25 over the records sharing its event time, joined; a turn in the session the question
is about moves up, `benchmarks/retrieval_recall.py`). Every turn of a session shares its session score, so
the list carries no order within a session: it is meant for z-score fusion (under RRF those ties are broken
by row order, which favours a session's early turns).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from memlab.index.dense import DenseIndex
from memlab.index.embedders import Embedder
from memlab.index.fusion import RankedList, dedupe_sets, make_fusion, participant_boost
from memlab.index.keyword import KeywordScorer, TfidfScorer
from memlab.index.text import words
from memlab.memory.entry import MemoryEntry
from memlab.memory.search_types import DEDUPE_JACCARD, SearchHit, SearchOptions

#: Up to this many memories per key, every list is ranked in full (exact RRF); above it, each list
#: is cut at ``max(DEPTH_MIN, DEPTH_FACTOR * max_results)`` candidates.
FULL_RANK_LIMIT = 20_000
DEPTH_MIN = 100
DEPTH_FACTOR = 10
#: Rocchio weight of the feedback centroid (``SearchOptions.feedback``), measured in the recall benchmark.
FEEDBACK_WEIGHT = 0.5

Dropped = list[tuple[str, str, float]]


@dataclass
class KeyState:
    """One user key's built index: its rows (memories in write order), their vectors and every structure a
    ranking reads."""

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
    last_fused: FusedRanking | None = None  # the last search's fused order (`_fused_ranking`)
    live: tuple[list[MemoryEntry], np.ndarray] | None = None  # (rows, which of them are not superseded)
    last_query: tuple[Embedder, int, str, np.ndarray] | None = None  # (embedder, fit version, query, vector)

    def fitted_query_vector(self, query: str) -> np.ndarray:
        """The query projected by this key's corpus-fitted embedder [1, d], kept for the next call: the answer's
        search and the trace's deeper search of one question ask for it twice in a row."""
        last = self.last_query
        if last is not None and last[0] is self.embedder and last[1] == self.fit_version and last[2] == query:
            return last[3]
        assert self.embedder is not None
        v = self.embedder.embed_query([query])
        v.flags.writeable = False  # shared by the searches that reuse it
        self.last_query = (self.embedder, self.fit_version, query, v)
        return v


@dataclass
class RankRequest:
    """What every producer reads for one ranking: the state, the options, the rows the filters allow
    (``mask``: may be returned; ``dense_mask``: scored by the dense list) and the list depth."""

    st: KeyState
    options: SearchOptions
    mask: np.ndarray
    dense_mask: np.ndarray
    depth: int
    query_vector: Callable[[], np.ndarray]
    _dense: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    @property
    def n(self) -> int:
        return len(self.st.rows)

    def dense_search(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The dense candidates (scores, row ids, whether ``dense_mask`` and the similarity threshold keep
        each), searched once per request and shared by the ``dense`` and ``note_dense`` lists."""
        if self._dense is None:
            n, depth, dense_mask = self.n, self.depth, self.dense_mask
            q = self.query_vector()
            want = depth if dense_mask.all() else min(n, depth * 4)
            while True:
                D, Ids = self.st.dense.search(q, want)
                valid = Ids[0] >= 0
                D, Ids = D[0][valid], Ids[0][valid]
                keep = dense_mask[Ids]
                if want >= n or int(keep.sum()) >= depth:
                    break
                want = min(n, want * 4)
            if self.options.similarity_threshold is not None:
                keep &= D >= self.options.similarity_threshold
            self._dense = (D, Ids, keep)
        return self._dense


def _nan_to(x: np.ndarray, value: float) -> np.ndarray:
    """``np.nan_to_num(x, nan=value)`` in one pass for scores (no infinity; with one, nan_to_num itself)."""
    out = np.where(np.isnan(x), x.dtype.type(value), x)
    return np.nan_to_num(x, nan=value) if np.isinf(out).any() else out


def lexical_list(name: str, scores: np.ndarray, mask: np.ndarray, depth: int) -> RankedList:
    """The rows the filters allow with a score > 0, best first, cut at ``depth`` (scores NaN elsewhere)."""
    cand = np.flatnonzero(mask & (scores > 0))
    rows = cand[np.argsort(-scores[cand], kind="stable")][:depth]
    kept = np.full(len(scores), np.nan, dtype=np.float32)
    kept[rows] = scores[rows]
    return RankedList(name, rows, kept)


def _lexical_on(o: SearchOptions) -> bool:
    return o.hybrid or o.keyword_only


def dense_list(req: RankRequest) -> RankedList | None:
    """FAISS nearest rows to the query vector (with ``unit="turn"``, the turn records among them)."""
    if req.options.keyword_only:
        return None
    D, Ids, keep = req.dense_search()
    if req.options.unit == "turn":
        keep = keep & req.mask[Ids]
    dl = Ids[keep][: req.depth]
    scores = np.full(req.n, np.nan, dtype=np.float32)
    scores[dl] = D[keep][: req.depth]
    return RankedList("dense", dl, scores)


def note_dense_list(req: RankRequest) -> RankedList | None:
    """Each turn record scored by the best dense score among the notes citing it (``unit="turn"``)."""
    st = req.st
    if req.options.keyword_only or req.options.unit != "turn" or not len(st.cite_note):
        return None
    D, Ids, keep = req.dense_search()
    note_d = np.full(req.n, np.nan, dtype=np.float32)
    note_d[Ids[keep]] = D[keep]
    proj = np.full(req.n, -np.inf, dtype=np.float64)
    s = note_d[st.cite_note].astype(np.float64)
    ok = ~np.isnan(s)
    np.maximum.at(proj, st.cite_record[ok], s[ok])
    proj[~req.mask] = -np.inf
    nrows = np.flatnonzero(np.isfinite(proj))
    nrows = nrows[np.argsort(-proj[nrows], kind="stable")][: req.depth]
    return RankedList("note_dense", nrows, np.where(np.isfinite(proj), proj, np.nan))


def keyword_list(req: RankRequest) -> RankedList | None:
    """The index's keyword scorer (TF-IDF, BM25 ...) over the keyword texts."""
    if not _lexical_on(req.options):
        return None
    return lexical_list("keyword", req.st.keyword.score(req.options.query), req.mask, req.depth)


def sparse_list(req: RankRequest) -> RankedList | None:
    """The optional second lexical scorer (``sparse``, e.g. SPLADE)."""
    if not _lexical_on(req.options) or req.st.sparse is None:
        return None
    return lexical_list("sparse", req.st.sparse.score(req.options.query), req.mask, req.depth)


def session_list(req: RankRequest) -> RankedList | None:
    """Each turn record scored by BM25 over its whole session (``session_text``)."""
    st = req.st
    if not _lexical_on(req.options) or st.session_kw is None:
        return None
    per_session = st.session_kw.score(req.options.query)
    per_row = np.where(st.session_of >= 0, per_session[np.maximum(st.session_of, 0)], 0.0)
    return lexical_list("session", per_row, req.mask, req.depth)


Producer = Callable[[RankRequest], "RankedList | None"]
#: The lists a search fuses, in fusion order (`memlab.index.fusion.LIST_NAMES`).
PRODUCERS: tuple[Producer, ...] = (dense_list, keyword_list, note_dense_list, sparse_list, session_list)


def filter_mask(st: KeyState, options: SearchOptions, kind: str | None) -> np.ndarray:
    """The rows the kind, time-window, superseded and notes-only filters allow."""
    mask = np.ones(len(st.rows), dtype=bool)
    if not options.include_superseded:
        if st.live is None or st.live[0] is not st.rows:  # worked out once per set of rows, not per search
            st.live = (st.rows, np.array([e.superseded_at is None for e in st.rows], dtype=bool))
        mask &= st.live[1]
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


def rank(st: KeyState, options: SearchOptions, kind: str | None, query_vector: Callable[[], np.ndarray],
         producers: Sequence[Producer] = PRODUCERS) -> tuple[list[SearchHit], Dropped]:
    """One ranked, deduped list under a kind filter (vectorised: ~0.1 ms at LoCoMo size).

    Every producer's list (over the rows the filters allow) is fused by ``options.fusion``, then the
    participant boost, dedupe and the cut; ``query_vector()`` gives the dense query vector [1, d].
    """
    mask = filter_mask(st, options, kind)
    n = len(st.rows)
    dense_mask = mask
    if options.unit == "turn":
        mask = mask & st.is_record
        dense_mask = mask | ~st.is_record  # notes are scored (then projected), never returned
    if not mask.any():
        return [], []
    depth = n if n <= FULL_RANK_LIMIT else max(DEPTH_MIN, DEPTH_FACTOR * options.max_results)
    f = _fused_ranking(st, options, kind, mask, dense_mask, depth, query_vector, producers)
    d_rank, k_rank, d_score, k_score, fused, base, ranked, f_rank = (
        f.d_rank, f.k_rank, f.d_score, f.k_score, f.fused, f.base, f.ranked, f.f_rank)
    if options.dedupe:
        kept, dropped_pos = dedupe_sets((st.word_sets[i] for i in ranked), DEDUPE_JACCARD, options.max_results)
        chosen = [int(ranked[i]) for i in kept]
        dropped = [(st.rows[ranked[a]].id, st.rows[ranked[b]].id, j) for a, b, j in dropped_pos]
    else:
        chosen, dropped = [int(i) for i in ranked[: options.max_results]], []

    if options.hybrid and st.tfidf is st.keyword and not np.isnan(k_score).all():
        text = _nan_to(k_score, 0.0)
    else:
        text = st.tfidf.score(options.query)

    # every column read once for the chosen rows (a Python loop over per-row numpy scalars cost more than the
    # ranking itself); .tolist() gives the same Python ints and floats as int()/float() of each element
    idx = np.asarray(chosen, dtype=np.int64)
    cols = zip(base[idx].tolist(), d_rank[idx].tolist(), d_score[idx].tolist(), k_rank[idx].tolist(),
               k_score[idx].tolist(), f_rank[idx].tolist(),
               [None] * len(chosen) if fused is None else fused[idx].tolist(), text[idx].tolist())
    hits = [
        SearchHit(
            entry=st.rows[i], score=b, rank=r,
            dense_rank=dr or None, dense_score=None if ds != ds else ds,  # NaN (not in the list) -> None
            keyword_rank=kr or None, keyword_score=None if ks != ks else ks,
            fused_rank=fr or None, fused_score=fs, text_score=ts,
        )
        for r, (i, (b, dr, ds, kr, ks, fr, fs, ts)) in enumerate(zip(chosen, cols), start=1)
    ]
    return hits, dropped


@dataclass
class FusedRanking:
    """The fused order of one search before dedupe and the cut (what `rank` reads), kept on the `KeyState` for
    the next identical request: a question's answer search and the trace's deeper search (`evidence_ranks`:
    ``max_results`` 100, no dedupe, no event-time order) fuse the same lists, which cost half of each search."""

    key: tuple
    mask: np.ndarray
    structures: tuple
    query_vector: np.ndarray | None
    d_rank: np.ndarray
    k_rank: np.ndarray
    d_score: np.ndarray
    k_score: np.ndarray
    fused: np.ndarray | None
    base: np.ndarray
    ranked: np.ndarray
    f_rank: np.ndarray


def _structures(st: KeyState) -> tuple:
    """What a fused ranking was computed from (a rebuild replaces every one of them)."""
    return (st.rows, st.dense, st.keyword, st.sparse, st.session_kw, st.participants, st.cite_note)


def _fused_ranking(st: KeyState, options: SearchOptions, kind: str | None, mask: np.ndarray,
                   dense_mask: np.ndarray, depth: int, query_vector: Callable[[], np.ndarray],
                   producers: Sequence[Producer]) -> FusedRanking:
    """Every producer's list fused (``options.fusion``), the participant boost and the order before dedupe; the
    last one computed is reused when the same rows, options (but for the cut, dedupe and event-time order),
    filters, depth, producers and query vector ask again."""
    key = (replace(options, max_results=0, dedupe=False, order_by_event_time=False), kind, depth, tuple(producers))
    memo = st.last_fused
    if (memo is not None and memo.key == key and all(a is b for a, b in zip(memo.structures, _structures(st)))
            and np.array_equal(memo.mask, mask)
            and (memo.query_vector is None or np.array_equal(memo.query_vector, query_vector()))):
        return memo
    used: list[np.ndarray] = []

    def vector() -> np.ndarray:
        if not used:
            used.append(query_vector())
        return used[0]

    n = len(st.rows)
    req = RankRequest(st, options, mask, dense_mask, depth, vector)
    lists = [lst for lst in (p(req) for p in producers) if lst is not None]
    by_name = {lst.name: lst for lst in lists}
    d_rank, k_rank = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)  # 0 = not in the list
    d_score = by_name["dense"].scores if "dense" in by_name else np.full(n, np.nan, dtype=np.float32)
    k_score = by_name["keyword"].scores if "keyword" in by_name else np.full(n, np.nan, dtype=np.float32)
    for arr, name in ((d_rank, "dense"), (k_rank, "keyword")):
        if name in by_name:
            arr[by_name[name].rows] = np.arange(1, len(by_name[name].rows) + 1)
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
        tie = _nan_to(d_score[cand], -9.0)
        ranked = cand[np.lexsort((-tie, -base[cand]))]
    else:
        ranked = lists[0].rows
    f_rank = np.zeros(n, dtype=np.int64)
    if fused is not None:
        f_rank[ranked] = np.arange(1, len(ranked) + 1)
    st.last_fused = FusedRanking(key, mask, _structures(st), used[0] if used else None, d_rank, k_rank, d_score,
                                 k_score, fused, base, ranked, f_rank)
    return st.last_fused


def feedback_query(st: KeyState, options: SearchOptions, kind: str | None, q: np.ndarray,
                   producers: Sequence[Producer] = PRODUCERS) -> np.ndarray | None:
    """Rocchio pseudo-relevance feedback: the query vector ``q`` moved toward its top ``feedback`` hits."""
    first, _ = rank(st, replace(options, feedback=0, dedupe=False, max_results=options.feedback), kind,
                    lambda: q, producers)
    if not first:
        return None
    top = np.vstack([st.matrix[st.row_of[h.id]] for h in first])
    moved = q[0] + FEEDBACK_WEIGHT * top.mean(axis=0)
    return (moved / (np.linalg.norm(moved) or 1.0)).astype(np.float32)[None, :]
