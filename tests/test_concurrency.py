"""Concurrent use loses nothing: processes sharing one SQLite store (issue 10).

Each test starts real OS processes (fork) on one file; all are bounded by a join timeout.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from datetime import datetime
from pathlib import Path

import pytest

from memlab.data import load_locomo
from memlab.extract.pipeline import conversation_key, extract_dataset
from memlab.index import open_service
from memlab.memory import SQLiteMemoryService, UserKey

A = UserKey("app", "alice")
CTX = mp.get_context("fork")
N = 150


def _run(targets: list[tuple], timeout: float = 120.0) -> list[int]:
    procs = [CTX.Process(target=t, args=a) for t, *a in targets]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
        if p.is_alive():
            p.kill()
            pytest.fail("a worker process hung")
    return [p.exitcode for p in procs]


def _updater(db: str, mid: str, tag: str, out: str) -> None:
    svc = SQLiteMemoryService(db)
    errors = 0
    for i in range(N):
        try:
            r = svc.update(A, mid, "Alice likes pottery", source_ids=[f"{tag}{i}"])
            assert r.ok
            assert svc.update(A, "no-such-id", "x").status == "not_found"  # logged as well
        except Exception as e:  # counted, reported to the parent
            errors += 1
            Path(out).write_text(f"{type(e).__name__}: {e}")
    svc.close()
    os._exit(1 if errors else 0)


def test_concurrent_updates_lose_nothing_and_op_log_numbers_never_collide(tmp_path):
    db = str(tmp_path / "store.db")
    s = SQLiteMemoryService(db)
    mid = s.add(A, "Alice likes pottery", source_ids=["D0:0"]).id
    s.close()
    codes = _run([(_updater, db, mid, "P", str(tmp_path / "p.err")), (_updater, db, mid, "Q", str(tmp_path / "q.err"))])
    errs = [p.read_text() for p in tmp_path.glob("*.err")]
    assert codes == [0, 0] and errs == []  # no IntegrityError on op-log sequence numbers, no lost lock
    s = SQLiteMemoryService(db)
    src = set(s.get(A, mid).source_ids)
    assert {f"P{i}" for i in range(N)} <= src and {f"Q{i}" for i in range(N)} <= src  # every acknowledged update
    log = s.op_log()
    assert len(log) == 1 + 4 * N and len({r.seq for r in log}) == len(log)
    s.close()


def _superseder(db: str, mid: str, tag: str, out: str) -> None:
    svc = SQLiteMemoryService(db)
    try:
        for i in range(N):
            assert svc.supersede(A, mid, f"Alice likes pottery, version {tag}{i}").ok
    except Exception as e:  # reported to the parent
        Path(out).write_text(f"{type(e).__name__}: {e}")
        os._exit(1)
    svc.close()
    os._exit(0)


def test_concurrent_supersedes_leave_one_current_version_and_one_unbroken_chain(tmp_path):
    """Issue 20: supersede() read the chain outside its write transaction, so two processes each wrote a
    'current' version after the same one (2 x 300 supersedes: 40 current versions, a chain of 535)."""
    db = str(tmp_path / "store.db")
    s = SQLiteMemoryService(db)
    first = s.add(A, "Alice likes pottery", source_ids=["D0:0"]).id
    s.close()
    codes = _run([(_superseder, db, first, "P", str(tmp_path / "p.err")),
                  (_superseder, db, first, "Q", str(tmp_path / "q.err"))])
    assert codes == [0, 0], [p.read_text() for p in tmp_path.glob("*.err")]
    s = SQLiteMemoryService(db)
    entries = {e.id: e for e in s.list(A)}
    current = [e for e in entries.values() if not e.superseded_by]
    assert len(current) == 1  # before: several versions each "current"
    chain, e = [], entries[first]
    while e is not None:
        chain.append(e.id)
        e = entries.get(e.superseded_by) if e.superseded_by else None
    assert len(chain) == len(set(chain)) == 2 * N + 1 == len(entries)  # every version on one chain
    s.close()


def _deleter(db: str, mid: str, text: str) -> None:
    svc = SQLiteMemoryService(db)
    svc.delete(A, mid)
    svc.add(A, text)
    svc.close()
    os._exit(0)


def test_a_long_lived_service_sees_other_processes_writes_and_deletions(tmp_path):
    db = str(tmp_path / "store.db")
    svc = open_service("sqlite", path=db)
    gone = svc.add(A, "Alice adopted a cat named Tom")
    svc.add(A, "Bob likes hiking")
    assert svc.search(A, "cat named Tom").hits[0].id == gone.id
    assert _run([(_deleter, db, gone.id, "Alice adopted a kitten named Tom")]) == [0]
    hits = svc.search(A, "cat named Tom").hits
    assert gone.id not in {h.id for h in hits}  # deleted elsewhere: never returned
    assert hits[0].entry.text == "Alice adopted a kitten named Tom"  # written elsewhere: found
    svc.close()


def _extractor(data_path: str, db: str) -> None:
    svc = open_service("sqlite", path=db, on_corrupt="rebuild")
    extract_dataset(svc, load_locomo(data_path), "turns")
    svc.close()
    os._exit(0)


def test_two_runs_sharing_a_store_do_not_duplicate_the_extraction_trace(synthetic_path, tmp_path):
    db = str(tmp_path / "store.db")
    SQLiteMemoryService(db).close()
    assert _run([(_extractor, str(synthetic_path), db), (_extractor, str(synthetic_path), db)]) == [0, 0]
    assert _run([(_extractor, str(synthetic_path), db)]) == [0]  # and a rerun after both
    svc = open_service("sqlite", path=db)
    trace = svc.extraction_trace()
    applied = [r for r in trace if r.get("op") == "add"]
    keys = [(r["conversation"], r.get("memory_id"), r.get("source_ids") and tuple(r["source_ids"])) for r in applied]
    assert len(keys) == len(set(keys))  # each job's lines once, whoever ran it
    data = load_locomo(synthetic_path)
    assert {c.sample_id: svc.count(conversation_key(c)) for c in data} == {"syn-1": 5, "syn-2": 2}
    assert len(trace) == 7
    svc.close()


def _killed_while_saving(data_path: str, db: str) -> None:
    """Extract, and die (SIGKILL-like ``os._exit``) right after the cursor row is written but
    before the trace lines are: in the middle of the save."""
    import memlab.memory.sqlite as sq

    real = sq.crc

    def crc(*parts):
        if parts and isinstance(parts[0], str) and len(parts) == 4 and parts[1].startswith("locomo:syn-2"):
            os._exit(9)  # the first trace line of the second conversation
        return real(*parts)

    sq.crc = crc
    svc = open_service("sqlite", path=db, on_corrupt="rebuild")
    extract_dataset(svc, load_locomo(data_path), "turns")
    os._exit(0)


def test_a_kill_between_cursor_and_trace_loses_neither(synthetic_path, tmp_path):
    db = str(tmp_path / "store.db")
    SQLiteMemoryService(db).close()
    assert _run([(_killed_while_saving, str(synthetic_path), db)]) == [9]
    svc = open_service("sqlite", path=db, on_corrupt="rebuild")
    # syn-1 was saved whole; syn-2's save was cut: neither its cursor nor any of its lines survive alone
    assert svc.extraction_state("syn-1") and {r["conversation"] for r in svc.extraction_trace()} == {"syn-1"}
    assert svc.extraction_state("syn-2") is None
    table, _ = extract_dataset(svc, load_locomo(synthetic_path), "turns")
    assert table.loc["syn-1", "jobs_run"] == 0 and table.loc["syn-2", "jobs_run"] > 0
    trace = svc.extraction_trace()
    assert sorted(r["conversation"] for r in trace) == ["syn-1"] * 5 + ["syn-2"] * 2
    svc.close()


def _killed_mid_job(db: str) -> None:
    """Run one extraction job of three adds and die (SIGKILL-like ``os._exit``) at the third."""
    from memlab.extract import AutoMemoryWorker, ChatSession, ExtractionResult, Extractor, MemoryOp, Message
    from memlab.extract.reconcile import ReconcileConfig

    class Three(Extractor):
        name = "three"

        def extract(self, request):
            return ExtractionResult(ops=[MemoryOp(action="add", text=t, source_ids=("D1:1",))
                                         for t in ("Alice plays chess", "Alice has a cat", "Alice lives in Paris")])

    svc = SQLiteMemoryService(db)
    real = svc.add

    def add(key, **kw):
        if kw.get("text") == "Alice lives in Paris":
            os._exit(9)  # the job's first two adds are written, not yet committed
        return real(key, **kw)

    svc.add = add
    msg = Message("user", "hello", datetime(2023, 5, 8, 13, 0), "D1:1", speaker="Alice")
    AutoMemoryWorker(svc, Three(), reconcile_config=ReconcileConfig(enabled=False)).run_job(ChatSession("s", A, [msg]))
    os._exit(0)


def test_a_kill_mid_job_keeps_none_of_its_ops(tmp_path):
    """A job's ops are one transaction: killed at its third add, the store holds neither of the two before it
    (each op its own transaction kept them: a half-applied job whose cursor never advanced)."""
    db = str(tmp_path / "store.db")
    SQLiteMemoryService(db).close()
    assert _run([(_killed_mid_job, db)]) == [9]
    svc = SQLiteMemoryService(db)
    assert svc.count(A) == 0 and svc.op_log() == []
    svc.close()
