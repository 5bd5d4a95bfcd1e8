"""The on-disk response cache: a rerun makes zero model calls (checksummed rows; a bad file is rebuilt)."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
from typing import Any

from memlab.llm.types import Completion

#: Format of the response cache file; a file of another format is reported and started afresh.
RESPONSE_CACHE_FORMAT = 2


def _check_response_db(conn: sqlite3.Connection) -> str | None:
    from memlab.cache_integrity import versioned_table

    return versioned_table(conn, "responses", "h TEXT PRIMARY KEY, model TEXT, body TEXT, sha256 TEXT NOT NULL",
                           RESPONSE_CACHE_FORMAT)


def _body_sha(h: str, model: str, body: str) -> str:
    return hashlib.sha256(f"{h}\x1f{model}\x1f{body}".encode("utf-8", "surrogatepass")).hexdigest()


class ResponseCache:
    """SQLite table of request hash -> completion JSON (thread-safe, WAL), each entry with a sha256.

    A bad file is reported, set aside and started afresh; an entry whose checksum or JSON is wrong
    is reported, deleted and treated as a miss (the call is made again), never returned.
    """

    def __init__(self, path: str | os.PathLike[str]):
        from memlab.cache_integrity import open_sqlite_cache

        self.path = str(path)
        self._conn = open_sqlite_cache(self.path, "response-cache", _check_response_db)
        self._lock = threading.Lock()

    def get(self, h: str) -> dict[str, Any] | None:
        with self._lock:
            r = self._conn.execute("SELECT model, body, sha256 FROM responses WHERE h=?", (h,)).fetchone()
        if r is None:
            return None
        model, body, sha = r
        problem = None
        if not isinstance(body, str) or _body_sha(h, model, body) != sha:
            problem = "fails its checksum"
        else:
            try:
                out = json.loads(body)
                Completion.from_json(out, h)
            except (ValueError, TypeError, KeyError) as e:
                problem = f"does not parse ({type(e).__name__})"
        if problem is None:
            return out
        from memlab.cache_integrity import report

        report("response-cache", self.path, f"entry {h[:12]} ({model}) {problem}", "entry dropped, call made again")
        with self._lock, self._conn:
            self._conn.execute("DELETE FROM responses WHERE h=?", (h,))
        return None

    def put(self, h: str, model: str, body: dict[str, Any]) -> None:
        text = json.dumps(body)
        with self._lock, self._conn:
            self._conn.execute("INSERT OR REPLACE INTO responses VALUES (?,?,?,?)",
                               (h, model, text, _body_sha(h, model, text)))

    def close(self) -> None:
        """Release the file (constructing the cache created or checked it)."""
        with self._lock:
            self._conn.close()

    def delete(self, h: str) -> None:
        with self._lock, self._conn:
            self._conn.execute("DELETE FROM responses WHERE h=?", (h,))
