"""Caches check themselves: detect a bad file, report it by path, set it aside, rebuild.

Every cached artefact (extraction store, saved index, embedding cache, response cache) carries a
format version and a checksum or an integrity check. When one is truncated, zero bytes, bit-flipped
or unreadable, its owner calls `report` (a logger warning naming the path, plus an
`IntegrityEvent` kept in this process) and rebuilds it; the bad file is kept beside it as
``<name>.corrupt-<UTC stamp>`` for inspection. A run collects the events of its stages with
`collect` and writes them to ``run.json``, so a number computed after a rebuild says so.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

log = logging.getLogger("memlab.cache")

SQLITE_MAGIC = b"SQLite format 3\x00"


class CacheCorruptError(RuntimeError):
    """A cached or stored file failed its integrity check (the message names the path and the defect)."""


@dataclass(frozen=True)
class IntegrityEvent:
    """One detected defect: which artefact, where, what was wrong, what was done about it."""

    artefact: str  # extraction-store | index | embedding-cache | response-cache | ...
    path: str
    problem: str
    action: str  # rebuilt | re-fetched | entry dropped | ...
    moved_to: str | None = None
    at: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_events: list[IntegrityEvent] = []
_lock = threading.Lock()


def report(artefact: str, path: str | os.PathLike[str], problem: str, action: str,
           moved_to: str | os.PathLike[str] | None = None) -> IntegrityEvent:
    """Record a defect: a warning on the ``memlab.cache`` logger and an event `events` returns."""
    ev = IntegrityEvent(artefact, str(path), problem, action, None if moved_to is None else str(moved_to),
                        datetime.now(timezone.utc).isoformat(timespec="seconds"))
    with _lock:
        _events.append(ev)
    where = f" (bad file kept as {ev.moved_to})" if ev.moved_to else ""
    log.warning("%s %s: %s; %s%s", artefact, ev.path, problem, action, where)
    return ev


def events() -> list[IntegrityEvent]:
    """Every event reported in this process so far, oldest first."""
    with _lock:
        return list(_events)


def mark() -> int:
    """A position in the event list; `since` returns what was reported after it."""
    with _lock:
        return len(_events)


def since(position: int) -> list[IntegrityEvent]:
    with _lock:
        return list(_events[position:])


@contextlib.contextmanager
def collect() -> Iterator[list[IntegrityEvent]]:
    """``with collect() as evs:`` -- ``evs`` holds the events reported inside the block (for run.json)."""
    with _lock:
        start = len(_events)
    out: list[IntegrityEvent] = []
    try:
        yield out
    finally:
        with _lock:
            out.extend(_events[start:])


def quarantine(path: str | os.PathLike[str], companions: tuple[str, ...] = ()) -> Path | None:
    """Move a bad file (and e.g. its ``-wal``/``-shm`` companions) aside; returns the new path."""
    p = Path(path)
    if not p.exists():
        return None
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-%f")
    dest = p.with_name(f"{p.name}.corrupt-{stamp}")
    os.replace(p, dest)
    for suffix in companions:
        c = Path(str(p) + suffix)
        if c.exists():
            os.replace(c, Path(str(dest) + suffix))
    return dest


def crc(*parts: Any) -> int:
    """CRC-32 of some values (str, bytes, numbers, None), for per-row checks in SQLite caches."""
    h = 0
    for x in parts:
        b = x if isinstance(x, bytes) else ("\x00" if x is None else str(x)).encode("utf-8", "surrogatepass")
        h = zlib.crc32(len(b).to_bytes(8, "little") + b, h)
    return h


def sqlite_file_problem(path: str | os.PathLike[str], quick_check: bool = True) -> str | None:
    """Why an existing SQLite file cannot be trusted (None: it looks sound).

    SQLite itself opens a zero-byte or missing file as an empty database, which is how a truncated
    cache used to turn into "no memories" silently; so size and header are checked first, then
    ``PRAGMA quick_check`` (page structure, indexes).
    """
    p = Path(path)
    try:
        size = p.stat().st_size
        with open(p, "rb") as f:
            head = f.read(len(SQLITE_MAGIC))
    except OSError as e:
        return f"unreadable ({type(e).__name__}: {e})"
    if size == 0:
        return "empty file (0 bytes)"
    if head != SQLITE_MAGIC:
        return "not a SQLite database (bad header)"
    if size < 512 or size % 512:
        return f"truncated ({size} bytes is not a whole number of pages)"
    if not quick_check:
        return None
    try:
        conn = sqlite3.connect(f"file:{p}?mode=ro", uri=True, timeout=30)
        try:
            rows = conn.execute("PRAGMA quick_check").fetchall()
        finally:
            conn.close()
    except sqlite3.DatabaseError as e:
        return f"unreadable by SQLite ({e})"
    if rows != [("ok",)]:
        return "SQLite integrity check failed: " + "; ".join(str(r[0]) for r in rows[:3])
    return None


def versioned_table(conn: sqlite3.Connection, table: str, columns: str, version: int) -> str | None:
    """Create (or check) a cache's data ``table`` and its ``meta`` format row; a problem string when the
    file holds ``table`` without a format row (an older memlab) or with another version.

    The look and the create are one ``BEGIN IMMEDIATE`` transaction: two connections opening a new file
    at once (threads of one run, Ray tasks) must not see each other's half-made schema as an old file
    and set aside the file the other one is already writing to."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        row = conn.execute("SELECT value FROM meta WHERE key='format'").fetchone() if "meta" in tables else None
        problem = None
        if row is None and table in tables:
            problem = "written by an older memlab (no format version, no checksums)"
        elif row is not None and row[0] != str(version):
            problem = f"format version {row[0]}, this memlab reads {version}"
        else:
            conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            conn.execute(f"CREATE TABLE IF NOT EXISTS {table} ({columns})")
            conn.execute("INSERT OR IGNORE INTO meta VALUES ('format', ?)", (str(version),))
    except BaseException:
        conn.rollback()
        raise
    conn.commit()
    return problem


_open_locks: dict[str, threading.Lock] = {}


@contextlib.contextmanager
def _opening(p: Path) -> Iterator[None]:
    """Serialise the first look at a cache file between threads (a lock per path) and processes (an
    advisory ``flock`` on ``<name>.lock`` beside it, where the OS has one): a file another opener has
    just created is zero bytes for a moment, and must not be taken for a corrupt one and moved aside."""
    with _lock:
        tl = _open_locks.setdefault(str(p.resolve()), threading.Lock())
    with tl:
        try:
            import fcntl
        except ImportError:  # no advisory locks here: threads are still serialised
            yield
            return
        with open(p.with_name(p.name + ".lock"), "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)


def open_sqlite_cache(path: str | os.PathLike[str], artefact: str, check: Any = None,
                      timeout: float = 30.0) -> sqlite3.Connection:
    """Open a SQLite cache, rebuilding it if the file is bad.

    ``check(conn)`` may return a problem string (e.g. a wrong format version) or raise
    `sqlite3.DatabaseError`; either makes the file be reported, moved aside and started afresh.
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with _opening(p):
        return _open_checked(p, artefact, check, timeout)


def _open_checked(p: Path, artefact: str, check: Any, timeout: float) -> sqlite3.Connection:
    problem = sqlite_file_problem(p) if p.exists() else None
    conn: sqlite3.Connection | None = None
    if problem is None:
        try:
            conn = sqlite3.connect(str(p), check_same_thread=False, timeout=timeout)
            conn.execute("PRAGMA journal_mode=WAL")
            problem = check(conn) if check is not None else None
        except sqlite3.DatabaseError as e:
            problem = f"unreadable by SQLite ({e})"
        if problem is not None and conn is not None:
            conn.close()
            conn = None
    if problem is not None:
        moved = quarantine(p, ("-wal", "-shm"))
        report(artefact, p, problem, "rebuilt empty", moved)
        conn = sqlite3.connect(str(p), check_same_thread=False, timeout=timeout)
        conn.execute("PRAGMA journal_mode=WAL")
        if check is not None:
            check(conn)
    assert conn is not None
    return conn
