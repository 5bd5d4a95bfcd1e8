"""Durable SQLite backend (standard library): WAL, one transaction per op, versioned schema."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from datetime import datetime
from pathlib import Path

from memlab.memory.entry import MemoryEntry, UserKey
from memlab.memory.search_types import Searcher
from memlab.memory.service import MemoryService, OpRecord

SCHEMA_VERSION = 2
#: Version 2 added the two supersession columns; a version-1 file is migrated in place on open.

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS memories (
    app_name TEXT NOT NULL, user_id TEXT NOT NULL, id TEXT NOT NULL,
    text TEXT NOT NULL, kind TEXT NOT NULL CHECK (kind IN ('fact', 'episode')),
    topics TEXT NOT NULL, event_time TEXT, participants TEXT NOT NULL, location TEXT,
    source_ids TEXT NOT NULL, created_at TEXT NOT NULL, updated_at TEXT NOT NULL,
    superseded_at TEXT, superseded_by TEXT,
    PRIMARY KEY (app_name, user_id, id)
);
CREATE TABLE IF NOT EXISTS oplog (
    seq INTEGER PRIMARY KEY, ts TEXT NOT NULL, app_name TEXT NOT NULL, user_id TEXT NOT NULL,
    op TEXT NOT NULL, memory_id TEXT, inputs TEXT NOT NULL, result TEXT NOT NULL, error TEXT
);
CREATE INDEX IF NOT EXISTS oplog_key ON oplog (app_name, user_id);
"""


class SchemaVersionError(RuntimeError):
    """The database was written by a different memlab schema version."""


def _dt(v: str | None) -> datetime | None:
    return None if v is None else datetime.fromisoformat(v)


class SQLiteMemoryService(MemoryService):
    """The embedded default: survives a restart; ``path=":memory:"`` for a private throwaway db."""

    def __init__(self, path: str | os.PathLike[str], searcher: Searcher | None = None) -> None:
        super().__init__(searcher)
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.executescript(_SCHEMA)
        row = self._conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is None:
            self._conn.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        elif int(row[0]) == 1:  # version 1 -> 2: add the supersession columns (existing rows stay current)
            self._conn.executescript("BEGIN; ALTER TABLE memories ADD COLUMN superseded_at TEXT; "
                                     "ALTER TABLE memories ADD COLUMN superseded_by TEXT; "
                                     "UPDATE meta SET value='2' WHERE key='schema_version'; COMMIT;")
        elif int(row[0]) != SCHEMA_VERSION:
            raise SchemaVersionError(
                f"{self.path}: schema version {row[0]}, this memlab reads version {SCHEMA_VERSION}"
            )
        self._in_tx = False

    @contextlib.contextmanager
    def _transaction(self):
        if self._in_tx:
            yield
            return
        self._conn.execute("BEGIN IMMEDIATE")
        self._in_tx = True
        try:
            yield
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        else:
            self._conn.execute("COMMIT")
        finally:
            self._in_tx = False

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
        self._conn.execute(
            "INSERT OR REPLACE INTO memories VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (e.key.app_name, e.key.user_id, e.id, e.text, e.kind, json.dumps(list(e.topics)),
             None if e.event_time is None else e.event_time.isoformat(), json.dumps(list(e.participants)),
             e.location, json.dumps(list(e.source_ids)), e.created_at.isoformat(), e.updated_at.isoformat(),
             None if e.superseded_at is None else e.superseded_at.isoformat(), e.superseded_by),
        )

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

    def _any_event_time(self, key, exclude_id=None):
        r = self._conn.execute(
            "SELECT event_time FROM memories WHERE app_name=? AND user_id=? AND event_time IS NOT NULL AND id<>? "
            "LIMIT 1", (key.app_name, key.user_id, exclude_id or ""),
        ).fetchone()
        return None if r is None else _dt(r[0])

    def _append_log(self, rec: OpRecord):
        with self._transaction():
            self._conn.execute(
                "INSERT INTO oplog VALUES (?,?,?,?,?,?,?,?,?)",
                (rec.seq, rec.ts.isoformat(), rec.key.app_name, rec.key.user_id, rec.op, rec.memory_id,
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

    def keys(self):
        rows = self._conn.execute("SELECT DISTINCT app_name, user_id FROM memories ORDER BY 1, 2").fetchall()
        return [UserKey(a, u) for a, u in rows]

    def close(self) -> None:
        super().close()
        self._conn.close()
