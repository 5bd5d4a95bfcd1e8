"""The search contract of a `MemoryService`: options in, traced hits out (the algorithm is `memlab.index`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from memlab.plain import check_version, from_fields, plain

if TYPE_CHECKING:
    from memlab.memory.entry import MemoryEntry, UserKey

RRF_K_DEFAULT = 60
KIND_FALLBACK_MIN_HITS = 3
DEDUPE_JACCARD = 0.80
#: The version of a retrieval-trace hit (`HitRecord`); a hit of another is an error on read.
HIT_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class SearchOptions:
    """Search options exactly as DESIGN.md lists them (defaults are tRPC-Agent-Go's)."""

    query: str = ""
    kind: str | None = None
    after: datetime | None = None
    """Only memories whose event_time is at or after this (memories without event_time are excluded)."""
    before: datetime | None = None
    max_results: int = 10
    similarity_threshold: float | None = None
    """Minimum dense cosine score; applied to the dense list before fusion."""
    order_by_event_time: bool = False
    kind_fallback: bool = True
    dedupe: bool = True
    hybrid: bool = True
    rrf_k: int = RRF_K_DEFAULT
    keyword_only: bool = False
    """Rank by the keyword list alone (an ablation arm; hybrid is ignored)."""
    feedback: int = 0
    """Rocchio pseudo-relevance feedback on the dense query from the top ``feedback`` hits (0 = off)."""
    participant_boost: bool = False
    """When the query names a participant, add ``participant_boost_sigma`` standard deviations of the
    fused scores to that participant's memories (a who-did-what signal that cannot sink a question naming
    the wrong person; memlab's addition, measured in ``benchmarks/retrieval_recall.py``)."""
    participant_boost_sigma: float = 1.0
    include_superseded: bool = True
    """Whether memories superseded under the ``preserve-history`` update policy are searched. They are
    by default (answering sees the history, so temporal questions about a change can be answered);
    the extraction worker's old-memory lookup and reconcile search only current memories."""
    fusion: str = "rrf"
    """How the dense and keyword lists become one ranking: ``rrf`` or ``zscore`` (`memlab.index.fusion`)."""
    unit: str = "memory"
    """``memory``: rank every memory. ``turn``: rank the dialog-turn records only, each scored with the
    memories that cite it (their dense scores fused in as the ``note_dense`` list; `memlab.index.hybrid`)."""
    fusion_weights: Mapping[str, float] | None = None
    """Weight per list name (``dense``, ``keyword``, ``note_dense``, ``sparse``, ``session``); a list not named
    weighs 1."""
    notes_only: bool = False
    """Leave out the verbatim dialog-turn records (`memlab.index.hybrid.is_turn_record`): what an extractor that
    keeps the turns beside its own memories (``turns+llm``) reads as old memories and reconciles against."""

    def __post_init__(self) -> None:
        if self.max_results < 0:
            raise ValueError(f"SearchOptions.max_results: expected >= 0, got {self.max_results}")
        if self.rrf_k <= 0:
            raise ValueError(f"SearchOptions.rrf_k: expected > 0, got {self.rrf_k}")
        if self.notes_only and self.unit == "turn":
            raise ValueError("SearchOptions: notes_only leaves out the turn records that unit='turn' returns; "
                             "expected one of them")
        if isinstance(self.participant_boost_sigma, bool) or not isinstance(self.participant_boost_sigma,
                                                                              (int, float)) \
                or self.participant_boost_sigma < 0:
            raise ValueError(f"SearchOptions.participant_boost_sigma: expected a number >= 0, "
                             f"got {self.participant_boost_sigma!r}")
        if self.unit not in ("memory", "turn"):
            raise ValueError(f"SearchOptions.unit: expected 'memory' or 'turn', got {self.unit!r}")
        if self.kind is not None and self.kind not in ("fact", "episode"):
            raise ValueError(f"SearchOptions.kind: expected 'fact', 'episode' or None, got {self.kind!r}")

    def to_dict(self) -> dict[str, Any]:
        d = plain(self)
        for k in ("after", "before"):
            d[k] = None if d[k] is None else d[k].isoformat()
        d["fusion_weights"] = None if self.fusion_weights is None else dict(self.fusion_weights)
        return d


@dataclass(frozen=True)
class SearchHit:
    """One returned memory with everything the trace needs about how it got there."""

    entry: MemoryEntry
    score: float
    """The score the hit was ranked by: fused RRF score when hybrid, else the single signal's."""
    rank: int
    dense_rank: int | None = None
    dense_score: float | None = None
    keyword_rank: int | None = None
    keyword_score: float | None = None
    fused_rank: int | None = None
    fused_score: float | None = None
    text_score: float | None = None
    """TF-IDF cosine of query and memory, in [0, 1] whatever the keyword scorer: the bounded lexical
    score reconcile reads for corpus-fitted embedders."""
    via: str = "primary"
    """``primary`` or ``kind-fallback`` (added by the unfiltered second search)."""

    @property
    def id(self) -> str:
        return self.entry.id


@dataclass
class HitRecord:
    """One hit as the retrieval trace stores it (``traces/retrieval.jsonl``, each query's ``hits``): the one
    definition the answer stage writes with and `memlab.trace` reads with. ``evidence_hit`` is set when the
    question's evidence is known (`memlab.run.answering`)."""

    rank: int
    id: str
    source_ids: list[str]
    score: float
    dense_rank: int | None = None
    dense_score: float | None = None
    keyword_rank: int | None = None
    keyword_score: float | None = None
    fused_rank: int | None = None
    fused_score: float | None = None
    via: str = "primary"
    kind: str | None = None
    evidence_hit: bool | None = None
    provenance: str | None = None
    """A memory system's hit: ``exact`` dialog ids or ``recovered`` by alignment (`memlab.systems`)."""
    schema: int = HIT_SCHEMA_VERSION

    @classmethod
    def of(cls, h: SearchHit) -> HitRecord:
        return cls(rank=h.rank, id=h.id, source_ids=list(h.entry.source_ids), score=h.score,
                   dense_rank=h.dense_rank, dense_score=h.dense_score, keyword_rank=h.keyword_rank,
                   keyword_score=h.keyword_score, fused_rank=h.fused_rank, fused_score=h.fused_score, via=h.via,
                   kind=h.entry.kind)

    def to_dict(self) -> dict[str, Any]:
        """The trace row (``evidence_hit`` only once it is known, as the trace has always been written)."""
        d = plain(self)
        for k in ("evidence_hit", "provenance"):  # written only when known / when the store is a system's
            if d[k] is None:
                del d[k]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "hit") -> HitRecord:
        """A hit read back (strict: `memlab.plain.from_fields`; ValueError naming ``where`` and the fields; a hit of
        another schema version too)."""
        check_version(d, HIT_SCHEMA_VERSION, where)
        return from_fields(cls, d, where)


#: The hit's fields as the retrieval trace's table has them (its schema version is checked on read, not kept).
HIT_COLUMNS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(HitRecord) if f.name != "schema")


@dataclass
class SearchResult:
    query: str
    options: SearchOptions
    hits: list[SearchHit] = field(default_factory=list)
    dropped_by_dedupe: list[tuple[str, str, float]] = field(default_factory=list)
    """(dropped id, kept id, Jaccard) for every hit removed as a near-duplicate."""
    fallback_added: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.hits)

    def __iter__(self):
        return iter(self.hits)

    @property
    def entries(self) -> list[MemoryEntry]:
        return [h.entry for h in self.hits]

    @property
    def source_ids(self) -> list[str]:
        return list(dict.fromkeys(s for h in self.hits for s in h.entry.source_ids))


@runtime_checkable
class Searcher(Protocol):
    """What a `MemoryService` delegates search to (implemented by `memlab.index.HybridIndex`).

    The service calls the ``on_*`` hooks inside every write so the index never drifts from the store. These are
    the methods a run cannot do without; what it uses where a searcher has it (encode queries ahead, ship a
    key's built state, release a key ...) is an optional protocol of `memlab.memory.capabilities`.
    """

    #: Which hit score reconcile compares with its thresholds (`memlab.extract.reconcile`): ``dense``
    #: (``SearchHit.score``, a cosine) or ``tfidf`` (``SearchHit.text_score``, for corpus-fitted embedders).
    reconcile_signal: str

    def on_upsert(self, entry: MemoryEntry) -> None: ...

    def on_delete(self, key: UserKey, memory_id: str) -> None: ...

    def on_clear(self, key: UserKey) -> None: ...

    def search(
        self, key: UserKey, options: SearchOptions, load_entries: Callable[[], list[MemoryEntry]]
    ) -> SearchResult:
        """Search one key; ``load_entries`` hydrates a key the index has not seen since start-up."""
        ...

    def ensure_built(self, key: UserKey, load_entries: Callable[[], list[MemoryEntry]]) -> None:
        """Build (or refresh) one key's index now, so a later search pays no build time."""
        ...

    def entries(self, key: UserKey, load_entries: Callable[[], list[MemoryEntry]]) -> list[MemoryEntry]:
        """The key's memories as the index holds them (kept in sync by the ``on_*`` hooks): the trace reads them
        per question, where reading the store costs more (0.14 s per question in SQLite at LoCoMo size)."""
        ...

    def mark_stale(self) -> None:
        """Another writer changed the store: re-read each key's rows (``load_entries``) before its next search."""
        ...

    def keys(self) -> list[UserKey]:
        """The keys the index holds (restored from disk or built since start-up)."""
        ...

    def verify_against(self, key: UserKey, entries: list[MemoryEntry]) -> None:
        """Drop what the index holds for a key when it no longer matches the store's entries."""
        ...

    def close(self) -> None:
        """Persist what the index keeps (if anything) and release it."""
        ...
