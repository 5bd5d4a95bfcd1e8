"""The work of one Ray task, on a worker: extract a conversation or answer a conversation's questions in a
private temp folder, from the state the driver ships (memory rows and index state through the public
`memlab.memory.shipping` (`export_rows` / `import_rows` / `export_index` / `import_index`), cache rows through
`cache_snapshot` / `store_cache_rows`), returning the records and everything it added to its caches.
The driver (`memlab.run.ray_executor`) schedules these and stores what they return.

Nothing on a worker needs the driver's filesystem. The driver sends each task what it needs: the
conversation (not the dataset path), the conversation's memory rows and its fitted index state (so
retrieval is bit-for-bit the one a local run does), and a snapshot of the response cache (and of the
model embedders' vectors) for the models of the grid. A worker computes in a private temp folder and
returns the records plus everything it added to its caches (store rows, index state, extraction cursor
and trace lines, new model responses and embeddings); the driver stores them in the results root, so a
rerun, on the cluster or locally, makes no model call. What the workers need: memlab (same version) and
ray installed, the model endpoints reachable, and the API key variable named by ``models.api_key_env``
(the driver forwards its value in the tasks' runtime environment).
"""

from __future__ import annotations

import contextlib
import os
import socket
import sqlite3
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import astuple, dataclass, field, fields
from pathlib import Path
from typing import Any

from memlab.data import Conversation, Question
from memlab.extract.pipeline import conversation_key, extract_dataset, keyed_trace_rows
from memlab.index.machine_cache import EMBEDDINGS
from memlab.memory.capabilities import extraction_log
from memlab.memory.shipping import export_index, export_rows, import_index, import_rows
from memlab.run.answering import Records, answer_batch, prepare_queries
from memlab.run.clients import Clients
from memlab.run.components import build_answerer, build_extractor, build_judge, import_component_modules
from memlab.run.config import ExperimentConfig
from memlab.run.extraction import build_checkers, build_cost, open_store, worker_params
from memlab.run.steps import attach_errata
from memlab.threads import set_threads, worker_threads

UnitHook = Callable[[str], None]


@dataclass(frozen=True)
class ResponseRow:
    """One cached model response as the worker and the driver exchange it (the response cache's columns, checksum
    included: `memlab.llm.cache`)."""

    h: str
    model: str
    body: str
    sha256: str


@dataclass(frozen=True)
class EmbeddingRow:
    """One cached model-embedder vector (the machine cache's ``emb`` columns: `memlab.index.embedding_cache`)."""

    eid: str
    h: str
    dim: int
    v: bytes
    crc: int


@dataclass
class CacheRows:
    """Cache rows shipped between the driver and a worker, typed (never ``SELECT *`` tuples)."""

    responses: list[ResponseRow] = field(default_factory=list)
    embeddings: list[EmbeddingRow] = field(default_factory=list)


def _columns(row: type) -> str:
    return ", ".join(f.name for f in fields(row))


def cache_snapshot(cache_root: Path, models: set[str], embeddings: Path) -> CacheRows:
    """The cached responses of ``models`` (under ``cache_root``) and the cached vectors of model embedders
    (``litellm:*``, in the ``embeddings`` file: the driver's machine cache): what a worker needs so that a cached
    rerun makes no model call. Rows are copied whole (checksums included). Corpus-fitted embedders (tfidf-lsa) are
    not shipped: their fit travels in the index state."""
    out = CacheRows()
    resp = cache_root / "responses.sqlite"
    if resp.is_file() and models:
        with sqlite3.connect(resp) as c:
            if c.execute("SELECT name FROM sqlite_master WHERE name='responses'").fetchone():
                q = (f"SELECT {_columns(ResponseRow)} FROM responses "
                     f"WHERE model IN ({','.join('?' * len(models))})")
                out.responses = [ResponseRow(*r) for r in c.execute(q, sorted(models))]
    if embeddings.is_file():
        with sqlite3.connect(embeddings) as c:
            if c.execute("SELECT name FROM sqlite_master WHERE name='emb'").fetchone():
                q = f"SELECT {_columns(EmbeddingRow)} FROM emb WHERE eid LIKE 'litellm:%'"
                out.embeddings = [EmbeddingRow(*r) for r in c.execute(q)]
    return out


def store_cache_rows(cache_root: Path, rows: CacheRows, embeddings: Path) -> None:
    """Insert the cache rows a worker returned into the results root's response cache and the ``embeddings`` file
    (each file created, with its format, by the class that owns it)."""
    if rows.responses:
        from memlab.llm import ResponseCache

        ResponseCache(cache_root / "responses.sqlite").close()  # creates or checks the file
        with sqlite3.connect(cache_root / "responses.sqlite") as c:
            c.executemany(f"INSERT OR REPLACE INTO responses ({_columns(ResponseRow)}) VALUES (?,?,?,?)",
                          [astuple(r) for r in rows.responses])
    if rows.embeddings:
        from memlab.index.embedders import CachedEmbedder, TfidfLSAEmbedder

        CachedEmbedder(TfidfLSAEmbedder(), embeddings).open()  # creates or checks the file
        with sqlite3.connect(embeddings) as c:
            c.executemany(f"INSERT OR IGNORE INTO emb ({_columns(EmbeddingRow)}) VALUES (?,?,?,?,?)",
                          [astuple(r) for r in rows.embeddings])


def _new_rows(root: Path, snapshot: CacheRows) -> CacheRows:
    """Cache rows a task added beyond its snapshot (model responses and model-embedder vectors)."""
    seen_r = {r.h for r in snapshot.responses}
    seen_e = {(r.eid, r.h) for r in snapshot.embeddings}
    got = cache_snapshot(root, _all_models(root), root / EMBEDDINGS)
    return CacheRows([r for r in got.responses if r.h not in seen_r],
                     [r for r in got.embeddings if (r.eid, r.h) not in seen_e])


def _all_models(root: Path) -> set[str]:
    p = root / "responses.sqlite"
    if not p.is_file():
        return set()
    with sqlite3.connect(p) as c:
        return {m for (m,) in c.execute("SELECT DISTINCT model FROM responses")}


def _where() -> dict[str, Any]:
    node = None
    try:
        import ray

        if ray.is_initialized():  # never start Ray from here (the unit functions also run without it)
            node = ray.get_runtime_context().get_node_id()
    except ImportError:
        pass
    return {"node_id": node, "host": socket.gethostname(), "pid": os.getpid()}


def _resolve(x: Any) -> Any:
    """An argument a task was sent inside its payload: a Ray object reference is fetched (Ray resolves only
    top-level arguments), anything else is the value."""
    if type(x).__name__ == "ObjectRef":
        import ray

        return ray.get(x)
    return x


@contextlib.contextmanager
def _private_root(cfg: ExperimentConfig, snapshot: CacheRows, unit: str,
                  hook: UnitHook | None) -> Iterator[tuple[Path, Clients]]:
    """A task's private temp folder, its caches seeded from the driver's snapshot, and its model clients."""
    if hook is not None:
        hook(unit)
    set_threads(worker_threads(cfg.run.threads))  # this task's share of the node, not every core per worker
    with tempfile.TemporaryDirectory(prefix="memlab-ray-") as tmp:
        root = Path(tmp)
        store_cache_rows(root, snapshot, root / EMBEDDINGS)  # the driver's vectors, in a private copy
        yield root, Clients(cfg, root / "responses.sqlite", embedding_cache=root / EMBEDDINGS)


def extract_unit(cfg: ExperimentConfig, conv: Conversation, rows: list[dict[str, Any]] | None,
                 state: dict[str, Any] | None, index_blob: bytes | None, snapshot: CacheRows,
                 unit: str, hook: UnitHook | None = None, modules: dict[str, list[str]] | None = None
                 ) -> dict[str, Any]:
    """Extract one conversation in a private folder, continuing from the cached rows/state/index given
    (``modules``: the user modules that register the run's components, imported first)."""
    t0 = time.perf_counter()
    import_component_modules(modules or {})
    with _private_root(cfg, snapshot, unit, hook) as (root, clients):
        extractor = build_extractor(cfg, clients)
        cdir = root / "extract"
        cdir.mkdir()
        svc = open_store(cfg, cdir, root, clients)
        key = conversation_key(conv)
        try:
            if rows:
                import_rows(svc, key, rows)
                import_index(svc, key, index_blob)
            if state:
                extraction_log(svc).save_extraction(conv.sample_id, state, [])
            lines: list[tuple[str, int, dict[str, Any]]] = []

            def on_conversation(c: Conversation, wk: Any) -> None:
                lines.extend(keyed_trace_rows(c.sample_id, wk.results))

            table, results = extract_dataset(  # its build cost travels in the state, as the cursor does
                svc, [conv], extractor, reconcile=cfg.extraction.reconcile, checkers=build_checkers(cfg),  # type: ignore[arg-type]
                conversations=[conv.sample_id], on_conversation=on_conversation, worker_params=worker_params(cfg),
                build_cost=build_cost(cfg))
            svc.searcher.ensure_built(key, lambda: svc.list(key))
            state = extraction_log(svc).extraction_state(conv.sample_id)
            return {"rows": export_rows(svc, key), "state": state, "trace": lines,
                    "table": table.reset_index().to_dict("records"),
                    "failures": [{"conversation": conv.sample_id, "reason": r.reason} for r in results
                                 if r.status == "failed"],
                    "index": export_index(svc, key), "cache": _new_rows(root, snapshot),
                    "models": clients.totals(), "where": _where(), "seconds": time.perf_counter() - t0}
        finally:
            svc.close()


def answer_unit(cfg: ExperimentConfig, conv: Conversation, questions: list[Question],
                rows: list[dict[str, Any]] | None, index_blob: bytes | None, snapshot: CacheRows,
                unit: str, hook: UnitHook | None = None, errata: Any = None,
                modules: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """Answer one conversation's questions (`memlab.run.answering.answer_batch`, as every executor does) from the
    memories given; ``errata`` is loaded by the driver (the file need not exist on the worker)."""
    t0 = time.perf_counter()
    import_component_modules(modules or {})
    with _private_root(cfg, snapshot, unit, hook) as (root, clients):
        answerer = build_answerer(cfg, clients)
        judge = attach_errata(build_judge(cfg, clients), errata)
        svc = None
        if answerer.needs_memory:
            svc = open_store(cfg, root / "store", root, clients)
            key = conversation_key(conv)
            import_rows(svc, key, rows or [])
            import_index(svc, key, index_blob)
            svc.searcher.ensure_built(key, lambda: svc.list(key))
            prepare_queries(svc, [(conv, q) for q in questions], progress=False)  # one batched encoder pass
        out: list[Records] = []
        try:
            answer_batch(cfg, answerer, judge, svc, conv, questions, out.append)
        finally:
            if svc is not None:
                svc.close()
        return {"records": out, "cache": _new_rows(root, snapshot), "models": clients.totals(), "where": _where(),
                "seconds": time.perf_counter() - t0}


@dataclass
class Task:
    """What a Ray task is sent: the unit's arguments (large ones as object references) and the driver's shared
    parts (the cache snapshot, the fault hook, the user modules)."""

    cfg: ExperimentConfig
    conv: Conversation
    unit: str
    rows: Any = None
    index: Any = None
    snapshot: Any = None
    hook: UnitHook | None = None
    modules: dict[str, list[str]] | None = None
    state: dict[str, Any] | None = None
    questions: list[Question] = field(default_factory=list)
    errata: Any = None


def extract_task(t: Task) -> dict[str, Any]:
    """An extraction unit on a worker."""
    return extract_unit(t.cfg, t.conv, _resolve(t.rows), t.state, _resolve(t.index), _resolve(t.snapshot), t.unit,
                        t.hook, t.modules)


def answer_task(t: Task) -> dict[str, Any]:
    """An answering unit on a worker."""
    return answer_unit(t.cfg, t.conv, t.questions, _resolve(t.rows), _resolve(t.index), _resolve(t.snapshot),
                       t.unit, t.hook, t.errata, t.modules)
