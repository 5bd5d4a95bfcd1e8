"""One `MemoryService` interface, two backends (in-memory and durable SQLite) behind it.

The base class holds every rule (validation, key scoping, content ids, the op log, keeping the attached index
in step); a backend only stores rows. Writes are all-or-nothing: validation runs before anything is stored, and a
failed write is logged with its error; `MemoryService.atomic` makes a job's ops one write."""

from __future__ import annotations

import contextlib
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Literal, NewType

from memlab.memory.entry import (
    MemoryEntry,
    MemoryValidationError,
    UserKey,
    check_time_awareness,
    content_id,
    validate_fields,
)
from memlab.memory.search_types import Searcher, SearchOptions, SearchResult

if TYPE_CHECKING:
    import pandas as pd


class SearchUnavailableError(RuntimeError):
    """The service has no index attached (see `memlab.index.open_service`)."""


UpdateStatus = Literal["ok", "not_found"]
OpKind = Literal["add", "update", "delete", "clear"]
OpResult = Literal["added", "exists", "updated", "not_found", "deleted", "absent", "error"]
#: ``cleared:N`` (N entries removed), made by `cleared`; the one op-log result that carries a number.
Cleared = NewType("Cleared", str)


def cleared(n: int) -> Cleared:
    return Cleared(f"cleared:{n}")


@dataclass(frozen=True)
class UpdateResult:
    """Outcome of an update: ``ok`` with the new entry, or ``not_found`` (the caller decides what next)."""

    status: UpdateStatus
    entry: MemoryEntry | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass(frozen=True)
class OpRecord:
    """One line of the append-only operation log."""

    seq: int
    ts: datetime
    key: UserKey
    op: OpKind
    memory_id: str | None
    inputs: dict[str, Any]
    result: OpResult | Cleared
    error: str | None = None


def _fields_of(e: MemoryEntry) -> dict[str, Any]:
    return {"text": e.text, "kind": e.kind, "topics": e.topics, "event_time": e.event_time,
            "participants": e.participants, "location": e.location, "source_ids": e.source_ids}


def _inputs(fields: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in fields.items():
        if isinstance(v, datetime):
            v = v.isoformat()
        elif isinstance(v, tuple):
            v = list(v)
        out[k] = v
    return out


class MemoryService(ABC):
    """add / update / delete / clear / read_recent / search, scoped by `UserKey`, with an op log.

    Its read side is the `memlab.memory.capabilities.MemoryView` the answer arms see; what only some callers need
    is apart: copying a key to another store (`memlab.memory.shipping`), the extraction cursor (each backend's
    `memlab.memory.capabilities.ExtractionLog`)."""

    def __init__(self, searcher: Searcher | None = None) -> None:
        self.searcher = searcher
        self._lock = threading.RLock()

    def after_fork(self) -> None:
        """Called first in a forked child that will read this service (`memlab.run.forked`): reopen what must not
        cross a fork. Nothing to do for an in-memory backend."""
        return None

    # ----------------------------------------------------------------- backend storage primitives
    @abstractmethod
    def _get(self, key: UserKey, memory_id: str) -> MemoryEntry | None: ...

    @abstractmethod
    def _put(self, entry: MemoryEntry) -> None: ...

    @abstractmethod
    def _remove(self, key: UserKey, memory_id: str) -> bool: ...

    @abstractmethod
    def _remove_all(self, key: UserKey) -> int: ...

    @abstractmethod
    def _entries(self, key: UserKey) -> list[MemoryEntry]: ...

    def _count(self, key: UserKey) -> int:
        """How many memories a key holds (a backend that can count without reading them overrides this)."""
        return len(self._entries(key))

    @abstractmethod
    def _append_log(self, rec: OpRecord) -> None: ...

    @abstractmethod
    def _log(self, key: UserKey | None) -> list[OpRecord]: ...

    @abstractmethod
    def _next_seq(self) -> int: ...

    @abstractmethod
    def keys(self) -> list[UserKey]: ...

    def _transaction(self):
        """A context manager making one op atomic (SQLite overrides it)."""
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def atomic(self) -> Iterator[None]:
        """An extraction job's ops as one write: durable backends commit them together or not at all (a kill
        mid-job keeps none), one that fails is undone alone; other threads' ops wait for the batch."""
        with self._lock, self._transaction():
            yield

    # ----------------------------------------------------------------------------- public API
    def _any_event_time(self, key: UserKey, exclude_id: str | None = None) -> datetime | None:
        """Some stored event_time of this key (to refuse mixing naive and aware datetimes)."""
        for e in self._entries(key):
            if e.event_time is not None and e.id != exclude_id:
                return e.event_time
        return None

    def _write(self, entry: MemoryEntry) -> None:
        """The one path a stored entry takes: the backend row, then the attached index (so a hit
        never carries stale text or provenance)."""
        self._put(entry)
        if self.searcher is not None:
            self.searcher.on_upsert(entry)

    def _record(self, key: UserKey, op: OpKind, memory_id: str | None, inputs: dict[str, Any],
                result: OpResult | Cleared, error: str | None = None) -> None:
        self._append_log(OpRecord(self._next_seq(), datetime.now(timezone.utc), key, op, memory_id,
                                  _inputs(inputs), result, error))

    def add(
        self,
        key: UserKey,
        text: str,
        kind: str = "fact",
        topics: Any = (),
        event_time: datetime | None = None,
        participants: Any = (),
        location: str | None = None,
        source_ids: Any = (),
    ) -> MemoryEntry:
        """Store a memory; the same content again for the same key returns the existing entry
        (with the new source_ids merged into its provenance)."""
        raw = {"text": text, "kind": kind, "topics": topics, "event_time": event_time,
               "participants": participants, "location": location, "source_ids": source_ids}
        with self._lock:
            try:
                f = validate_fields(**raw)
                check_time_awareness(f["event_time"], self._any_event_time(key), "event_time")
            except MemoryValidationError as e:
                self._record(key, "add", None, {k: v for k, v in raw.items() if k != "topics"}, "error", str(e))
                raise
            mid = content_id(key, f["text"], f["kind"], f["event_time"])
            with self._transaction():
                existing = self._get(key, mid)
                if existing is not None:
                    merged = tuple(dict.fromkeys(existing.source_ids + f["source_ids"]))
                    entry = existing
                    if merged != existing.source_ids:
                        entry = existing.with_changes(source_ids=merged, updated_at=datetime.now(timezone.utc))
                        self._write(entry)
                    self._record(key, "add", mid, f, "exists")
                else:
                    now = datetime.now(timezone.utc)
                    entry = MemoryEntry(id=mid, key=key, created_at=now, updated_at=now, **f)
                    self._write(entry)
                    self._record(key, "add", mid, f, "added")
            return entry

    def update(self, key: UserKey, memory_id: str, text: str, kind: str | None = None, **fields: Any) -> UpdateResult:
        """Replace a memory's content (id kept stable); ``not_found`` when the key holds no such id.

        Fields not given keep their value; ``source_ids`` given are merged with the old provenance.
        """
        # read-modify-write in one write transaction: a concurrent writer (another process on the
        # same SQLite file) can neither slip in between the read and the write nor be overwritten
        unknown = set(fields) - {"topics", "event_time", "participants", "location", "source_ids"}
        if unknown:
            raise MemoryValidationError(f"update: unknown field(s) {sorted(unknown)}")
        with self._lock:
            error: MemoryValidationError | None = None
            with self._transaction():
                current = self._get(key, memory_id)
                if current is None:
                    self._record(key, "update", memory_id, {"text": text}, "not_found")
                    return UpdateResult("not_found")
                try:
                    entry = self._updated(key, current, text, kind, fields)
                except MemoryValidationError as e:
                    error = e
                else:
                    self._write(entry)
                    self._record(key, "update", memory_id, _fields_of(entry), "updated")
                    return UpdateResult("ok", entry)
            self._record(key, "update", memory_id, {"text": text}, "error", str(error))
            raise error

    def _updated(self, key: UserKey, current: MemoryEntry, text: str, kind: str | None,
                 fields: dict[str, Any]) -> MemoryEntry:
        f = validate_fields(**_revised(current, text, kind, fields))
        check_time_awareness(f["event_time"], self._any_event_time(key, current.id), "event_time")
        return current.with_changes(updated_at=datetime.now(timezone.utc), **f)

    def supersede(self, key: UserKey, memory_id: str, text: str, kind: str | None = None,
                  at: datetime | None = None, **fields: Any) -> UpdateResult:
        """An update that keeps history (the ``preserve-history`` policy).

        The new version is stored as its own memory (content id; the old provenance merged into its
        ``source_ids``); the old one stays, marked ``superseded_at`` (``at``, default now) and
        ``superseded_by`` the new id. An update of an already-superseded memory follows the chain to
        the current version; a new version whose content equals an older superseded one revives it.
        """
        # read the chain, check and write in one write transaction (as `update`): two processes superseding
        # one memory at once each see the other's new version, so one version stays current
        unknown = set(fields) - {"topics", "event_time", "participants", "location", "source_ids"}
        if unknown:
            raise MemoryValidationError(f"supersede: unknown field(s) {sorted(unknown)}")
        with self._lock:
            error: MemoryValidationError | None = None
            with self._transaction():
                current = self._current_version(key, memory_id)
                if current is None:
                    self._record(key, "update", memory_id, {"text": text}, "not_found")
                    return UpdateResult("not_found")
                try:
                    f = validate_fields(**_revised(current, text, kind, fields))
                    check_time_awareness(f["event_time"], self._any_event_time(key), "event_time")
                except MemoryValidationError as e:
                    error = e
                else:
                    return self._write_version(key, current, f, at)
            self._record(key, "update", memory_id, {"text": text}, "error", str(error))
            raise error

    def _current_version(self, key: UserKey, memory_id: str) -> MemoryEntry | None:
        """The memory ``memory_id``, or the current version its ``superseded_by`` chain leads to."""
        current = self._get(key, memory_id)
        seen: set[str] = set()
        while current is not None and current.superseded_by and current.id not in seen:
            seen.add(current.id)
            nxt = self._get(key, current.superseded_by)
            if nxt is None:
                break
            current = nxt
        return current

    def _write_version(self, key: UserKey, current: MemoryEntry, f: dict[str, Any], at: datetime | None
                       ) -> UpdateResult:
        """Store ``f`` as the version after ``current`` (inside the caller's write transaction)."""
        now = datetime.now(timezone.utc)
        mid = content_id(key, f["text"], f["kind"], f["event_time"])
        if mid == current.id:  # the same content: nothing to supersede, provenance merged
            entry = current
            if f["source_ids"] != current.source_ids:
                entry = current.with_changes(source_ids=f["source_ids"], updated_at=now)
                self._write(entry)
            self._record(key, "update", current.id, f, "exists")
            return UpdateResult("ok", entry)
        existing = self._get(key, mid)
        if existing is not None:
            merged = tuple(dict.fromkeys(existing.source_ids + f["source_ids"]))
            entry = existing.with_changes(source_ids=merged, updated_at=now, superseded_at=None, superseded_by=None)
        else:
            entry = MemoryEntry(id=mid, key=key, created_at=now, updated_at=now, **f)
        old = current.with_changes(superseded_at=at or now, superseded_by=mid)
        for e in (entry, old):
            self._write(e)
        self._record(key, "update", current.id, {**f, "superseded_by": mid}, "superseded")
        return UpdateResult("ok", entry)

    def delete(self, key: UserKey, memory_id: str) -> bool:
        """Delete one memory; a missing id is not an error (returns False)."""
        with self._lock, self._transaction():
            gone = self._remove(key, memory_id)
            if gone and self.searcher is not None:
                self.searcher.on_delete(key, memory_id)
            self._record(key, "delete", memory_id, {}, "deleted" if gone else "absent")
            return gone

    def clear(self, key: UserKey) -> int:
        """Delete every memory of one key (never another key's); returns how many."""
        with self._lock, self._transaction():
            n = self._remove_all(key)
            if self.searcher is not None:
                self.searcher.on_clear(key)
            self._record(key, "clear", None, {}, f"cleared:{n}")
            return n

    def get(self, key: UserKey, memory_id: str) -> MemoryEntry | None:
        with self._lock:
            return self._get(key, memory_id)

    def list(self, key: UserKey) -> list[MemoryEntry]:
        """All memories of a key, oldest first (by created_at, then id)."""
        with self._lock:
            return sorted(self._entries(key), key=lambda e: (e.created_at, e.id))

    def count(self, key: UserKey) -> int:
        with self._lock:
            return self._count(key)

    def replace_key(self, key: UserKey, entries: list[MemoryEntry]) -> None:
        """Make one key hold exactly ``entries``, as they are (ids, versions, timestamps): a copy of another store's
        key, not an edit, so no op is logged (`memlab.memory.shipping`). The index is told the key changed."""
        for entry in entries:  # checked before anything is removed: a refused copy leaves the key as it was
            if entry.key != key:
                raise ValueError(f"replace_key: entry {entry.id!r} belongs to {entry.key}, not {key}")
        with self._lock, self._transaction():
            self._remove_all(key)
            for entry in entries:
                self._put(entry)
            if self.searcher is not None:
                self.searcher.verify_against(key, self.list(key))

    def recovered_ids(self, key: UserKey) -> set[str] | None:
        """Ids of memories whose dialog ids were recovered by alignment (a memory system's store,
        `memlab.systems.SystemService`); None: every memory here knows its own."""
        return None

    def read_recent(self, key: UserKey, limit: int = 10) -> list[MemoryEntry]:
        """The ``limit`` most recently updated memories, newest first (``limit`` < 0: all)."""
        with self._lock:
            es = sorted(self._entries(key), key=lambda e: (e.updated_at, e.id), reverse=True)
            return es if limit < 0 else es[:limit]

    def search(self, key: UserKey, options: SearchOptions | str) -> SearchResult:
        """Search one key's memories; an empty query returns an empty result."""
        if isinstance(options, str):
            options = SearchOptions(query=options)
        if not options.query.strip() or options.max_results == 0:
            return SearchResult(query=options.query, options=options)
        if self.searcher is None:
            raise SearchUnavailableError("this MemoryService has no index; build one with memlab.index.open_service")
        with self._lock:
            if self._changed_elsewhere():
                self.searcher.mark_stale()  # re-read rows before searching: another process wrote or deleted
            return self.searcher.search(key, options, lambda: self._entries(key))

    def _changed_elsewhere(self) -> bool:
        """Whether someone else changed the stored rows since the last search (a shared file)."""
        return False

    def op_log(self, key: UserKey | None = None) -> list[OpRecord]:
        with self._lock:
            return self._log(key)

    def close(self) -> None:
        """Persist what the attached index keeps (if it does) and release the backend."""
        if self.searcher is not None:
            self.searcher.close()


def op_log_frame(service: MemoryService, key: UserKey | None = None) -> pd.DataFrame:
    """The op log as a table (one row per op, the key split into ``app_name`` and ``user_id``)."""
    import pandas as pd

    return pd.DataFrame(
        [
            {"seq": r.seq, "ts": r.ts, "app_name": r.key.app_name, "user_id": r.key.user_id, "op": r.op,
             "memory_id": r.memory_id, "result": r.result, "error": r.error, "inputs": r.inputs}
            for r in service.op_log(key)
        ]
    )


def _revised(current: MemoryEntry, text: str, kind: str | None, fields: dict[str, Any]) -> dict[str, Any]:
    """A new version's raw fields: the given ones over the current memory's, provenance merged (an
    update and a supersede revise a memory the same way; only what happens to the old one differs)."""
    return {
        "text": text,
        "kind": kind or current.kind,
        "topics": fields.get("topics", current.topics),
        "event_time": fields.get("event_time", current.event_time),
        "participants": fields.get("participants", current.participants),
        "location": fields.get("location", current.location),
        "source_ids": tuple(current.source_ids) + tuple(fields.get("source_ids") or ()),
    }
