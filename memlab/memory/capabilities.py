"""Optional abilities of a searcher or a store, each a small runtime-checkable protocol.

A `Searcher` needs only the methods a run cannot do without; what a caller can use when it is there (encode
queries ahead, build several keys side by side, ship a key's built state, drop a key from memory) is a separate
protocol here, tested with ``isinstance`` where it is used -- never a ``getattr`` probe -- so a user's searcher
implements what it has and nothing else (tRPC-Agent-Go's memory package: a small service, capabilities apart).
The answer arms read memory through `MemoryView`, which memlab's store and any memory system's view both provide.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from memlab.memory.entry import MemoryEntry, UserKey
    from memlab.memory.search_types import SearchOptions, SearchResult

#: A trace line of the extraction: (job id, line number within the job, the row).
TraceLine = tuple[str, int, dict[str, Any]]


@runtime_checkable
class PreparesQueries(Protocol):
    """Encodes a run's queries for a key in one batch before its searches (`memlab.run.answering`)."""

    def prepare_queries(self, key: UserKey, queries: list[str],
                        load_entries: Callable[[], list[MemoryEntry]]) -> int:
        """How many queries it encoded (their vectors are then ready for the searches)."""
        ...


@runtime_checkable
class TimesQueryEncoding(Protocol):
    """Says what encoding a query costs, apart from the search (the retrieval benchmark's ``encode_ms``)."""

    def encode_ms(self, key: UserKey, queries: list[str], load_entries: Callable[[], list[MemoryEntry]]) -> float:
        ...


@runtime_checkable
class EncodesAhead(Protocol):
    """Encodes the memories of every key about to build in one pass per model, before any key builds."""

    def encode_ahead(self, entries_by_key: Mapping[UserKey, Sequence[MemoryEntry]]) -> int:
        ...


@runtime_checkable
class PlansBuilds(Protocol):
    """Says whether building is computation on the rows alone (``model_free``: no model pass, so keys may build
    side by side in threads and answer in forked processes) and which keys would build now."""

    @property
    def model_free(self) -> bool: ...

    def needs_build(self, key: UserKey) -> bool: ...


@runtime_checkable
class ReleasesKeys(Protocol):
    """Drops what it holds in memory for a key (the store keeps the rows): a run streaming many keys frees each."""

    def release(self, key: UserKey) -> None: ...


@runtime_checkable
class ExportsKeys(Protocol):
    """Ships one key's built state as bytes, and installs it in a copy holding the same rows (the Ray executor,
    a streamed run's saved fits); a searcher without it rebuilds a copied key from its rows."""

    def export_key(self, key: UserKey) -> bytes | None:
        """None when the key is not built."""
        ...

    def import_key(self, key: UserKey, blob: bytes, entries: list[MemoryEntry]) -> bool:
        """False (nothing installed) when it was built with other settings or for other rows."""
        ...


@runtime_checkable
class MemoryView(Protocol):
    """What an answer arm reads memory through: memlab's `MemoryService` and a memory system's
    `memlab.systems.SystemService` both provide it, so every arm runs unchanged on every system."""

    def search(self, key: UserKey, options: SearchOptions) -> SearchResult: ...

    def list(self, key: UserKey) -> list[MemoryEntry]:
        """A key's memories, oldest first."""
        ...

    def count(self, key: UserKey) -> int: ...

    def read_recent(self, key: UserKey, limit: int = 10) -> list[MemoryEntry]:
        """The ``limit`` most recent memories, newest first (``limit`` < 0: all)."""
        ...

    def recovered_ids(self, key: UserKey) -> set[str] | None:
        """Ids whose dialog ids were recovered by alignment (a memory system's); None: every memory knows its own."""
        ...


@runtime_checkable
class ExtractionLog(Protocol):
    """A store that keeps each conversation's extraction cursor and trace lines beside its memories (both
    backends do): what makes an extraction resumable and its trace readable after a kill."""

    def extraction_state(self, scope: str) -> dict[str, Any] | None:
        """The cursor state saved for ``scope`` (a conversation), or None."""
        ...

    def save_extraction(self, scope: str, state: dict[str, Any], trace: Iterable[TraceLine] = ()) -> None:
        """A scope's cursor state and its new trace lines in one transaction (a kill keeps both or neither); a
        line is keyed by (scope, job, line), so writing it twice keeps one copy."""
        ...

    def extraction_trace(self, scopes: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """Saved trace lines in the order written (``scopes``: only these conversations)."""
        ...


def extraction_log(service: object) -> ExtractionLog:
    """``service`` as an `ExtractionLog`; a store that keeps none is an error naming its class."""
    if not isinstance(service, ExtractionLog):
        raise TypeError(f"{type(service).__name__} keeps no extraction cursor (memlab.memory.ExtractionLog): "
                        "extract into an SQLiteMemoryService or InMemoryMemoryService")
    return service
