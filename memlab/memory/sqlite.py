"""Durable SQLite backend (standard library): WAL, one write transaction per op or per batch of ops
(`MemoryService.atomic`: an extraction job's), versioned schema.

Integrity: every memory row carries a CRC-32 of its content and the file is checked on open
(size, header, ``PRAGMA quick_check``, schema version, row checksums); a bad file raises
`CacheCorruptError` naming the path, or, with ``on_corrupt="rebuild"`` (caches), is reported,
moved aside and started empty -- never used.

Concurrency: several processes may share one file. Every op is a read-modify-write inside one
``BEGIN IMMEDIATE`` transaction, op-log sequence numbers are assigned inside it, and before a
search the service checks ``PRAGMA data_version``: when another connection has committed, the
attached index re-reads the key's rows, so another process's writes and deletions are seen.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

from memlab.cache_integrity import CacheCorruptError, crc, quarantine, report, sqlite_file_problem
from memlab.memory.capabilities import TraceLine
from memlab.memory.entry import MemoryEntry, UserKey
from memlab.memory.search_types import Searcher
from memlab.memory.service import MemoryService, OpRecord

SCHEMA_VERSION = 3
#: Version 3 added the supersession columns of the preserve-history update policy.

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS memories (
    app_name TEXT NOT NULL, user_id TEXT NOT NULL, id TEXT NOT NULL,
    text TEXT NOT NULL, kind TEXT NOT NULL CHECK (kind IN ('fact', 'episode')),
    topics TEXT NOT NULL, event_time TEXT, participants TEXT NOT NULL, location TEXT,
    source_ids TEXT NOT NULL, created_at TEXT NOT NULL, updated_at TEXT NOT NULL,
    superseded_at TEXT, superseded_by TEXT, crc INTEGER NOT NULL,
    PRIMARY KEY (app_name, user_id, id)
);
CREATE TABLE IF NOT EXISTS oplog (
    seq INTEGER PRIMARY KEY, ts TEXT NOT NULL, app_name TEXT NOT NULL, user_id TEXT NOT NULL,
    op TEXT NOT NULL, memory_id TEXT, inputs TEXT NOT NULL, result TEXT NOT NULL, error TEXT
);
CREATE INDEX IF NOT EXISTS oplog_key ON oplog (app_name, user_id);
CREATE TABLE IF NOT EXISTS extraction_state (
    scope TEXT PRIMARY KEY, state TEXT NOT NULL, crc INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS extraction_trace (
    scope TEXT NOT NULL, job TEXT NOT NULL, line INTEGER NOT NULL, row TEXT NOT NULL, crc INTEGER NOT NULL,
    PRIMARY KEY (scope, job, line)
);
"""
_MEMORY_COLS = 14

class SchemaVersionError(RuntimeError):
    """The database was written by a different memlab schema version."""


def _dt(v: str | None) -> datetime | None:
    return None if v is None else datetime.fromisoformat(v)


class SQLiteMemoryService(MemoryService):
    """The embedded default: survives a restart; ``path=":memory:"`` for a private throwaway db."""

    def __init__(self, path: str | os.PathLike[str], searcher: Searcher | None = None,
                 on_corrupt: str = "raise", timeout: float = 30.0) -> None:
        """``on_corrupt``: ``"raise"`` (a durable store: a bad file is an error naming it) or
        ``"rebuild"`` (a cache: report it, move it aside, start empty so the caller re-extracts)."""
        if on_corrupt not in ("raise", "rebuild"):
            raise ValueError(f"on_corrupt: expected 'raise' or 'rebuild', got {on_corrupt!r}")
        super().__init__(searcher)
        self.path = str(path)
        self.on_corrupt = on_corrupt
        self._tx_depth = 0
        self._data_version: int | None = None
        self._timeout = timeout
        self._inherited: list[sqlite3.Connection] = []
        if self.path == ":memory:":
            self._conn = self._connect(timeout)
            return
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        problem = sqlite_file_problem(self.path) if Path(self.path).exists() else None
        if problem is None:
            try:
                self._conn = self._connect(timeout)
                problem = self.verify()
            except sqlite3.DatabaseError as e:
                problem = f"unreadable by SQLite ({e})"
            except SchemaVersionError as e:
                if on_corrupt == "raise":
                    raise
                problem = str(e).split(": ", 1)[-1]
            if problem is not None and getattr(self, "_conn", None) is not None:
                self._conn.close()
        if problem is not None:
            if on_corrupt == "raise":
                raise CacheCorruptError(f"{self.path}: memory store failed its integrity check: {problem}")
            moved = quarantine(self.path, ("-wal", "-shm"))
            report("memory-store", self.path, problem, "rebuilt empty (its contents are extracted again)", moved)
            self._conn = self._connect(timeout)

    def _connect(self, timeout: float) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=timeout)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("BEGIN IMMEDIATE")
            has_meta = conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'").fetchone()
            row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() if has_meta else None
            if row is not None and row[0] != str(SCHEMA_VERSION):
                raise SchemaVersionError(
                    f"{self.path}: schema version {row[0]}, this memlab reads version {SCHEMA_VERSION}"
                )
            for stmt in _SCHEMA.split(";"):
                if stmt.strip():
                    conn.execute(stmt)
            if row is None:
                conn.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            conn.close()
            raise
        return conn

    def verify(self) -> str | None:
        """Why this store's rows cannot be trusted (None: every row checksum matches)."""
        bad = []
        for r in self._conn.execute("SELECT * FROM memories"):
            if crc(*r[:_MEMORY_COLS]) != r[_MEMORY_COLS]:
                bad.append(f"memory {r[0]}/{r[1]}/{r[2]}")
        for scope, state, c in self._conn.execute("SELECT scope, state, crc FROM extraction_state"):
            if crc(scope, state) != c:
                bad.append(f"extraction state {scope}")
        for scope, job, line, row, c in self._conn.execute("SELECT * FROM extraction_trace"):
            if crc(scope, job, line, row) != c:
                bad.append(f"extraction trace {scope}/{job}/{line}")
        if bad:
            return f"{len(bad)} row(s) fail their checksum (first: {bad[0]})"
        return None

    @contextlib.contextmanager
    def _transaction(self):
        """The outermost level is the write transaction; the next one (an op inside `atomic`, or an op's log
        line) a savepoint, so a failing op is undone alone and the batch goes on; deeper levels join it."""
        depth = self._tx_depth
        if depth >= 2:
            yield
            return
        self._conn.execute("SAVEPOINT op" if depth else "BEGIN IMMEDIATE")
        self._tx_depth = depth + 1
        try:
            yield
        except BaseException:
            if depth:
                self._conn.execute("ROLLBACK TO op")
                self._conn.execute("RELEASE op")
            else:
                self._conn.execute("ROLLBACK")
                if self.searcher is not None:
                    self.searcher.mark_stale()  # it saw the undone writes: re-read the rows before the next search
            raise
        else:
            self._conn.execute("RELEASE op" if depth else "COMMIT")
        finally:
            self._tx_depth = depth

    def _row(self, r: tuple) -> MemoryEntry:
        return MemoryEntry(
            id=r[2], key=UserKey(r[0], r[1]), text=r[3], kind=r[4], topics=tuple(json.loads(r[5])),
            event_time=_dt(r[6]), participants=tuple(json.loads(r[7])), location=r[8],
            source_ids=tuple(json.loads(r[9])), created_at=_dt(r[10]), updated_at=_dt(r[11]),
            superseded_at=_dt(r[12]), superseded_by=r[13],
        )

    def _get(self, key, memory_id):
        r = self._conn.execute(
            "SELECT * FROM memories WHERE app_name=? AND user_id=? AND id=?", (key.app_name, key.user_id, memory_id)
        ).fetchone()
        return None if r is None else self._row(r)

    def _put(self, e):
        vals = (e.key.app_name, e.key.user_id, e.id, e.text, e.kind, json.dumps(list(e.topics)),
                None if e.event_time is None else e.event_time.isoformat(), json.dumps(list(e.participants)),
                e.location, json.dumps(list(e.source_ids)), e.created_at.isoformat(), e.updated_at.isoformat(),
                None if e.superseded_at is None else e.superseded_at.isoformat(), e.superseded_by)
        self._conn.execute("INSERT OR REPLACE INTO memories VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                           (*vals, crc(*vals)))

    def _remove(self, key, memory_id):
        cur = self._conn.execute(
            "DELETE FROM memories WHERE app_name=? AND user_id=? AND id=?", (key.app_name, key.user_id, memory_id)
        )
        return cur.rowcount > 0

    def _remove_all(self, key):
        cur = self._conn.execute("DELETE FROM memories WHERE app_name=? AND user_id=?", (key.app_name, key.user_id))
        return cur.rowcount

    def _entries(self, key):
        rows = self._conn.execute(
            "SELECT * FROM memories WHERE app_name=? AND user_id=?", (key.app_name, key.user_id)
        ).fetchall()
        return [self._row(r) for r in rows]

    def _count(self, key):
        # the extraction counts a key's memories four times per conversation: reading and decoding every row
        # for that was ~1 s of an offline LoCoMo-10 run
        return self._conn.execute(
            "SELECT COUNT(*) FROM memories WHERE app_name=? AND user_id=?", (key.app_name, key.user_id)
        ).fetchone()[0]

    def _any_event_time(self, key, exclude_id=None):
        r = self._conn.execute(
            "SELECT event_time FROM memories WHERE app_name=? AND user_id=? AND event_time IS NOT NULL AND id<>? "
            "LIMIT 1", (key.app_name, key.user_id, exclude_id or ""),
        ).fetchone()
        return None if r is None else _dt(r[0])

    def _append_log(self, rec: OpRecord):
        # the sequence number is taken inside the write transaction: other processes' ops never collide
        with self._transaction():
            self._conn.execute(
                "INSERT INTO oplog VALUES ((SELECT COALESCE(MAX(seq), 0) + 1 FROM oplog),?,?,?,?,?,?,?,?)",
                (rec.ts.isoformat(), rec.key.app_name, rec.key.user_id, rec.op, rec.memory_id,
                 json.dumps(rec.inputs, default=str), rec.result, rec.error),
            )

    def _log(self, key):
        q = "SELECT * FROM oplog"
        args: tuple = ()
        if key is not None:
            q += " WHERE app_name=? AND user_id=?"
            args = (key.app_name, key.user_id)
        rows = self._conn.execute(q + " ORDER BY seq", args).fetchall()
        return [OpRecord(r[0], _dt(r[1]), UserKey(r[2], r[3]), r[4], r[5], json.loads(r[6]), r[7], r[8])
                for r in rows]

    def _next_seq(self):
        return (self._conn.execute("SELECT COALESCE(MAX(seq), 0) FROM oplog").fetchone()[0]) + 1

    def _changed_elsewhere(self) -> bool:
        """True when another connection committed since the last call (``PRAGMA data_version``)."""
        v = self._conn.execute("PRAGMA data_version").fetchone()[0]
        changed = self._data_version is not None and v != self._data_version
        self._data_version = v
        return changed

    # -------------------------------------------------- the extraction cursor and trace (`ExtractionLog`)
    def extraction_state(self, scope: str) -> dict[str, Any] | None:
        with self._lock:
            r = self._conn.execute("SELECT state FROM extraction_state WHERE scope=?", (scope,)).fetchone()
        return None if r is None else json.loads(r[0])

    def save_extraction(self, scope: str, state: dict[str, Any], trace: Iterable[TraceLine] = ()) -> None:
        with self._lock, self._transaction():
            body = json.dumps(state, sort_keys=True, default=str)
            self._conn.execute("INSERT OR REPLACE INTO extraction_state VALUES (?,?,?)",
                               (scope, body, crc(scope, body)))
            for job, line, row in trace:
                text = json.dumps(row, default=str)
                self._conn.execute("INSERT OR IGNORE INTO extraction_trace VALUES (?,?,?,?,?)",
                                   (scope, job, line, text, crc(scope, job, line, text)))

    def extraction_trace(self, scopes: Iterable[str] | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return self._trace_rows(None if scopes is None else set(scopes))

    def _trace_rows(self, scopes: set[str] | None) -> list[dict[str, Any]]:
        # only the asked scopes' rows are read (the primary key's index): a streamed run asks for one key's lines
        # after each key, and reading every scope's rows each time made a question's peak memory grow with the
        # number of keys already extracted
        if scopes is None:
            return [json.loads(r) for (r,) in self._conn.execute("SELECT row FROM extraction_trace ORDER BY rowid")]
        rows = [r for sc in scopes for r in self._conn.execute(
            "SELECT rowid, row FROM extraction_trace WHERE scope=?", (sc,))]
        rows.sort(key=lambda r: r[0])  # the order written, across scopes
        return [json.loads(r) for _, r in rows]

    def keys(self):
        rows = self._conn.execute("SELECT DISTINCT app_name, user_id FROM memories ORDER BY 1, 2").fetchall()
        return [UserKey(a, u) for a, u in rows]

    def after_fork(self) -> None:
        """A forked child opens its own connection: one must not cross a fork (SQLite's "how to corrupt", 2.6).
        The inherited one is kept referenced and never used or closed here (closing it could checkpoint the
        parent's write-ahead log); `PRAGMA data_version` counts per connection, so the count starts afresh."""
        self._inherited.append(self._conn)
        self._conn = self._connect(self._timeout)
        self._data_version = None

    def close(self) -> None:
        super().close()
        self._conn.close()
