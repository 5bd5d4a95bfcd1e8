"""Copying one key of a store to another store: its rows, and its built index state where the searcher can ship it.

What the Ray executor sends between the driver and its workers, and what a streamed run keeps of each key's fit:
plain rows (`MemoryEntry.to_dict`, ids, versions and timestamps kept) and the searcher's bytes
(`memlab.memory.capabilities.ExportsKeys`). It is not part of `MemoryService`: only these callers copy keys.
"""

from __future__ import annotations

from typing import Any

from memlab.memory.capabilities import ExportsKeys
from memlab.memory.entry import MemoryEntry, UserKey
from memlab.memory.service import MemoryService


def export_rows(service: MemoryService, key: UserKey) -> list[dict[str, Any]]:
    """One key's memories as plain rows, oldest first: what `import_rows` takes to make another store's key equal."""
    return [e.to_dict() for e in service.list(key)]


def import_rows(service: MemoryService, key: UserKey, rows: list[dict[str, Any]]) -> None:
    """Replace one key's memories with `export_rows` output, as stored there (`MemoryService.replace_key`: no op
    logged, a copy, not an edit); a row of another key is refused before anything changes."""
    entries = [MemoryEntry.from_dict(d) for d in rows]
    for entry in entries:
        if entry.key != key:
            raise ValueError(f"import_rows: row {entry.id!r} belongs to {entry.key}, not {key}")
    service.replace_key(key, entries)


def export_index(service: MemoryService, key: UserKey) -> bytes | None:
    """One key's built index state (None when none is built, or the searcher cannot ship its state)."""
    searcher = service.searcher
    if not isinstance(searcher, ExportsKeys):
        return None
    with service.atomic():  # no write of another thread lands mid-export
        return searcher.export_key(key)


def import_index(service: MemoryService, key: UserKey, blob: bytes | None) -> bool:
    """Install `export_index` output for a key whose rows equal the exporter's; False when there is none, the
    searcher cannot take it, or it was built with other settings or for other rows (the key then builds)."""
    searcher = service.searcher
    if blob is None or not isinstance(searcher, ExportsKeys):
        return False
    with service.atomic():
        return searcher.import_key(key, blob, service.list(key))
