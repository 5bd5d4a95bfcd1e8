"""Extraction over LoCoMo: replay each conversation's sessions through the worker into a store."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd

from memlab.data.locomo import Conversation, LoCoMo
from memlab.extract.checkers import Checker
from memlab.extract.extractors import EXTRACTORS, Extractor
from memlab.extract.messages import ChatSession, replay_locomo
from memlab.extract.reconcile import ReconcileConfig
from memlab.extract.worker import AutoMemoryWorker, JobResult
from memlab.llm.spend import SpendCapReached
from memlab.memory.capabilities import extraction_log
from memlab.memory.entry import UserKey
from memlab.memory.service import MemoryService
from memlab.progress import progress_bar

APP_NAME = "locomo"
#: The key of a conversation's saved extraction state holding what building its memory cost (`extract_dataset`).
BUILD_COST = "memlab:build_cost"
#: What a run's build-cost hook gives: (conversation, its worker, the cost saved before) -> the cost to save.
BuildCost = Callable[[Conversation, AutoMemoryWorker, "dict[str, Any] | None"], "dict[str, Any] | None"]


def conversation_key(conv: Conversation) -> UserKey:
    """One UserKey per LoCoMo conversation: both speakers' memories live under it."""
    return UserKey(APP_NAME, conv.sample_id)


def resolve_extractor(extractor: Extractor | str, **params: Any) -> Extractor:
    """An extractor object as given, or a registered one by name built with ``params``."""
    if isinstance(extractor, Extractor):
        return extractor
    return EXTRACTORS.get(extractor)(**params)


def job_id(res: JobResult) -> str:
    """A job's identity in the trace: its cursor, its messages and its outcome. The same job run
    again (a rerun, a second process on the same cache) has the same id, so its lines are stored once;
    a failed attempt and the later success are different ids, so both stay visible."""
    before = res.cursor_before.isoformat() if res.cursor_before else "-"
    span = f"{res.delta_ids[0]}..{res.delta_ids[-1]}" if res.delta_ids else "-"
    return f"{res.session_id}|{before}|{span}|{res.status}"


def keyed_trace_rows(conversation_id: str, results: Sequence[JobResult]) -> list[tuple[str, int, dict[str, Any]]]:
    """The extraction trace lines of some jobs (every applied/skipped/failed op, dropped proposal, failed job), each
    with its (job id, line number): the key under which a store saves it once."""
    out: list[tuple[str, int, dict[str, Any]]] = []
    for res in results:
        rows: list[dict[str, Any]] = []
        for a in res.applied:
            rows.append({"conversation": conversation_id, "job_status": res.status, **a.to_dict()})
        for reason in res.dropped:
            rows.append({"conversation": conversation_id, "job_status": res.status, "dropped": reason})
        if res.status == "failed":
            rows.append({"conversation": conversation_id, "job_status": "failed", "reason": res.reason})
        if res.malformed_tool_calls:  # the job's tool calls written as text or with unreadable arguments
            rows.append({"conversation": conversation_id, "job_status": res.status,
                         "malformed_tool_calls": res.malformed_tool_calls})
        jid = job_id(res)
        out.extend((jid, i, r) for i, r in enumerate(rows))
    return out


def extract_conversation(
    service: MemoryService,
    conv: Conversation,
    extractor: Extractor,
    checkers: Sequence[Checker] = (),
    reconcile: ReconcileConfig | None = None,
    session: ChatSession | None = None,
    user_speaker: str | None = None,
    worker_params: dict[str, Any] | None = None,
) -> tuple[ChatSession, AutoMemoryWorker]:
    """Replay a conversation session by session, running one extraction job after each
    (``worker_params``: workers, capacity, job_timeout of `AutoMemoryWorker`)."""
    key = conversation_key(conv)
    worker = AutoMemoryWorker(service, extractor, checkers=checkers, reconcile_config=reconcile,
                              **(worker_params or {}))
    chat = session
    try:
        for chat in replay_locomo(conv, key, user_speaker=user_speaker, session=session):
            worker.run_job(chat)
    except SpendCapReached as e:  # refused before a job's call: the cursor is after the last finished job
        e.extraction = (chat, worker)
        raise
    finally:
        worker.close()
    return chat, worker


def _save_conversation(service: MemoryService, conv: Conversation, chat: ChatSession, worker: AutoMemoryWorker,
                       saved: dict[str, Any], build_cost: BuildCost | None) -> None:
    """Save a conversation's cursor (none when it wrote nothing), its build cost and trace lines, in one go."""
    state: dict[str, Any] = {}
    if not (service.count(conversation_key(conv)) == 0 and conv.turns):  # nothing written: never cached as done
        state = {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in chat.state.items()}
    # the cost so far: a conversation saved without a cursor (it wrote nothing) was extracted from scratch
    previous = saved.get(BUILD_COST) if set(saved) - {BUILD_COST} else None
    cost = build_cost(conv, worker, previous) if build_cost is not None else None
    if cost is not None:  # what it cost, even when it wrote nothing (a model whose every op was dropped)
        state[BUILD_COST] = cost
    extraction_log(service).save_extraction(conv.sample_id, state, keyed_trace_rows(conv.sample_id, worker.results))


def extract_dataset(
    service: MemoryService,
    data: LoCoMo,
    extractor: Extractor | str = "observations",
    extractor_params: dict[str, Any] | None = None,
    checkers: Sequence[Checker] = (),
    reconcile: ReconcileConfig | None = None,
    conversations: Sequence[str] | None = None,
    on_conversation: Callable[[Conversation, AutoMemoryWorker], None] | None = None,
    worker_params: dict[str, Any] | None = None,
    build_cost: BuildCost | None = None,
) -> tuple[pd.DataFrame, list[JobResult]]:
    """Extract every (selected) conversation; returns per-conversation counts and all job results.

    ``extractor`` is an `Extractor` (bound to each conversation in turn) or a registered name built
    with ``extractor_params``.
    Each conversation's chat-session cursor and its trace lines are saved in the service (for
    SQLite: in the store file, in one transaction with each other, after each conversation), so a
    rerun on the same store resumes after the cursor, adds nothing twice and retries only jobs that
    failed; the store's own integrity check covers them, and a store rebuilt after corruption has
    no cursor, so everything is extracted again. A conversation with text that ends with no memory
    at all is not recorded as done (no cursor is saved), so a rerun extracts it again.
    ``extraction_trace()`` reads the trace back (the store's `memlab.memory.ExtractionLog`).
    ``on_conversation`` sees each finished worker.
    ``build_cost`` gives what building the conversation's memory cost so far (from its worker and the cost saved
    before); it is saved in the same transaction as the cursor (state key `BUILD_COST`), so a run that finds the
    conversation done finds its cost too, never one without the other.
    """
    rows, results = [], []
    convs = [c for c in data if conversations is None or c.sample_id in conversations]
    base = resolve_extractor(extractor, **(extractor_params or {}))
    log = extraction_log(service)  # a store without a cursor is refused before any model call
    for conv in progress_bar(convs, desc=f"extract ({base.name})", leave=False):
        key = conversation_key(conv)
        before = service.count(key)
        saved = log.extraction_state(conv.sample_id) or {}
        chat = ChatSession(id=f"locomo:{conv.sample_id}", key=key, state=dict(saved))
        ex = base.bind(conv)
        try:
            chat, worker = extract_conversation(service, conv, ex, checkers, reconcile, session=chat,
                                                worker_params=worker_params)
        except SpendCapReached as e:  # the jobs done so far are kept: a resume goes on at the refused one
            _save_conversation(service, conv, *e.extraction, saved, build_cost)
            raise
        c = worker.counters
        _save_conversation(service, conv, chat, worker, saved, build_cost)
        if on_conversation is not None:
            on_conversation(conv, worker)
        rows.append({"conversation": conv.sample_id, "sessions": len(conv.sessions), "turns": len(conv.turns),
                     "jobs_run": c.jobs_run, "jobs_noop": c.jobs_noop, "jobs_failed": c.jobs_failed,
                     "ops_proposed": c.ops_proposed, "ops_applied": c.ops_applied,
                     "rewritten": c.ops_rewritten_by_reconcile, "skipped": c.ops_skipped_by_reconcile,
                     "ops_failed": c.ops_failed, "refused": c.ops_refused_by_policy,
                     "superseded": c.memories_superseded, "model_calls": c.model_calls,
                     "malformed_tool_calls": c.malformed_tool_calls,
                     "memories_added": service.count(key) - before, "memories": service.count(key)})
        results.extend(worker.results)
    return pd.DataFrame(rows).set_index("conversation"), results
