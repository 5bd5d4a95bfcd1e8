"""The auto-extraction job and its queue (DESIGN: Auto-extraction job, Queue, Old memories first, Apply ops).

One job = one session's delta after the cursor ``memory:last_extract_at``:

1. no-op when the extractor, session, key or text delta is missing;
2. checkers gate the job (False: skipped, no model call, no write, cursor unchanged);
3. old memories first: search the user's memories with the delta's user messages; on failure read
   the most recent ones; both failing stops the job (failed, cursor unchanged);
4. the extractor proposes ops (failure or job timeout: failed, cursor unchanged);
5. reconcile each add against the store (a failed search keeps the op);
6. apply ops one by one: update of a missing id becomes an add when adds are enabled; a failing op
   is logged and counted and the rest go on; the job's ops are one write (`MemoryService.atomic`);
7. the cursor advances to the last delta message (even if single writes failed).

Queue: ``workers`` threads, each with a bounded queue (``capacity``); a job goes to the worker chosen
by a stable hash of its UserKey, so one user's jobs run in order. Queue full or not started: the
job runs synchronously in the caller, unless the caller has been cancelled.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import logging
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, is_dataclass
from datetime import datetime
from typing import Any, Literal

from memlab.extract.checkers import CheckContext, Checker, should_extract
from memlab.extract.extractors import ExtractionRequest, Extractor
from memlab.extract.messages import ChatSession
from memlab.extract.ops import MemoryOp
from memlab.extract.policy import DEFAULT_POLICY, applied_reconcile, check_policy
from memlab.extract.reconcile import Decision, ReconcileConfig, reconcile
from memlab.index.hybrid import is_turn_record
from memlab.llm import ModelError, redact
from memlab.memory.search_types import SearchOptions
from memlab.memory.service import Cleared, MemoryService, cleared

log = logging.getLogger(__name__)

DEFAULT_WORKERS = 1
DEFAULT_CAPACITY = 10
DEFAULT_JOB_TIMEOUT_S = 30.0
OLD_MEMORY_LIMIT = 10
QUERY_CHARS = 2000


@dataclass
class Counters:
    jobs_run: int = 0
    jobs_skipped_by_checker: int = 0
    jobs_noop: int = 0
    jobs_failed: int = 0
    jobs_cancelled: int = 0
    jobs_sync: int = 0
    ops_proposed: int = 0
    ops_dropped_malformed: int = 0
    ops_applied: int = 0
    ops_rewritten_by_reconcile: int = 0
    ops_skipped_by_reconcile: int = 0
    ops_failed: int = 0
    ops_refused_by_policy: int = 0
    memories_superseded: int = 0
    model_calls: int = 0
    malformed_tool_calls: int = 0

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


#: What one extraction job came to (`JobResult.status`).
JobStatus = Literal["ran", "skipped", "noop", "failed", "cancelled"]
#: What applying one op did: the service's op-log results plus ``update->add`` (update of a vanished
#: memory re-added) and ``skipped`` (reconcile said so); ``cleared:N`` via `memlab.memory.service.cleared`.
AppliedResult = Literal["added", "exists", "updated", "superseded", "update->add", "not_found", "deleted", "absent",
                        "skipped", "adds-disabled", "update->add (append-only)", "refused (append-only)", "error"]


@dataclass
class AppliedOp:
    op: MemoryOp
    decision: Decision
    result: AppliedResult | Cleared
    memory_id: str | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op.to_dict(), "reconcile": self.decision.to_dict(), "result": self.result,
                "memory_id": self.memory_id, "error": self.error}


@dataclass
class JobResult:
    status: JobStatus
    reason: str = ""
    session_id: str = ""
    cursor_before: datetime | None = None
    cursor_after: datetime | None = None
    delta_ids: list[str] = field(default_factory=list)
    proposed: list[MemoryOp] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    applied: list[AppliedOp] = field(default_factory=list)
    usage: Any = None
    ran_sync: bool = False
    lookup_query: str = ""
    """The old-memory search query (embedded: part of the memory-building cost); empty when none ran."""
    malformed_tool_calls: int = 0
    """The job's tool calls written as text or with unreadable arguments (each re-asked once)."""

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "reason": self.reason, "session_id": self.session_id,
                "cursor_before": self.cursor_before.isoformat() if self.cursor_before else None,
                "cursor_after": self.cursor_after.isoformat() if self.cursor_after else None,
                "delta_ids": self.delta_ids, "dropped": self.dropped,
                "applied": [a.to_dict() for a in self.applied], "ran_sync": self.ran_sync,
                "malformed_tool_calls": self.malformed_tool_calls,
                "usage": asdict(self.usage) if is_dataclass(self.usage) and not isinstance(self.usage, type) else None}


class _Skip(Exception):
    """Internal: the extractor does not read old memories."""


def worker_index(key: Any, workers: int) -> int:
    """Stable (process-independent) hash of a UserKey onto a worker."""
    h = hashlib.sha256(f"{key.app_name}\x00{key.user_id}".encode()).digest()
    return int.from_bytes(h[:8], "big") % workers


class AutoMemoryWorker:
    """Runs extraction jobs against a `MemoryService` (see module doc for the exact rules)."""

    def __init__(
        self,
        service: MemoryService,
        extractor: Extractor | None,
        checkers: Sequence[Checker] = (),
        reconcile_config: ReconcileConfig | None = None,
        workers: int = DEFAULT_WORKERS,
        capacity: int = DEFAULT_CAPACITY,
        job_timeout: float = DEFAULT_JOB_TIMEOUT_S,
        old_memory_limit: int = OLD_MEMORY_LIMIT,
        adds_enabled: bool = True,
        policy: str = DEFAULT_POLICY,
    ):
        if workers < 1 or capacity < 1:
            raise ValueError(f"workers and capacity must be >= 1, got {workers} and {capacity}")
        self.service = service
        self.extractor = extractor
        self.checkers = list(checkers)
        self.reconcile_config = reconcile_config or ReconcileConfig()
        self.workers = workers
        self.capacity = capacity
        self.job_timeout = job_timeout
        self.old_memory_limit = old_memory_limit
        self.adds_enabled = adds_enabled
        self.policy = check_policy(policy)
        self.counters = Counters()
        self.results: list[JobResult] = []
        self._lock = threading.Lock()
        self._queues: list[queue.Queue] = []
        self._threads: list[threading.Thread] = []
        self._call_pool: cf.ThreadPoolExecutor | None = None

    # ------------------------------------------------------------------------------ queue
    @property
    def started(self) -> bool:
        return bool(self._threads)

    def start(self) -> AutoMemoryWorker:
        if self.started:
            return self
        self._queues = [queue.Queue(maxsize=self.capacity) for _ in range(self.workers)]
        for i, q in enumerate(self._queues):
            t = threading.Thread(target=self._loop, args=(q,), name=f"memlab-extract-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def pending(self, key: Any) -> int:
        """Jobs waiting in the queue that serves ``key`` (0 when the worker is not started)."""
        return self._queues[worker_index(key, self.workers)].qsize() if self._queues else 0

    def stop(self, wait: bool = True) -> None:
        for q in self._queues:
            q.put(None)
        if wait:
            for t in self._threads:
                t.join()
        self._threads, self._queues = [], []

    def __enter__(self) -> AutoMemoryWorker:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _loop(self, q: queue.Queue) -> None:
        while True:
            item = q.get()
            if item is None:
                q.task_done()
                return
            session, fut = item
            try:
                fut.set_result(self.run_job(session))
            except BaseException as e:  # run_job reports failures itself; this is a bug guard
                fut.set_exception(e)
            finally:
                q.task_done()

    def submit(self, session: ChatSession, cancelled: threading.Event | None = None) -> cf.Future:
        """Queue a job for its user's worker; full or not started -> run it now (unless cancelled)."""
        fut: cf.Future = cf.Future()
        if self.started and session is not None and session.key is not None:
            q = self._queues[worker_index(session.key, self.workers)]
            try:
                q.put_nowait((session, fut))
                return fut
            except queue.Full:
                pass
        if cancelled is not None and cancelled.is_set():
            with self._lock:
                self.counters.jobs_cancelled += 1
            fut.set_result(JobResult("cancelled", "caller cancelled; queue full or not started",
                                     session_id=getattr(session, "id", "")))
            return fut
        res = self.run_job(session)
        res.ran_sync = True
        with self._lock:
            self.counters.jobs_sync += 1
        fut.set_result(res)
        return fut

    # -------------------------------------------------------------------------------- job
    def _finish(self, res: JobResult, counter: str) -> JobResult:
        with self._lock:
            setattr(self.counters, counter, getattr(self.counters, counter) + 1)
            self.results.append(res)
        return res

    def run_job(self, session: ChatSession | None, now: datetime | None = None) -> JobResult:
        if self.extractor is None:
            return self._finish(JobResult("noop", "no extractor"), "jobs_noop")
        if session is None or not session.messages:
            return self._finish(JobResult("noop", "empty session", session_id=getattr(session, "id", "")),
                                "jobs_noop")
        if session.key is None:
            return self._finish(JobResult("noop", "missing user key", session_id=session.id), "jobs_noop")
        key = session.key
        cursor = session.cursor
        delta = session.delta()
        res = JobResult("ran", session_id=session.id, cursor_before=cursor, cursor_after=cursor,
                        delta_ids=[m.id for m in delta])
        if not delta:
            res.status, res.reason = "noop", "no text delta after the cursor"
            return self._finish(res, "jobs_noop")
        now = now or delta[-1].timestamp
        if not should_extract(self.checkers, CheckContext(key, delta, cursor, now)):
            res.status, res.reason = "skipped", "checker false"
            return self._finish(res, "jobs_skipped_by_checker")
        deadline = time.monotonic() + self.job_timeout

        # old memories first (skipped for extractors that do not read them: model-free ones); an extractor that
        # keeps the verbatim turns beside its own memories reads and reconciles against its own memories only
        notes_only = self.extractor.keeps_turns
        query = " ".join(m.text for m in delta if m.role == "user")[:QUERY_CHARS] or delta[-1].text[:QUERY_CHARS]
        old: list = []
        try:
            if not self.extractor.reads_old_memories:
                raise _Skip
            res.lookup_query = query
            old = self.service.search(key, SearchOptions(query=query, max_results=self.old_memory_limit,
                                                         kind_fallback=False, include_superseded=False,
                                                         notes_only=notes_only)).entries
        except _Skip:
            pass
        except Exception as e1:
            log.warning("old-memory search failed for %s, reading recent memories instead: %s: %s", key,
                        type(e1).__name__, e1)
            try:
                old = [e for e in self.service.read_recent(key, -1)
                       if not e.superseded and not (notes_only and is_turn_record(e))][: self.old_memory_limit]
            except Exception as e2:
                res.status, res.reason = "failed", redact(f"old-memory lookup failed: search: {e1}; recent: {e2}")
                return self._finish(res, "jobs_failed")

        # the extractor call, bounded by the job timeout
        request = ExtractionRequest(key=key, delta=delta, old_memories=old, now=now)
        if self._call_pool is None:
            self._call_pool = cf.ThreadPoolExecutor(max_workers=max(2, self.workers), thread_name_prefix="memlab-call")
        fut = self._call_pool.submit(self.extractor.extract, request)
        try:
            out = fut.result(timeout=max(0.0, deadline - time.monotonic()))
        except cf.TimeoutError:
            res.status, res.reason = "failed", f"job timeout after {self.job_timeout:g} s (extractor still running)"
            return self._finish(res, "jobs_failed")
        except Exception as e:
            res.status, res.reason = "failed", redact(f"extractor failed: {type(e).__name__}: {e}")
            if isinstance(e, ModelError):  # what the failed call already cost
                partial = e.partial
                res.usage, res.malformed_tool_calls = partial.usage, partial.malformed_tool_calls
                with self._lock:
                    self.counters.model_calls += partial.calls
                    self.counters.malformed_tool_calls += partial.malformed_tool_calls
            return self._finish(res, "jobs_failed")
        res.proposed, res.dropped, res.usage = [*out.verbatim, *out.ops], list(out.dropped), out.usage
        res.malformed_tool_calls = out.malformed_tool_calls
        with self._lock:
            self.counters.ops_proposed += len(out.verbatim) + len(out.ops)
            self.counters.ops_dropped_malformed += len(out.dropped)
            self.counters.model_calls += out.calls
            self.counters.malformed_tool_calls += out.malformed_tool_calls

        # reconcile, then apply one by one
        def search(text: str, n: int):
            return self.service.search(key, SearchOptions(query=text, max_results=n, dedupe=False,
                                                          kind_fallback=False, include_superseded=False,
                                                          notes_only=notes_only)).hits

        cfg = applied_reconcile(self.reconcile_config, self.extractor.reconciles, self.policy)
        searcher = self.service.searcher
        signal = searcher.reconcile_signal if searcher is not None else "dense"
        decisions = [Decision("verbatim", op, proposed=op) for op in out.verbatim]
        decisions += reconcile(out.ops, search, cfg, signal)
        with self.service.atomic():  # the job's ops land together (one commit) or, on a kill, not at all
            for d in decisions:
                res.applied.append(self._apply(key, d, now))
        if time.monotonic() > deadline:
            # the ops written stay (committed together), but the job did not finish in time
            res.status, res.reason = "failed", f"job timeout after {self.job_timeout:g} s while applying ops"
            return self._finish(res, "jobs_failed")
        session.cursor = delta[-1].timestamp
        res.cursor_after = session.cursor
        return self._finish(res, "jobs_run")

    def _apply(self, key: Any, d: Decision, now: datetime | None = None) -> AppliedOp:
        with self._lock:
            if d.rewritten:
                if d.op is None:
                    self.counters.ops_skipped_by_reconcile += 1
                else:
                    self.counters.ops_rewritten_by_reconcile += 1
        if d.op is None:  # skipped: the trace keeps the proposed op and the memory it duplicated
            return AppliedOp(op=d.proposed or MemoryOp(action="add"), decision=d, result="skipped",
                             memory_id=d.candidate_id)
        op = d.op
        try:
            if op.action == "add":
                if not self.adds_enabled:
                    return self._count(AppliedOp(op, d, "adds-disabled"))
                e = self.service.add(key, **op.add_kwargs())
                return self._count(AppliedOp(op, d, "added", e.id))
            if self.policy == "append-only" and op.action in ("delete", "clear"):
                with self._lock:
                    self.counters.ops_refused_by_policy += 1
                return AppliedOp(op, d, "refused (append-only)", op.memory_id)
            if op.action == "update" and self.policy == "append-only":
                if not self.adds_enabled:
                    return self._count(AppliedOp(op, d, "adds-disabled"))
                e = self.service.add(key, **op.add_kwargs())
                return self._count(AppliedOp(op, d, "update->add (append-only)", e.id))
            if op.action == "update" and self.policy == "preserve-history":
                kw = op.add_kwargs()
                text, kind = kw.pop("text"), kw.pop("kind")
                r = self.service.supersede(key, op.memory_id or "", text, kind=kind, at=now, **kw)
                if r.ok:
                    with self._lock:
                        self.counters.memories_superseded += 1
                    return self._count(AppliedOp(op, d, "superseded", r.entry.id))
                if self.adds_enabled:
                    e = self.service.add(key, **op.add_kwargs())
                    return self._count(AppliedOp(op, d, "update->add", e.id))
                return self._count(AppliedOp(op, d, "not_found", op.memory_id))
            if op.action == "update":
                kw = op.add_kwargs()
                text = kw.pop("text")
                kind = kw.pop("kind")
                r = self.service.update(key, op.memory_id or "", text, kind=kind, **kw)
                if r.ok:
                    return self._count(AppliedOp(op, d, "updated", r.entry.id))
                if self.adds_enabled:
                    e = self.service.add(key, **op.add_kwargs())
                    return self._count(AppliedOp(op, d, "update->add", e.id))
                return self._count(AppliedOp(op, d, "not_found", op.memory_id))
            if op.action == "delete":
                gone = self.service.delete(key, op.memory_id or "")
                return self._count(AppliedOp(op, d, "deleted" if gone else "absent", op.memory_id))
            if self.extractor.keeps_turns:  # the model never edits a turn: "forget everything" is its own notes
                n = sum(self.service.delete(key, e.id) for e in self.service.read_recent(key, -1)
                        if not is_turn_record(e))
            else:
                n = self.service.clear(key)
            return self._count(AppliedOp(op, d, cleared(n)))
        except Exception as e:
            with self._lock:
                self.counters.ops_failed += 1
            return AppliedOp(op, d, "error", op.memory_id, f"{type(e).__name__}: {e}")

    def _count(self, a: AppliedOp) -> AppliedOp:
        with self._lock:
            self.counters.ops_applied += 1
        return a

    def close(self) -> None:
        if self.started:
            self.stop()
        if self._call_pool is not None:
            self._call_pool.shutdown(wait=False, cancel_futures=True)
            self._call_pool = None
