from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta

import pytest

from memlab.extract import (
    AutoMemoryWorker,
    ChatSession,
    CheckContext,
    ExtractionResult,
    Extractor,
    MemoryOp,
    Message,
    ReconcileConfig,
    checks_all,
    checks_any,
    message_threshold,
    time_interval,
    worker_index,
)
from memlab.index import open_service
from memlab.memory import UserKey

K = UserKey("app", "alice")
T0 = datetime(2023, 5, 8, 13, 0)


def msgs(*texts, start=0, role="user"):
    return [Message(role=role, text=t, timestamp=T0 + timedelta(minutes=start + i), id=f"D1:{start + i + 1}",
                    speaker="Alice") for i, t in enumerate(texts)]


class Scripted(Extractor):
    """Returns preset ops; records what it was given."""

    name = "scripted"

    def __init__(self, ops=None, fail=None, sleep=0.0):
        self.ops = ops or []
        self.fail = fail
        self.sleep = sleep
        self.requests = []

    def extract(self, request):
        self.requests.append(request)
        if self.sleep:
            time.sleep(self.sleep)
        if self.fail:
            raise self.fail
        ops = self.ops(request) if callable(self.ops) else self.ops
        return ExtractionResult(ops=list(ops))


def add(text, **kw):
    return MemoryOp(action="add", text=text, source_ids=kw.pop("source_ids", ("D1:1",)), **kw)


def test_checkers_edges():
    ctx = lambda n, last=None, now=T0: CheckContext(K, msgs(*["x"] * n), last, now)  # noqa: E731
    assert message_threshold(2)(ctx(3)) and not message_threshold(2)(ctx(2))  # strictly greater
    ti = time_interval(timedelta(hours=1))
    assert ti(ctx(1)) and not ti(ctx(1, last=T0 - timedelta(minutes=59)))
    assert ti(ctx(1, last=T0 - timedelta(minutes=61)))
    assert checks_all(message_threshold(0), ti)(ctx(1)) and not checks_all(message_threshold(5), ti)(ctx(1))
    assert checks_any(message_threshold(5), ti)(ctx(1)) and not checks_any()(ctx(1)) and checks_all()(ctx(1))
    with pytest.raises(ValueError):
        message_threshold(-1)


def test_delta_keeps_only_text_user_assistant():
    s = ChatSession("s", K, [
        Message("user", "hello", T0, "D1:1"),
        Message("tool", "result", T0 + timedelta(seconds=1), "t1"),
        Message("assistant", "   ", T0 + timedelta(seconds=2), "D1:2"),
        Message("assistant", "", T0 + timedelta(seconds=3), "D1:3", tool_calls=({"name": "x"},)),
        Message("assistant", "hi!", T0 + timedelta(seconds=4), "D1:4"),
    ])
    assert [m.id for m in s.delta()] == ["D1:1", "D1:4"]
    s.cursor = T0
    assert [m.id for m in s.delta()] == ["D1:4"]


def test_noop_cases():
    svc = open_service("memory")
    ex = Scripted([add("x")])
    w = AutoMemoryWorker(svc, ex)
    assert AutoMemoryWorker(svc, None).run_job(ChatSession("s", K, msgs("a"))).reason == "no extractor"
    assert w.run_job(None).reason == "empty session"
    assert w.run_job(ChatSession("s", K, [])).reason == "empty session"
    assert w.run_job(ChatSession("s", None, msgs("a"))).reason == "missing user key"
    only_tool = ChatSession("s", K, [Message("tool", "r", T0, "t")])
    assert w.run_job(only_tool).reason == "no text delta after the cursor"
    assert ex.requests == [] and svc.count(K) == 0 and w.counters.jobs_noop == 4


def test_checker_false_is_a_quiet_noop():
    svc = open_service("memory")
    ex = Scripted([add("x")])
    w = AutoMemoryWorker(svc, ex, checkers=[message_threshold(2)])
    s = ChatSession("s", K, msgs("a", "b"))
    r = w.run_job(s)
    assert r.status == "skipped" and s.cursor is None and ex.requests == [] and svc.count(K) == 0
    s.messages += msgs("c", start=2)
    r = w.run_job(s)
    assert r.status == "ran" and s.cursor == s.messages[-1].timestamp and svc.count(K) == 1
    assert w.counters.jobs_skipped_by_checker == 1 and w.counters.jobs_run == 1


def test_old_memories_first_and_delta():
    svc = open_service("memory")
    svc.add(K, "Alice likes green tea")
    svc.add(K, "Bob fixes motorbikes")
    ex = Scripted([add("Alice drinks tea every morning", source_ids=("D1:1",))])
    w = AutoMemoryWorker(svc, ex)
    w.run_job(ChatSession("s", K, msgs("I had green tea again today")))
    req = ex.requests[0]
    assert [m.text for m in req.delta] == ["I had green tea again today"]
    assert req.old_memories[0].text == "Alice likes green tea"


class FailingSearch:
    def __init__(self, svc, recent_fails=False):
        self.svc = svc
        self.recent_fails = recent_fails

    def __getattr__(self, name):
        return getattr(self.svc, name)

    def search(self, key, options):
        raise RuntimeError("search down")

    def read_recent(self, key, limit=10):
        if self.recent_fails:
            raise RuntimeError("store down")
        return self.svc.read_recent(key, limit)


def test_old_memory_lookup_falls_back_then_fails():
    base = open_service("memory")
    base.add(K, "Alice likes green tea")
    ex = Scripted([add("new fact")])
    w = AutoMemoryWorker(FailingSearch(base), ex)
    s = ChatSession("s", K, msgs("hello"))
    r = w.run_job(s)
    assert ex.requests[0].old_memories[0].text == "Alice likes green tea"  # recent read instead
    assert r.status == "ran" and s.cursor is not None
    assert r.applied[0].decision.tier == "search-failed" and base.count(K) == 2  # reconcile search failed: kept
    ex2 = Scripted([add("other")])
    w2 = AutoMemoryWorker(FailingSearch(base, recent_fails=True), ex2)
    s2 = ChatSession("s2", K, msgs("hello"))
    r2 = w2.run_job(s2)
    assert r2.status == "failed" and "old-memory lookup failed" in r2.reason
    assert s2.cursor is None and ex2.requests == [] and base.count(K) == 2


def test_extractor_failure_and_timeout_leave_cursor():
    svc = open_service("memory")
    s = ChatSession("s", K, msgs("hello"))
    r = AutoMemoryWorker(svc, Scripted(fail=RuntimeError("model down"))).run_job(s)
    assert r.status == "failed" and "model down" in r.reason and s.cursor is None
    w = AutoMemoryWorker(svc, Scripted([add("late")], sleep=0.5), job_timeout=0.1)
    r = w.run_job(s)
    assert r.status == "failed" and "timeout" in r.reason and s.cursor is None
    time.sleep(0.6)
    assert svc.count(K) == 0  # the straggler's ops were never applied
    w.close()


def test_apply_rules_update_fallback_and_op_failure():
    svc = open_service("memory")
    keep = svc.add(K, "Alice lives in Paris")
    ops = [
        MemoryOp(action="update", text="Alice has a cat named Tom", memory_id="missing-id", source_ids=("D1:1",)),
        MemoryOp(action="add", text="   ", source_ids=("D1:1",)),  # invalid: fails alone
        MemoryOp(action="update", text="Alice lives in Lyon", memory_id=keep.id, source_ids=("D1:1",)),
        MemoryOp(action="delete", memory_id="nope"),
        add("Alice plays chess"),
    ]
    w = AutoMemoryWorker(svc, Scripted(ops), reconcile_config=ReconcileConfig(enabled=False))
    s = ChatSession("s", K, msgs("..."))
    r = w.run_job(s)
    assert [a.result for a in r.applied] == ["update->add", "error", "updated", "absent", "added"]
    assert "text" in r.applied[1].error
    assert r.status == "ran" and s.cursor is not None  # single write failures do not block the cursor
    assert w.counters.ops_failed == 1 and w.counters.ops_applied == 4
    assert {e.text for e in svc.list(K)} == {"Alice lives in Lyon", "Alice has a cat named Tom", "Alice plays chess"}
    w_no_add = AutoMemoryWorker(svc, Scripted([ops[0].with_changes(text="Alice has a dog")]), adds_enabled=False)
    r = w_no_add.run_job(ChatSession("s2", K, msgs("...")))
    assert r.applied[0].result == "not_found"


def test_reconcile_in_the_worker_rewrites_and_skips():
    svc = open_service("memory")
    old = svc.add(K, "Alice likes green tea in the morning")
    ops = [add("in the morning Alice likes green tea"),  # same words: skip
           add("Alice likes green tea at night"),  # Jaccard 4/9 >= 0.40: update of old
           add("Bob repairs motorbikes")]
    w = AutoMemoryWorker(svc, Scripted(ops))
    r = w.run_job(ChatSession("s", K, msgs("...")))
    assert [a.result for a in r.applied] == ["skipped", "updated", "added"]
    assert r.applied[0].op.text == "in the morning Alice likes green tea" and r.applied[0].memory_id == old.id
    assert r.applied[1].memory_id == old.id and w.counters.ops_rewritten_by_reconcile == 1
    assert w.counters.ops_skipped_by_reconcile == 1 and svc.count(K) == 2


def test_rerun_with_same_cursor_adds_nothing():
    svc = open_service("memory")
    ex = Scripted(lambda req: [add(f"said: {m.text}", source_ids=(m.id,)) for m in req.delta])
    w = AutoMemoryWorker(svc, ex)
    s = ChatSession("s", K, msgs("pottery class", "violin lesson"))
    w.run_job(s)
    assert svc.count(K) == 2
    r = w.run_job(s)
    assert r.status == "noop" and svc.count(K) == 2 and len(ex.requests) == 1
    s.messages += msgs("marathon training", start=2)
    w.run_job(s)
    assert [m.text for m in ex.requests[-1].delta] == ["marathon training"] and svc.count(K) == 3


def test_queue_keeps_each_users_order_under_concurrency():
    svc = open_service("memory")
    seen: list[tuple[str, str]] = []
    lock = threading.Lock()

    def ops(req):
        with lock:
            seen.append((req.key.user_id, req.delta[-1].text))
        time.sleep(0.002)
        return []

    w = AutoMemoryWorker(svc, Scripted(ops), workers=3, capacity=200).start()
    users = [UserKey("app", f"u{i}") for i in range(6)]
    sessions = {u: ChatSession(u.user_id, u) for u in users}
    futures = []

    def producer(u):
        for j in range(15):
            s = ChatSession(f"{u.user_id}-{j}", u, msgs(f"{u.user_id}#{j:02d}", start=j))
            futures.append(w.submit(s))

    threads = [threading.Thread(target=producer, args=(u,)) for u in users]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for f in futures:
        assert f.result(timeout=10).status == "ran"
    w.stop()
    for u in users:
        mine = [txt for uid, txt in seen if uid == u.user_id]
        assert mine == sorted(mine) and len(mine) == 15
    assert len({worker_index(u, 3) for u in users}) > 1  # users spread over workers
    assert worker_index(users[0], 3) == worker_index(UserKey("app", "u0"), 3)  # stable
    del sessions


def test_queue_full_or_not_started_runs_sync_unless_cancelled():
    svc = open_service("memory")
    gate = threading.Event()
    ex = Scripted(lambda req: (gate.wait(5), [])[1])
    w = AutoMemoryWorker(svc, ex, capacity=1)
    r = w.submit(ChatSession("s0", K, msgs("not started"))).result()
    assert r.ran_sync  # not started: synchronous
    w.start()
    busy = w.submit(ChatSession("s1", K, msgs("a")))  # taken by the worker, blocks on gate
    until = time.monotonic() + 10
    while w.pending(K) and time.monotonic() < until:  # until the worker has taken it
        time.sleep(0.01)
    queued = w.submit(ChatSession("s2", K, msgs("b")))  # fills the queue (capacity 1)
    cancelled = threading.Event()
    cancelled.set()
    r = w.submit(ChatSession("s3", K, msgs("c")), cancelled=cancelled).result()
    assert r.status == "cancelled"
    gate.set()
    r_sync = w.submit(ChatSession("s4", K, msgs("d")))
    assert busy.result(5).status == "ran" and queued.result(5).status == "ran"
    assert r_sync.result(5).status == "ran"
    w.stop()
    assert w.counters.jobs_cancelled == 1 and w.counters.jobs_sync >= 1


def test_a_jobs_ops_are_one_sqlite_transaction_and_a_failing_op_is_undone_alone(tmp_path, monkeypatch):
    """One commit per job, not one per op (a cold LoCoMo-10 extraction paid ~8,400 commits); an op that
    fails half-way (its row written, its log line refused) is rolled back alone and the others stay."""
    import sqlite3

    from memlab.memory import SQLiteMemoryService

    statements: list[str] = []
    connect = sqlite3.connect

    def traced(*a, **k):  # every statement the store sends, through sqlite3's own trace hook
        conn = connect(*a, **k)
        conn.set_trace_callback(statements.append)
        return conn

    monkeypatch.setattr(sqlite3, "connect", traced)
    svc = SQLiteMemoryService(tmp_path / "store.db")
    with connect(tmp_path / "store.db") as db:  # boom's log line is refused by the file itself
        db.execute("CREATE TRIGGER refuse_boom BEFORE INSERT ON oplog WHEN NEW.inputs LIKE '%Alice said boom%' "
                   "BEGIN SELECT RAISE(ABORT, 'log line refused'); END")
    statements.clear()
    ops = [add("Alice plays chess"), add("Alice said boom"), add("Alice has a cat named Tom")]
    w = AutoMemoryWorker(svc, Scripted(ops), reconcile_config=ReconcileConfig(enabled=False))
    r = w.run_job(ChatSession("s", K, msgs("...")))
    assert [a.result for a in r.applied] == ["added", "error", "added"] and "log line refused" in r.applied[1].error
    assert sum(s.startswith("BEGIN") for s in statements) == 1  # before: 3, one per op
    assert sum(s == "COMMIT" for s in statements) == 1
    assert {e.text for e in svc.list(K)} == {"Alice plays chess", "Alice has a cat named Tom"}  # boom's row undone
    assert [rec.inputs["text"] for rec in svc.op_log(K)] == ["Alice plays chess", "Alice has a cat named Tom"]
    svc.close()
