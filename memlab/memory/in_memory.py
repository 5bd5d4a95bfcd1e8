"""The dict-backed `MemoryService` (every rule is the base class's; this only keeps the rows and, as an
`memlab.memory.capabilities.ExtractionLog`, the extraction cursor)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from memlab.memory.capabilities import TraceLine
from memlab.memory.entry import MemoryEntry, UserKey
from memlab.memory.search_types import Searcher
from memlab.memory.service import MemoryService, OpRecord


class InMemoryMemoryService(MemoryService):
    """Dict-backed store: fast, lost at exit; for tests and throwaway sweeps."""

    def __init__(self, searcher: Searcher | None = None) -> None:
        super().__init__(searcher)
        self._data: dict[UserKey, dict[str, MemoryEntry]] = {}
        self._oplog: list[OpRecord] = []
        self._states: dict[str, dict[str, Any]] = {}
        self._trace: dict[tuple[str, str, int], dict[str, Any]] = {}

    # ------------------------------------------------------- the extraction cursor (`ExtractionLog`)
    def extraction_state(self, scope: str) -> dict[str, Any] | None:
        with self._lock:
            st = self._states.get(scope)
            return None if st is None else dict(st)

    def save_extraction(self, scope: str, state: dict[str, Any], trace: Iterable[TraceLine] = ()) -> None:
        with self._lock:
            self._states[scope] = dict(state)
            for job, line, row in trace:
                self._trace.setdefault((scope, job, line), row)

    def extraction_trace(self, scopes: Iterable[str] | None = None) -> list[dict[str, Any]]:
        wanted = None if scopes is None else set(scopes)
        with self._lock:
            return [r for (sc, _, _), r in self._trace.items() if wanted is None or sc in wanted]

    # ------------------------------------------------------------------------------ the rows
    def _get(self, key, memory_id):
        return self._data.get(key, {}).get(memory_id)

    def _put(self, entry):
        self._data.setdefault(entry.key, {})[entry.id] = entry

    def _remove(self, key, memory_id):
        return self._data.get(key, {}).pop(memory_id, None) is not None

    def _remove_all(self, key):
        return len(self._data.pop(key, {}))

    def _entries(self, key):
        return list(self._data.get(key, {}).values())

    def _append_log(self, rec):
        self._oplog.append(rec)

    def _log(self, key):
        return [r for r in self._oplog if key is None or r.key == key]

    def _next_seq(self):
        return len(self._oplog) + 1

    def keys(self):
        return sorted(k for k, v in self._data.items() if v)
