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
from memlab.extract.extractors import (
    CombinedExtractor,
    Extractor,
    LLMExtractor,
    ObservationsExtractor,
    TurnsExtractor,
)
from memlab.extract.messages import ChatSession, replay_locomo
from memlab.extract.reconcile import ReconcileConfig
from memlab.extract.worker import AutoMemoryWorker, JobResult
from memlab.memory.entry import UserKey
from memlab.memory.service import MemoryService

EXTRACTORS = ("turns", "observations", "turns+observations", "llm")
APP_NAME = "locomo"


def conversation_key(conv: Conversation) -> UserKey:
    """One UserKey per LoCoMo conversation: both speakers' memories live under it."""
    return UserKey(APP_NAME, conv.sample_id)


def make_extractor(name: str, conv: Conversation, **params: Any) -> Extractor:
    """An extractor by name for one conversation; ``params`` go to its constructor (``style`` for
    turns, ``model``/``prompt``/``client`` ... for llm)."""
    if name == "turns":
        return TurnsExtractor(conv, **params)
    if name == "observations":
        return ObservationsExtractor(conv)
    if name == "turns+observations":
        return CombinedExtractor([TurnsExtractor(conv, **params), ObservationsExtractor(conv)])
    if name == "llm":
        return LLMExtractor(**params)
    raise ValueError(f"extractor: expected one of {EXTRACTORS}, got {name!r}")


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
    job_timeout: float | None = None,
) -> tuple[ChatSession, AutoMemoryWorker]:
    """Replay a conversation session by session, running one extraction job after each."""
    key = conversation_key(conv)
    worker = AutoMemoryWorker(service, extractor, checkers=checkers, reconcile_config=reconcile,
                              **({"job_timeout": job_timeout} if job_timeout is not None else {}))
    chat = session
    for chat in replay_locomo(conv, key, user_speaker=user_speaker, session=session):
        worker.run_job(chat)
    worker.close()
    return chat, worker


def extract_dataset(
    service: MemoryService,
    data: LoCoMo,
    extractor: str = "observations",
    extractor_params: dict[str, Any] | None = None,
    checkers: Sequence[Checker] = (),
    reconcile: ReconcileConfig | None = None,
    state_path: str | Path | None = None,
    conversations: Sequence[str] | None = None,
    on_conversation: Callable[[Conversation, AutoMemoryWorker], None] | None = None,
    job_timeout: float | None = None,
) -> tuple[pd.DataFrame, list[JobResult]]:
    """Extract every (selected) conversation; returns per-conversation counts and all job results.

    With ``state_path`` the chat sessions' cursors are read from and written to that JSON file
    (after each conversation), so a rerun over the same sessions resumes after the cursor, adds
    nothing twice, and retries only jobs that failed. ``on_conversation`` sees each finished worker.
    """
    states: dict[str, dict[str, Any]] = {}
    if state_path is not None and Path(state_path).is_file():
        states = json.loads(Path(state_path).read_text())
    rows, results = [], []
    convs = [c for c in data if conversations is None or c.sample_id in conversations]
    for conv in tqdm(convs, desc=f"extract ({extractor})", leave=False):
        key = conversation_key(conv)
        before = service.count(key)
        chat = ChatSession(id=f"locomo:{conv.sample_id}", key=key, state=dict(states.get(conv.sample_id, {})))
        ex = make_extractor(extractor, conv, **(extractor_params or {}))
        chat, worker = extract_conversation(service, conv, ex, checkers, reconcile, session=chat,
                                            job_timeout=job_timeout)
        c = worker.counters
        states[conv.sample_id] = {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in chat.state.items()}
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
