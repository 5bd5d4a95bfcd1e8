"""The extraction stage of a run: the configured extractor over the selected conversations into a
cached store, its trace, and the per-key indexes built before answering.

The cache (``<results>/.cache/extract/<key>/``) is keyed by what decides the memories: dataset
sha256, extractor (and its prompt and model), turn style, the reconcile applied, checkers, store
backend and the update policy where it can change the store (`extraction_cache_key`), so an ablation
over retrieval, answering or the policy of an add-only extractor re-extracts nothing. A failed job or a
conversation with text that got no memory stops the run before answering (`ExtractionFailed`)
unless ``run.allow_failed_extraction`` says otherwise.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from memlab.data import Conversation
from memlab.eval import cost as costs
from memlab.extract.checkers import Checker, checks_all, checks_any, message_threshold, time_interval
from memlab.extract.extractors import Extractor
from memlab.extract.messages import ChatSession, locomo_messages
from memlab.extract.pipeline import BUILD_COST, BuildCost, conversation_key
from memlab.extract.policy import DEFAULT_POLICY, applied_reconcile, policy_decides_store
from memlab.index import open_service
from memlab.index.embedders import Embedder, blas_controller
from memlab.memory import EncodesAhead, MemoryService, PlansBuilds
from memlab.memory.capabilities import extraction_log
from memlab.memory.entry import MemoryEntry, UserKey
from memlab.memory.search_types import Searcher
from memlab.run.clients import Clients
from memlab.run.config import ExperimentConfig
from memlab.run.records import ExtractionTraceRecord
from memlab.threads import resolve_threads

BUILD_LOG = "build_cost.jsonl"  # the build costs older caches logged beside the store (now: in its state)
CACHE_VERSION = 3  # 3: cursor and trace live in the store (checksummed), index saved as .npz


class ExtractionFailed(RuntimeError):
    """Extraction jobs failed or wrote nothing: the run stops before answering."""


@dataclass
class ExtractionOutcome:
    """What a memory system's ingest hands on (`memlab.run.systems`): the service to answer from and what run.json
    records."""

    service: MemoryService
    info: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)


def build_checkers(cfg: ExperimentConfig) -> list[Checker]:
    """The configured checkers (none: every job extracts)."""
    c = cfg.extraction.checkers
    parts: list[Checker] = []
    if c.message_threshold is not None:
        parts.append(message_threshold(c.message_threshold))
    if c.time_interval_s is not None:
        from datetime import timedelta

        parts.append(time_interval(timedelta(seconds=c.time_interval_s)))
    if len(parts) <= 1:
        return parts
    return [checks_all(*parts) if c.combine == "all" else checks_any(*parts)]


def extraction_cache_key(cfg: ExperimentConfig, dataset_sha: str, extractor_id: str,
                         extractor: Extractor | None = None) -> str:
    """The extraction cache's key: what decides the stored memories. Reconcile counts as applied
    (`memlab.extract.policy.applied_reconcile`: thresholds out when it is off) and the update policy only where
    it can change the store (`policy_decides_store`, from ``extractor.proposes``); without the ``extractor``
    object both count as configured."""
    ex = cfg.extraction
    llm = cfg.role_in_use("extractor")  # llm, turns+llm: the prompt and the model decide the ops
    reconcile, policy_counts = ex.reconcile, True
    if extractor is not None:
        reconcile = applied_reconcile(ex.reconcile, extractor.reconciles, ex.policy)
        policy_counts = policy_decides_store(extractor.proposes, reconcile)
    payload: dict[str, Any] = {"dataset": dataset_sha, "extractor": extractor_id, "prompt": ex.prompt if llm else None,
                               "model": ex.model if llm else None, "reconcile": asdict(reconcile),
                               "turn_style": ex.turn_style, "backend": cfg.store.backend, "version": CACHE_VERSION}
    checkers = asdict(ex.checkers)
    if checkers != {"message_threshold": None, "time_interval_s": None, "combine": "all"}:
        payload["checkers"] = checkers  # only when set, so the default keeps existing caches valid
    if policy_counts and ex.policy != DEFAULT_POLICY:
        payload["policy"] = ex.policy  # likewise: only when not the default update policy
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def write_jsonl(path: Path, rows: list[dict[str, Any]], mode: str = "w") -> None:
    """Write JSON lines atomically, or append them to a log (``mode="a"``)."""
    from memlab.atomic import write_with

    def dump(f: Any) -> None:
        for r in rows:
            f.write(json.dumps(r, default=str) + "\n")

    if mode == "a":
        with open(path, "a", encoding="utf-8") as f:
            dump(f)
    else:
        write_with(path, dump)


def build_cost(cfg: ExperimentConfig) -> BuildCost:
    """`extract_dataset`'s hook: a conversation's build cost so far, this worker's jobs added when they did work
    (saved with the cache entry it describes, in the cursor's transaction)."""

    def cost(conv: Conversation, worker: Any, previous: dict[str, Any] | None) -> dict[str, Any] | None:
        if not any(r.status in ("ran", "failed") for r in worker.results):
            return previous
        return costs.add_build(previous, costs.build_usage(conv.sample_id, worker.results,
                                                           cfg.index.own()["date_in_text"]))

    return cost


def build_rows(svc: MemoryService, convs: list[Conversation], cdir: Path) -> list[dict[str, Any]]:
    """Each conversation's build cost as its saved extraction state holds it; for a cache written before memlab
    saved it there, the lines its old log beside the store holds (none: the cost is unknown, `amortize`)."""
    legacy: dict[str, list[dict[str, Any]]] = {}
    log = cdir / BUILD_LOG
    if log.is_file():
        for line in log.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            legacy.setdefault(row.get("conversation"), []).append(row)
    rows: list[dict[str, Any]] = []
    for c in convs:
        saved = (extraction_log(svc).extraction_state(c.sample_id) or {}).get(BUILD_COST)
        rows += [saved] if saved else legacy.get(c.sample_id, [])
    return rows


def index_file(cfg: ExperimentConfig, embedder: Embedder | None = None) -> str:
    """The file name of the configured index in a conversation store's cache folder (one per index section;
    a caller's ``embedder`` object stands in for the configured one)."""
    section = cfg.index.file_key()
    if embedder is not None:
        section["embedder"] = embedder.embedder_id
    return f"index-{hashlib.sha256(json.dumps(section, sort_keys=True).encode()).hexdigest()[:10]}.npz"


def open_store(cfg: ExperimentConfig, cdir: Path, cache_root: Path, clients: Clients,
               searcher: Searcher | None = None, embedder: Embedder | None = None) -> MemoryService:
    """The configured store and index, at ``cdir`` for a durable backend; the caller's own ``searcher``
    (any `memlab.memory.Searcher`) or ``embedder`` object replaces the configured one."""
    idx = cfg.index
    common = {**idx.hybrid_params(), "embedder_params": clients.embedder_params(), "searcher": searcher}
    if embedder is not None:
        common["embedder"] = embedder
    if cfg.store.backend == "sqlite":
        return open_service("sqlite", path=cdir / "store.db", embedding_cache=clients.embedding_cache,
                            index_path=cdir / index_file(cfg, embedder), on_corrupt="rebuild", **common)
    return open_service("memory", **common)


def job_timeout(cfg: ExperimentConfig) -> float:
    """``extraction.worker.job_timeout_s``; unset: for a model extractor its call timeout x (retries + 1)
    + 30 s (a slow local model's retries fit in one job), else 30 s."""
    if cfg.extraction.worker.job_timeout_s is not None:
        return cfg.extraction.worker.job_timeout_s
    if not cfg.extraction.model:
        return 30.0
    r = cfg.models.resolve("extractor")
    return r["timeout"] * (r["max_retries"] + 1) + 30.0


def worker_params(cfg: ExperimentConfig) -> dict[str, Any]:
    """`AutoMemoryWorker`'s parameters from the config. A model extractor's client stack (litellm: seconds
    to import, far more on a loaded node) is loaded here, before any job's timeout clock starts, so the
    first job of a process is not timed out by an import."""
    if cfg.extraction.model:
        from memlab.llm import import_litellm

        import_litellm()
    w = cfg.extraction.worker
    return {"workers": w.workers, "capacity": w.capacity, "job_timeout": job_timeout(cfg),
            "policy": cfg.extraction.policy}


def extraction_info(table: Any, failures: list[dict[str, str]], convs: list[Conversation], key: str, cdir: Path,
                    extractor_id: str, policy: str) -> dict[str, Any]:
    """What run.json records of the extraction stage (``table``: `extract_dataset`'s per-conversation counts)."""
    worked = int((table.jobs_run + table.jobs_failed).sum())
    empty = [c.sample_id for c in convs if c.turns and int(table.loc[c.sample_id, "memories"]) == 0]
    return {
        "cache_key": key, "cache_dir": str(cdir), "extractor": extractor_id,
        "conversations_extracted": int((table.jobs_run > 0).sum()), "jobs_run": int(table.jobs_run.sum()),
        "jobs_failed": int(table.jobs_failed.sum()), "ops_applied": int(table.ops_applied.sum()),
        "ops_failed": int(table.ops_failed.sum()), "model_calls": int(table.model_calls.sum()),
        "malformed_tool_calls": int(table.malformed_tool_calls.sum()) if "malformed_tool_calls" in table else 0,
        "from_cache": worked == 0, "failed_jobs": failures, "empty_conversations": empty,
        "policy": policy, "superseded": int(table.superseded.sum()), "refused": int(table.refused.sum()),
    }


def extraction_done(conv: Conversation, state: dict[str, Any] | None) -> bool:
    """Whether a conversation's cached cursor is past its last message (a replay would run no job): the engine's
    one cache skip (`memlab.run.engine`)."""
    if not state:
        return False
    chat = ChatSession(id=f"locomo:{conv.sample_id}", key=conversation_key(conv), state=dict(state),
                       messages=locomo_messages(conv))
    return not chat.delta()


def trace_lines(svc: MemoryService, convs: list[Conversation], cdir: Path) -> list[dict[str, Any]]:
    """The extraction trace lines of ``convs`` as the store holds them, checked (`ExtractionTraceRecord`)."""
    rows = extraction_log(svc).extraction_trace([c.sample_id for c in convs])
    return [ExtractionTraceRecord.from_dict(r, where=f"{cdir}: trace line").to_dict() for r in rows]


def build_indexes(svc: MemoryService, rows: dict[UserKey, list[MemoryEntry]], threads: int | None,
                  meanwhile: Callable[[], None] = lambda: None) -> int:
    """Build every key's index (``rows``: each key's memories, as `MemoryService.list` reads them) now, so
    answering latency excludes it, and run ``meanwhile`` here. Where building is computation on the rows alone
    (`memlab.memory.PlansBuilds.model_free`: a corpus-fitted embedder), up to ``run.threads`` keys build side by side in
    threads, largest first, while ``meanwhile`` runs: the fits' SVDs release the GIL, and each runs on one BLAS
    thread, so every key's index is the one a serial build makes (a model pass builds one key at a time, with
    all the threads). Returns how many keys built at once."""
    searcher = svc.searcher
    if searcher is None:
        meanwhile()
        return 0
    keys = sorted(rows, key=lambda k: -len(rows[k]))
    todo = sum(map(searcher.needs_build, keys)) if isinstance(searcher, PlansBuilds) and searcher.model_free else 0
    workers = min(resolve_threads(threads), todo)
    if workers <= 1:  # here: Ctrl-C during a long model pass stops it at once
        meanwhile()
        if isinstance(searcher, EncodesAhead):
            searcher.encode_ahead({k: rows[k] for k in keys})
        for key in keys:
            searcher.ensure_built(key, lambda k=key: rows[k])
        return 1
    with blas_controller().limit(limits=1, user_api="blas"):  # each fit sets one thread too: this holds throughout
        pool = ThreadPoolExecutor(workers)
        try:
            built = [pool.submit(searcher.ensure_built, k, lambda k=k: rows[k]) for k in keys]
            meanwhile()
            for f in built:
                f.result()
        finally:  # Ctrl-C: the keys not started are dropped, the running ones finish
            pool.shutdown(wait=True, cancel_futures=True)
    return workers


_TABLE_COLS = ("sessions", "turns", "jobs_run", "jobs_noop", "jobs_failed", "ops_proposed", "ops_applied", "rewritten",
               "skipped", "ops_failed", "superseded", "refused", "model_calls", "malformed_tool_calls",
               "memories_added", "memories")


def extraction_row(conv: Conversation, memories: int) -> dict[str, Any]:
    """A conversation's `extract_dataset` counts when it was served from the cache: no job, its memories."""
    return {"conversation": conv.sample_id, **{c: 0 for c in _TABLE_COLS}, "sessions": len(conv.sessions),
            "turns": len(conv.turns), "memories": memories}


def extraction_table(rows: list[dict[str, Any]]) -> Any:
    """Per-conversation extraction counts as `extract_dataset` returns them (indexed by conversation)."""
    import pandas as pd

    return pd.DataFrame(rows, columns=["conversation", *_TABLE_COLS]).set_index("conversation")


def extract_here(cfg: ExperimentConfig, svc: MemoryService, data: Any, extractor: Extractor,
                 conv: Conversation) -> dict[str, Any]:
    """Extract one conversation into ``svc`` in this process: its `extract_dataset` counts (as records) and failed
    jobs, as an extraction unit returns them under every executor (`memlab.run.engine`)."""
    from memlab.extract.pipeline import extract_dataset

    table, results = extract_dataset(svc, data, extractor, reconcile=cfg.extraction.reconcile,
                                     checkers=build_checkers(cfg), conversations=[conv.sample_id],
                                     worker_params=worker_params(cfg), build_cost=build_cost(cfg))
    return {"table": table.reset_index().to_dict("records"),
            "failures": [{"conversation": conv.sample_id, "reason": r.reason} for r in results if r.status == "failed"]}


def failure_message(failed: list[dict[str, str]], empty: list[str], kept: bool) -> str:
    """What `ExtractionFailed` says: each failed job and empty conversation, and what to do (``kept``: keys were
    answered before it, and stay)."""
    lines = [f"  {f['conversation']}: {f['reason']}" for f in failed[:20]]
    lines += [f"  {c}: the extractor wrote no memory for a conversation with text" for c in empty]
    more = f"\n  ... and {len(failed) - 20} more failed jobs" if len(failed) > 20 else ""
    return (f"extraction failed for {len({f['conversation'] for f in failed} | set(empty))} conversation(s); not "
            f"answering{' (the keys answered before it are kept)' if kept else ''}:\n" + "\n".join(lines) + more +
            "\n(fix the cause and rerun: done jobs are cached; or set run.allow_failed_extraction=true to answer "
            "anyway)")
