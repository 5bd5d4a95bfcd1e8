"""Extraction over LoCoMo: replay each conversation's sessions through the worker into a store."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm.auto import tqdm

from memlab.atomic import write_json
from memlab.data.locomo import Conversation, LoCoMo
from memlab.extract.checkers import Checker
from memlab.extract.extractors import EXTRACTORS, Extractor
from memlab.extract.messages import ChatSession, replay_locomo
from memlab.extract.reconcile import ReconcileConfig
from memlab.extract.worker import AutoMemoryWorker, JobResult
from memlab.memory.entry import UserKey
from memlab.memory.service import MemoryService

APP_NAME = "locomo"


def conversation_key(conv: Conversation) -> UserKey:
    """One UserKey per LoCoMo conversation: both speakers' memories live under it."""
    return UserKey(APP_NAME, conv.sample_id)


def resolve_extractor(extractor: Extractor | str, **params: Any) -> Extractor:
    """An extractor object as given, or a registered one by name built with ``params``."""
    if isinstance(extractor, Extractor):
        return extractor
    return EXTRACTORS.get(extractor)(**params)


def trace_rows(conversation_id: str, results: Sequence[JobResult]) -> list[dict[str, Any]]:
    """The extraction trace lines of some jobs: every applied/skipped/failed op, dropped proposal, failed job."""
    rows: list[dict[str, Any]] = []
    for res in results:
        for a in res.applied:
            rows.append({"conversation": conversation_id, "job_status": res.status, **a.to_dict()})
        for reason in res.dropped:
            rows.append({"conversation": conversation_id, "job_status": res.status, "dropped": reason})
        if res.status == "failed":
            rows.append({"conversation": conversation_id, "job_status": "failed", "reason": res.reason})
    return rows


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
    for chat in replay_locomo(conv, key, user_speaker=user_speaker, session=session):
        worker.run_job(chat)
    worker.close()
    return chat, worker


def extract_dataset(
    service: MemoryService,
    data: LoCoMo,
    extractor: Extractor | str = "observations",
    extractor_params: dict[str, Any] | None = None,
    checkers: Sequence[Checker] = (),
    reconcile: ReconcileConfig | None = None,
    state_path: str | Path | None = None,
    conversations: Sequence[str] | None = None,
    on_conversation: Callable[[Conversation, AutoMemoryWorker], None] | None = None,
    worker_params: dict[str, Any] | None = None,
) -> tuple[pd.DataFrame, list[JobResult]]:
    """Extract every (selected) conversation; returns per-conversation counts and all job results.

    ``extractor`` is an `Extractor` (bound to each conversation in turn) or a registered name built
    with ``extractor_params``.
    With ``state_path`` the chat sessions' cursors are read from and written to that JSON file
    (after each conversation), so a rerun over the same sessions resumes after the cursor, adds
    nothing twice, and retries only jobs that failed. A conversation with text that ends with no
    memory at all is not recorded as done (its cursor is not saved), so a rerun extracts it again.
    ``on_conversation`` sees each finished worker.
    """
    states: dict[str, dict[str, Any]] = {}
    if state_path is not None and Path(state_path).is_file():
        states = json.loads(Path(state_path).read_text())
    rows, results = [], []
    convs = [c for c in data if conversations is None or c.sample_id in conversations]
    base = resolve_extractor(extractor, **(extractor_params or {}))
    for conv in tqdm(convs, desc=f"extract ({base.name})", leave=False):
        key = conversation_key(conv)
        before = service.count(key)
        chat = ChatSession(id=f"locomo:{conv.sample_id}", key=key, state=dict(states.get(conv.sample_id, {})))
        ex = base.bind(conv)
        chat, worker = extract_conversation(service, conv, ex, checkers, reconcile, session=chat,
                                            worker_params=worker_params)
        c = worker.counters
        if service.count(key) == 0 and conv.turns:
            states.pop(conv.sample_id, None)  # nothing written: never cached as done
        else:
            states[conv.sample_id] = {k: (v.isoformat() if hasattr(v, "isoformat") else v)
                                      for k, v in chat.state.items()}
        if state_path is not None:
            write_json(state_path, states)
        if on_conversation is not None:
            on_conversation(conv, worker)
        rows.append({"conversation": conv.sample_id, "sessions": len(conv.sessions), "turns": len(conv.turns),
                     "jobs_run": c.jobs_run, "jobs_noop": c.jobs_noop, "jobs_failed": c.jobs_failed,
                     "ops_proposed": c.ops_proposed, "ops_applied": c.ops_applied,
                     "rewritten": c.ops_rewritten_by_reconcile, "skipped": c.ops_skipped_by_reconcile,
                     "ops_failed": c.ops_failed, "model_calls": c.model_calls,
                     "malformed_tool_calls": c.malformed_tool_calls,
                     "memories_added": service.count(key) - before, "memories": service.count(key)})
        results.extend(worker.results)
    return pd.DataFrame(rows).set_index("conversation"), results
