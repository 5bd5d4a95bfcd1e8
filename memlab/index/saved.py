"""Saving and restoring a `memlab.index.hybrid.HybridIndex`'s keys (the seam between searching a key and
keeping it): the whole index to a file on close and back on open, one key to bytes and back (a Ray task's
result). The file format is `memlab.index.persist`'s; what is built from a loaded key is the index's own
`_derive`, so a restored key searches exactly as a freshly built one.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memlab.cache_integrity import quarantine, report
from memlab.index.embedders import Embedder
from memlab.index.memory_fields import index_text
from memlab.index.persist import (
    BadIndexFile,
    SavedKey,
    entries_fingerprint,
    manifest_settings,
    read_index,
    saved_key,
    text_hash,
    write_index,
)
from memlab.index.ranking import KeyState
from memlab.memory.entry import MemoryEntry, UserKey


class SavedIndex:
    """The persistence half of `memlab.index.hybrid.HybridIndex` (it provides ``_states``, ``_saved``,
    ``persist_path``, ``date_in_text``, ``_new_embedder`` and ``_derive``)."""

    _states: dict[UserKey, KeyState]
    _saved: dict[UserKey, SavedKey]
    persist_path: str | None
    date_in_text: bool

    _new_embedder: Callable[[], Embedder]
    _derive: Callable[[KeyState, list[MemoryEntry], list[str]], None]

    def settings(self) -> dict[str, Any]:
        """What a saved index must have been written with (`memlab.index.persist.manifest_settings` of this
        index's settings)."""
        return manifest_settings(self)

    def save(self, path: str | os.PathLike[str] | None = None) -> Path:
        """Write every key's fitted embedder and vectors (atomic; `memlab.index.persist`'s format)."""
        target = Path(path or self.persist_path or "")
        if not str(target):
            raise ValueError("HybridIndex.save: no path given and no persist_path set")
        return self._write(target, self._states)

    def _write(self, target: Path, states: dict[UserKey, KeyState]) -> Path:
        """Write ``states`` (those built from the store's current rows) plus the keys loaded and not yet used."""
        saved = dict(self._saved)
        for key, st in states.items():
            sk = saved_key(st)
            if sk is not None:
                saved[key] = sk
        return write_index(target, self.settings(), saved)

    def load(self, path: str | os.PathLike[str]) -> bool:
        """Read a saved index; False when there is none for these settings. A file that is
        unreadable, truncated, of another format version or fails a checksum is reported (by path),
        moved aside and rebuilt from the store -- never used."""
        try:
            keys = read_index(path, self.settings())
        except BadIndexFile as e:
            moved = quarantine(path)
            report("index", path, str(e), "rebuilt from the store", moved)
            return False
        if keys is None:
            return False  # built with other settings: not corrupt, just not this index
        self._saved.update(keys)
        return True

    def _from_saved(self, key: UserKey, entries: list[MemoryEntry]) -> KeyState | None:
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
        st = KeyState(entries={e.id: e for e in entries}, embedder=emb, fit_n=sk.fit_n, fit_version=sk.fit_version)
        rows = sorted(entries, key=lambda e: (e.created_at, e.id))
        texts = [index_text(e, self.date_in_text) for e in rows]
        if len(sk.ids) != len(sk.vectors) and sk.ids:
            return None
        st.vectors = {mid: (hsh, fv, sk.vectors[i]) for i, (mid, hsh, fv) in enumerate(zip(sk.ids, sk.hashes, sk.vfit))}
        if any(st.vectors[e.id][0] != text_hash(t) for e, t in zip(rows, texts)):
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
        sk = saved_key(st)
        with tempfile.TemporaryDirectory(prefix="memlab-index-") as d:
            return write_index(Path(d) / "key.npz", self.settings(), {} if sk is None else {key: sk}).read_bytes()

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
