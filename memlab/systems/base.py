"""The `MemorySystem` interface and the read view the answer arms search through.

A system is anything that can take a conversation's sessions and later answer ``search(query, k)`` for one
user key: memlab's own pipeline (`memlab.systems.builtin`), mem0 (`memlab.systems.mem0`), or a user's class.
The answer arms never see the system: they get a `SystemService`, the `memlab.memory.MemoryView` that memlab's
`MemoryService` provides too (``search``/``list``/``read_recent``...), so every arm runs unchanged on every system
with the same top-k. A hit without turn ids gets the provenance recovered at ingest (`memlab.systems.provenance`),
marked as such.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from memlab.data.locomo import Conversation, Session
from memlab.memory.entry import MemoryEntry, UserKey
from memlab.memory.search_types import SearchHit, SearchOptions, SearchResult
from memlab.memory.service import MemoryService
from memlab.params import Component
from memlab.registry import Registry


class SystemFailure(RuntimeError):
    """A memory system cannot go on (the message says why and what to do): one line, the run marked failed."""


class SystemReplyError(SystemFailure):
    """A memory system's model gave a reply it cannot use (malformed JSON, empty): never a silent empty store."""


class StoreNotEmpty(SystemFailure):
    """A system's store folder holds something that is not this run's (another run's memories would be mixed in)."""


@dataclass(frozen=True)
class Message:
    """One message given to a system: who said it, its dialog id and when (the session's date)."""

    turn_id: str
    speaker: str
    text: str
    time: datetime | None = None


@dataclass(frozen=True)
class SystemHit:
    """A memory a system returned or stored. ``source_ids``: the dialog ids it came from when the system
    knows them (else empty, and the run recovers them: ``recovered`` then says so)."""

    memory_id: str
    text: str
    score: float = 0.0
    source_ids: tuple[str, ...] = ()
    recovered: bool = False
    session: str | None = None
    """The session it was ingested from, when the system says (recovery then looks only there)."""
    time: datetime | None = None
    participants: tuple[str, ...] = ()
    """Who said what it came from, when the system knows (the reader's who-did-what check reads it)."""
    metadata: dict[str, Any] = field(default_factory=dict)


def session_id(conv: Conversation, s: Session) -> str:
    return f"{conv.sample_id}:S{s.index}"


def session_messages(s: Session) -> list[Message]:
    """A LoCoMo session as messages (a shared photo's caption is part of what was said)."""
    return [Message(t.dia_id, t.speaker, t.searchable_text, s.date_time) for t in s.turns]


class MemorySystem(Component, ABC):
    """One memory system: ``ingest`` sessions per user key, ``search`` them; registered in `SYSTEMS`.

    A component (`memlab.params`): the constructor only stores its parameters, which ``system.params`` gives and
    ``memlab components`` lists; ``memories`` (what was stored, for the memory trace and provenance
    recovery), ``costs`` (its own counters) and ``features`` (what of its retrieval was active, for run.json)
    are optional.
    """

    name = "system"

    @classmethod
    def from_config(cls, params: dict[str, Any], ctx: dict[str, Any]) -> MemorySystem:
        """Build from ``system.params``; ``ctx`` has the run's ``config``, ``clients`` and ``run_dir``."""
        return cls(**params)

    @abstractmethod
    def ingest(self, key: UserKey, session: str, messages: list[Message]) -> None: ...

    @abstractmethod
    def search(self, key: UserKey, query: str, k: int) -> list[SystemHit]: ...

    def ingest_conversation(self, key: UserKey, conv: Conversation) -> None:
        """Every session of a conversation, oldest first."""
        for s in sorted(conv.sessions, key=lambda s: s.date_time):
            self.ingest(key, session_id(conv, s), session_messages(s))

    def memories(self, key: UserKey) -> list[SystemHit]:
        return []

    def costs(self) -> dict[str, Any]:
        return {}

    def features(self) -> dict[str, Any]:
        return {}

    def store_bytes(self) -> int | None:
        """What the system's store takes on disk after ingest (None: in memory, or it cannot say)."""
        return None

    def cache_id(self) -> str:
        """The system's name (run.json's ``system.id``; a system's store is the run's own, so no cache is keyed
        by its settings: run.json records them apart, `get_params`)."""
        return self.name

    def as_service(self) -> SystemService | MemoryService:
        """What the answer arms read through, a `MemoryView` (a system with a `MemoryService` of its own returns
        it); the run closes it."""
        return SystemService(self)

    def close(self) -> None:
        return None


#: Config sections only memlab's own pipeline reads, and the keys in them a run on another system still uses
#: (the top-k every arm gets; the model of a system's own extraction, e.g. mem0 with ``infer=True``).
PIPELINE_SECTIONS = ("extraction.", "store.", "index.", "retrieval.")
SYSTEM_READS = ("retrieval.top_k", "extraction.model")


def read_by_system(key: str, system: str) -> bool:
    """Whether a run on ``system`` reads the dotted config ``key`` (labels name only what made a difference)."""
    return system == "memlab" or key in SYSTEM_READS or not key.startswith(PIPELINE_SECTIONS)


#: Memory systems by config name (``system.name``).
SYSTEMS: Registry[MemorySystem] = Registry("memory system")


class SystemService:
    """The `memlab.memory.MemoryView` of any `MemorySystem` (the read side of a `MemoryService`), with recovered
    provenance filled in.

    Search options other than the query and ``max_results`` are the system's own business (recorded as its
    ``features``); ``recovered`` maps a key's memory ids to the dialog ids recovery gave them.
    """

    def __init__(self, system: MemorySystem):
        self.system = system
        self.recovered: dict[UserKey, dict[str, tuple[str, ...]]] = {}
        self.speakers: dict[UserKey, dict[str, tuple[str, ...]]] = {}
        """Per key, memory id -> the speakers of its recovered turns (for memories that name none)."""

    def recovered_ids(self, key: UserKey) -> set[str]:
        return set(self.recovered.get(key, {}))

    def entry(self, key: UserKey, h: SystemHit) -> MemoryEntry:
        ids = h.source_ids or self.recovered.get(key, {}).get(h.memory_id, ())
        who = h.participants or self.speakers.get(key, {}).get(h.memory_id, ())
        return MemoryEntry(id=h.memory_id, key=key, text=h.text, kind="episode" if h.time else "fact",
                           event_time=h.time, source_ids=tuple(ids), participants=tuple(who))

    def search(self, key: UserKey, options: SearchOptions) -> SearchResult:
        hits = self.system.search(key, options.query, options.max_results) if options.query.strip() else []
        out = [SearchHit(entry=self.entry(key, h), score=float(h.score), rank=i + 1, dense_rank=i + 1,
                         dense_score=float(h.score)) for i, h in enumerate(hits[:options.max_results])]
        return SearchResult(query=options.query, options=replace(options), hits=out)

    def list(self, key: UserKey) -> list[MemoryEntry]:
        return [self.entry(key, h) for h in self.system.memories(key)]

    def count(self, key: UserKey) -> int:
        return len(self.system.memories(key))

    def read_recent(self, key: UserKey, limit: int = 10) -> list[MemoryEntry]:
        es = list(reversed(self.list(key)))
        return es if limit < 0 else es[:limit]

    def close(self) -> None:
        self.system.close()
