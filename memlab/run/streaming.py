"""A run that streams its conversations: extract one key's memories, index them, answer its questions, then
release the key's index from memory before the next (LongMemEval: every question has its own haystack, so
building every key first would hold 500 haystacks' vectors and fits at once; memory now stays at one).

The results are those of the staged run (`memlab.run.extraction` then `memlab.run.answering`): each key's
memories, index and answers depend on that key alone. What the staged run keeps in the one saved index file
(`HybridIndex.save` at close) a streamed run keeps per key, beside it (``index-keys/<digest>.npz``, the
saved-index format of `memlab.memory.shipping.export_index`), so that a rerun on the cached extraction reads back the
very fit the extraction built, one key at a time. A failed extraction still stops the run before that key's
questions are answered (`ExtractionFailed`); the keys answered before it stay in the resume log.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

import pandas as pd

from memlab.atomic import write_with
from memlab.data import Conversation, LoCoMo, Question, dataset_name
from memlab.data.longmemeval import forget_haystack
from memlab.extract.extractors import Extractor
from memlab.extract.pipeline import conversation_key, extract_dataset
from memlab.index.embedders import Embedder
from memlab.index.text import analyze
from memlab.memory import MemoryService, ReleasesKeys, Searcher
from memlab.memory.shipping import export_index, import_index
from memlab.progress import progress_bar
from memlab.run.answering import StopFlag, answer_all
from memlab.run.clients import Clients
from memlab.run.config import ExperimentConfig
from memlab.run.extraction import (
    BUILD_LOG,
    ExtractionFailed,
    ExtractionOutcome,
    build_checkers,
    build_cost,
    build_rows,
    extraction_cache_key,
    extraction_info,
    open_store,
    worker_params,
    write_jsonl,
)
from memlab.run.records import ExtractionTraceRecord, MemoryRecord
from memlab.threads import peak_rss_mb, return_free_memory

KEY_INDEX_DIR = "index-keys"


def streams(data: LoCoMo) -> bool:
    """Whether a run over ``data`` streams its keys: a dataset whose every question has its own haystack
    (LongMemEval). LoCoMo (ten conversations, many questions each) keeps the staged run."""
    return dataset_name(data) == "longmemeval"


def key_index_path(cdir: Path, key: Any) -> Path:
    """Where a streamed run keeps one key's saved index in the extraction cache folder ``cdir``."""
    digest = hashlib.sha256(f"{key.app_name}\x00{key.user_id}".encode()).hexdigest()[:24]
    return cdir / KEY_INDEX_DIR / f"{digest}.npz"


def save_key_index(cdir: Path, key: Any, blob: bytes) -> None:
    """Keep a key's fitted index state (`shipping.export_index`) in its file (`key_index_path`)."""
    saved = key_index_path(cdir, key)
    saved.parent.mkdir(exist_ok=True)
    write_with(saved, lambda f: f.write(blob), binary=True)


def key_index_blob(svc: MemoryService, cdir: Path, key: Any) -> bytes | None:
    """A key's fitted index state: what a streamed run saved for it (the fit its extraction built), else the live
    one (None: neither). Whoever imports it checks it against the store's rows (`shipping.import_index`), so
    a file saved for other rows is not used (the key is then built from the rows)."""
    saved = key_index_path(cdir, key)
    return saved.read_bytes() if saved.is_file() else export_index(svc, key)


def release_key(svc: MemoryService, key: Any) -> None:
    """Drop a key's index state from memory (its rows stay in the store), and empty the stemming cache
    (`memlab.index.text.analyze` keeps up to 200,000 analysed texts: a released key's texts are not seen again,
    and an M question's 5,000 would otherwise stay, ~20 MB a question until the cache is full) and the parsed
    haystack the dataset keeps (`forget_haystack`: the next is parsed with none alive); the freed heap goes back
    to the system (`return_free_memory`)."""
    if isinstance(svc.searcher, ReleasesKeys):  # a searcher that cannot drop a key keeps it
        svc.searcher.release(key)
    analyze.cache_clear()
    forget_haystack()
    return_free_memory()


def resident_keys(svc: MemoryService) -> int:
    """How many keys the service's index holds in memory now."""
    return len(svc.searcher.keys()) if svc.searcher is not None else 0


def run_streamed(cfg: ExperimentConfig, data: LoCoMo, convs: list[Conversation],
                 todo: list[tuple[Conversation, Question]], extractor: Extractor, extractor_id: str,
                 answerer: Any, judge: Any, clients: Clients, cache_root: Path, run_dir: Path, dataset_sha: str,
                 stop: StopFlag, progress: bool = True, searcher: Searcher | None = None,
                 embedder: Embedder | None = None) -> tuple[ExtractionOutcome, int]:
    """Extract, index, answer and release each conversation in turn; returns the extraction outcome (its
    ``info`` as `run_extraction` writes it, over all conversations) and how many questions were answered.
    ``info["max_resident_keys"]`` says how many keys the index held at once; ``searcher`` / ``embedder``: the
    caller's own objects, as `memlab.run.extraction.run_extraction` takes them."""
    ex = cfg.extraction
    key = extraction_cache_key(cfg, dataset_sha, extractor_id, extractor)
    cdir = cache_root / "extract" / key
    cdir.mkdir(parents=True, exist_ok=True)
    durable = cfg.store.backend == "sqlite"
    svc = open_store(cfg, cdir, cache_root, clients, searcher=searcher, embedder=embedder)
    if not durable:
        (cdir / BUILD_LOG).unlink(missing_ok=True)  # an in-memory store is extracted afresh every run
    built: list[dict[str, Any]] = []  # each extracted key's build cost, as its store state holds it
    traces = run_dir / "traces"
    traces.mkdir(exist_ok=True)
    for name in ("extraction", "memories"):
        write_jsonl(traces / f"{name}.jsonl", [])  # this session's traces, appended key by key
    by_conv: dict[str, list[tuple[Conversation, Question]]] = {}
    for c, q in todo:
        by_conv.setdefault(c.sample_id, []).append((c, q))
    params = worker_params(cfg)
    checkers = build_checkers(cfg)
    tables: list[pd.DataFrame] = []
    failures: list[dict[str, str]] = []
    timings = {"extraction_s": 0.0, "indexing_s": 0.0, "answering_s": 0.0}
    n_answered = n_memories = most = 0
    out = ExtractionOutcome(svc)
    try:
        for conv in progress_bar(convs, desc="extract, index, answer (per key)", disable=not progress):
            ck = conversation_key(conv)
            t0 = time.perf_counter()
            table, results = extract_dataset(
                svc, data, extractor, reconcile=ex.reconcile, checkers=checkers, conversations=[conv.sample_id],
                worker_params=params, build_cost=build_cost(cfg))
            tables.append(table)
            built += build_rows(svc, [conv], cdir)
            mine = [{"conversation": conv.sample_id, "reason": r.reason} for r in results if r.status == "failed"]
            failures += mine
            worked = bool(int(table.jobs_run.sum() + table.jobs_failed.sum()))
            empty = bool(conv.turns) and svc.count(ck) == 0
            if (mine or empty) and not cfg.run.allow_failed_extraction:
                lines = [f"  {f['conversation']}: {f['reason']}" for f in mine[:20]]
                lines += [f"  {conv.sample_id}: the extractor wrote no memory for a conversation with text"] * empty
                raise ExtractionFailed(
                    f"extraction failed for {conv.sample_id}; not answering its questions (the keys before it "
                    f"were answered and are kept):\n" + "\n".join(lines) +
                    "\n(fix the cause and resume: done jobs are cached; or set run.allow_failed_extraction=true "
                    "to answer anyway)")
            _write_key_traces(svc, conv, traces, cdir)
            n_memories += svc.count(ck)
            timings["extraction_s"] += time.perf_counter() - t0
            mine_todo = by_conv.get(conv.sample_id, [])
            saved = key_index_path(cdir, ck)
            t1 = time.perf_counter()
            if mine_todo:
                if durable and ck not in svc.searcher.keys() and saved.is_file():
                    import_index(svc, ck, saved.read_bytes())  # the fit this key's extraction built
                svc.searcher.ensure_built(ck, lambda k=ck: svc.list(k))
                most = max(most, resident_keys(svc))
            if durable and (worked or not saved.is_file()):
                blob = export_index(svc, ck)  # None where the key was not built (nothing trustworthy to keep)
                if blob is not None:
                    save_key_index(cdir, ck, blob)
            timings["indexing_s"] += time.perf_counter() - t1
            if mine_todo:
                t2 = time.perf_counter()
                try:
                    n_answered += answer_all(cfg, answerer, judge, svc, mine_todo, run_dir, progress=False,
                                             stop=stop)
                finally:
                    timings["answering_s"] += time.perf_counter() - t2
            most = max(most, resident_keys(svc))
            release_key(svc, ck)
            stop.stop()
    except BaseException:
        svc.close()  # the runner closes the service only when it gets it back
        raise
    finally:
        write_jsonl(traces / "build_cost.jsonl", built)
        table = pd.concat(tables) if tables else pd.DataFrame()
        if tables:
            out.info = extraction_info(table, failures, convs[:len(tables)], key, cdir, extractor_id, ex.policy)
            out.info.update(memories=n_memories, streamed=True, max_resident_keys=most)
        out.timings = timings
        out.peak_rss_mb["answering"] = peak_rss_mb()
    return out, n_answered


def _write_key_traces(svc: MemoryService, conv: Conversation, traces: Path, cdir: Path) -> None:
    """Append one key's extraction and memory trace lines (the staged run writes them all at once)."""
    rows = svc.extraction_trace([conv.sample_id])
    write_jsonl(traces / "extraction.jsonl", [ExtractionTraceRecord.from_dict(r, where=f"{cdir}: trace line").to_dict()
                                         for r in rows], mode="a")
    write_jsonl(traces / "memories.jsonl", [MemoryRecord.of(conv.sample_id, e).to_dict()
                                       for e in svc.list(conversation_key(conv))], mode="a")
