"""The experiment runner: extraction (cached), indexing, answering, scoring, traces; resumable.

Results under ``results/<run_id>/``: ``config.yaml`` (as run), ``environment.json``,
``predictions.jsonl`` (one line per finished question: the resume log), ``predictions.csv`` and
``summary.csv`` (pandas-readable), ``traces/`` (JSONL: extraction ops, memories, retrieval,
answers) and ``run.json`` (status, counts, stage timings).

Caches under ``results/.cache/``: extraction stores keyed by (dataset sha256, extractor, prompt,
model, reconcile params), so an ablation over retrieval or answering re-extracts nothing; model
responses keyed by the full request, so a rerun of the same config makes zero model calls.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import json
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml
from tqdm.auto import tqdm

from memlab.answer import (
    AnswerContext,
    Answerer,
    ExtractiveAnswerer,
    Judge,
    LongContextAnswerer,
    OptimizedAnswerer,
    OriginalAnswerer,
)
from memlab.atomic import write_json, write_table
from memlab.data import Conversation, LoCoMo, Question, load_locomo, sha256_file
from memlab.eval import category_summary, evidence_recall, score_frame
from memlab.extract.pipeline import conversation_key, extract_dataset, make_extractor, trace_rows
from memlab.index import open_service
from memlab.llm import ModelClient
from memlab.memory import MemoryService, SearchOptions
from memlab.run.config import ExperimentConfig
from memlab.rundir import environment, new_run_dir, results_root

RECALL_KS = (1, 5, 10, 20)
PREDICTIONS_LOG = "predictions.jsonl"


@dataclass
class Run:
    """What a run returns to a notebook: DataFrames plus where everything was written."""

    run_dir: Path
    config: ExperimentConfig
    predictions: pd.DataFrame
    summary: pd.DataFrame
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def traces(self) -> dict[str, Path]:
        return {p.stem: p for p in sorted((self.run_dir / "traces").glob("*.jsonl"))}

    def _repr_html_(self) -> str:
        return f"<b>{self.run_dir.name}</b><br>" + self.summary._repr_html_()

    def __repr__(self) -> str:
        return f"Run({self.run_dir})\n{self.summary.to_string()}"


# ------------------------------------------------------------------------------- building
class Clients:
    """One `ModelClient` per model name, sharing the on-disk response cache."""

    def __init__(self, cfg: ExperimentConfig, cache_path: Path):
        self.cfg = cfg
        self.cache_path = cache_path
        self._clients: dict[str, ModelClient] = {}
        self._lock = threading.Lock()

    def get(self, model: str) -> ModelClient:
        with self._lock:
            if model not in self._clients:
                m = self.cfg.models
                key = os.environ.get(m.api_key_env) if m.api_key_env else None
                if m.api_base and key is None:
                    key = "memlab-local"
                self._clients[model] = ModelClient(model, api_base=m.api_base, api_key=key, timeout=m.timeout,
                                                   max_retries=m.max_retries, cache_path=self.cache_path)
            return self._clients[model]

    def totals(self) -> dict[str, int]:
        return {"model_calls": sum(c.calls for c in self._clients.values()),
                "cache_hits": sum(c.cache_hits for c in self._clients.values()),
                "failures": sum(c.failures for c in self._clients.values())}


def extractor_params(cfg: ExperimentConfig, clients: Clients) -> dict[str, Any]:
    """Constructor parameters of the configured extractor (`memlab.extract.pipeline.make_extractor`)."""
    ex = cfg.extraction
    if ex.extractor in ("turns", "turns+observations"):
        return {"style": ex.turn_style}
    if ex.extractor == "llm":
        return {"model": ex.model, "prompt": ex.prompt, "client": clients.get(ex.model)}
    return {}


def build_answerer(cfg: ExperimentConfig, clients: Clients) -> Answerer:
    a = cfg.answer
    if a.arm == "extractive":
        return ExtractiveAnswerer(span=a.span, abstain=a.abstain, speaker_window=a.speaker_window)
    client = clients.get(a.model)
    if a.arm == "long-context":
        return LongContextAnswerer(client, prompt=a.prompt or "long-context")
    if a.arm == "original":
        return OriginalAnswerer(client, prompt=a.prompt or "original")
    return OptimizedAnswerer(client, prompt=a.prompt or "optimized", max_rounds=a.max_rounds)


def select_questions(cfg: ExperimentConfig, data: LoCoMo) -> list[tuple[Conversation, Question]]:
    d = cfg.dataset
    known = {c.sample_id for c in data}
    if d.conversations:
        bad = [c for c in d.conversations if c not in known]
        if bad:
            raise ValueError(f"dataset.conversations: unknown {bad}; known: {sorted(known)}")
    out = []
    for conv in data:
        if d.conversations and conv.sample_id not in d.conversations:
            continue
        qs = [q for q in conv.questions if not d.categories or q.category in d.categories]
        if d.question_limit is not None:
            qs = qs[: d.question_limit]
        out.extend((conv, q) for q in qs)
    return out


def extraction_cache_key(cfg: ExperimentConfig, dataset_sha: str, extractor_id: str) -> str:
    ex = cfg.extraction
    llm = ex.extractor == "llm"
    payload = {"dataset": dataset_sha, "extractor": extractor_id, "prompt": ex.prompt if llm else None,
               "model": ex.model if llm else None, "reconcile": asdict(ex.reconcile),
               "turn_style": ex.turn_style, "backend": cfg.store.backend, "version": 2}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def _jsonl(path: Path, rows: list[dict[str, Any]], mode: str = "w") -> None:
    with open(path, mode, encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, default=str) + "\n")


# --------------------------------------------------------------------------------- stages
def _extract(cfg: ExperimentConfig, data: LoCoMo, convs: list[Conversation], clients: Clients, cache_root: Path,
             run_dir: Path, timings: dict[str, float]) -> tuple[MemoryService, dict[str, Any]]:
    t0 = time.perf_counter()
    sha = sha256_file(data.report.path)
    ex = cfg.extraction
    params = extractor_params(cfg, clients)
    probe = make_extractor(ex.extractor, convs[0], **params) if convs else None
    key = extraction_cache_key(cfg, sha, probe.cache_id() if probe else "none")
    cdir = cache_root / "extract" / key
    cdir.mkdir(parents=True, exist_ok=True)
    idx = cfg.index
    index_id = hashlib.sha256(json.dumps(asdict(idx), sort_keys=True).encode()).hexdigest()[:10]
    emb_params: dict[str, Any] = {}
    if idx.embedder.startswith("litellm:"):
        client = clients.get(idx.embedder[len("litellm:"):])
        emb_params = {"api_base": client.api_base, "api_key": client.api_key, "timeout": client.timeout}
    idx_params = {"date_in_text": idx.date_in_text, "append_citing": idx.append_citing, "ef_search": idx.ef_search,
                  "ef_construction": idx.ef_construction, "embedder_params": emb_params}
    if cfg.store.backend == "sqlite":
        db = cdir / "store.db"
        svc = open_service("sqlite", path=db, embedder=idx.embedder, index=idx.factory, keyword=idx.keyword,
                           embedding_cache=cache_root / "embeddings.sqlite",
                           index_path=cdir / f"index-{index_id}.pkl", **idx_params)
    else:
        svc = open_service("memory", embedder=idx.embedder, index=idx.factory, keyword=idx.keyword, **idx_params)
    ext_log = cdir / "extraction.jsonl"
    if cfg.store.backend != "sqlite":
        ext_log.unlink(missing_ok=True)  # an in-memory store is extracted afresh every run

    def log_conversation(conv: Conversation, worker: Any) -> None:
        _jsonl(ext_log, trace_rows(conv.sample_id, worker.results), mode="a")

    table, _ = extract_dataset(svc, data, ex.extractor, params, reconcile=ex.reconcile,
                               state_path=cdir / "state.json" if cfg.store.backend == "sqlite" else None,
                               conversations=[c.sample_id for c in convs], on_conversation=log_conversation)
    info = {"cache_key": key, "cache_dir": str(cdir), "conversations_extracted": int((table.jobs_run > 0).sum()),
            "ops_applied": int(table.ops_applied.sum()), "jobs_failed": int(table.jobs_failed.sum()),
            "from_cache": bool(table.jobs_run.sum() == 0)}
    timings["extraction_s"] = time.perf_counter() - t0
    traces = run_dir / "traces"
    traces.mkdir(exist_ok=True)
    wanted = {c.sample_id for c in convs}
    if ext_log.is_file():
        with open(ext_log, encoding="utf-8") as src, open(traces / "extraction.jsonl", "w", encoding="utf-8") as dst:
            for line in src:
                if json.loads(line).get("conversation") in wanted:
                    dst.write(line)
    mem_rows = []
    for conv in convs:
        for e in svc.list(conversation_key(conv)):
            mem_rows.append({"conversation": conv.sample_id, "id": e.id, "text": e.text, "kind": e.kind,
                             "event_time": e.event_time, "source_ids": list(e.source_ids)})
    _jsonl(traces / "memories.jsonl", mem_rows)
    t1 = time.perf_counter()
    for conv in convs:  # build the per-key indexes now, so answering latency excludes it
        svc.searcher.ensure_built(conversation_key(conv), lambda c=conv: svc.list(conversation_key(c)))
    timings["indexing_s"] = time.perf_counter() - t1
    info["memories"] = len(mem_rows)
    return svc, info


def _answer_one(cfg: ExperimentConfig, answerer: Answerer, judge: Judge | None, svc: MemoryService | None,
                conv: Conversation, q: Question) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    r = cfg.retrieval
    search = SearchOptions(max_results=r.top_k, hybrid=r.hybrid, rrf_k=r.rrf_k, dedupe=r.dedupe,
                           kind_fallback=r.kind_fallback, participant_boost=r.participant_boost,
                           participant_boost_sigma=r.participant_boost_sigma, fusion=r.fusion,
                           fusion_weights=r.fusion_weights, unit=r.unit)
    ctx = AnswerContext(service=svc, key=conversation_key(conv), conversation=conv, search=search,
                        preload_budget=r.preload)
    base = {"qid": q.qid, "conversation_id": q.conversation_id, "q_index": q.index, "category": q.category,
            "question": q.question, "answer": q.answer, "evidence": list(q.evidence_ids),
            "evidence_raw": list(q.evidence)}
    try:
        a = answerer.timed(q, ctx)
    except Exception as e:  # one failed question is recorded and the run goes on
        row = {**base, "prediction": "", "error": f"{type(e).__name__}: {e}", "calls": 0, "cached_calls": 0,
               "prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0, "tokens_estimated": False,
               "context_tokens": 0, "latency_s": 0.0, "retrieved_ids": [], "first_query_ids": [], "j": None,
               "rule": "error"}
        return row, {"qid": q.qid, "queries": []}, {"qid": q.qid, "error": row["error"]}
    first = a.queries[0].hits if a.queries else []
    j = None
    judge_usage = None
    if judge is not None:
        try:
            j, judge_usage, _ = judge.judge(q, a.prediction)
        except Exception as e:
            j = None
            a.rule += f" (judge failed: {e})"
    row = {**base, "prediction": a.prediction, "error": None, "calls": a.calls, "cached_calls": a.cached_calls,
           "prompt_tokens": a.usage.prompt_tokens, "completion_tokens": a.usage.completion_tokens,
           "cached_tokens": a.usage.cached_tokens, "tokens_estimated": a.usage.estimated,
           "context_tokens": a.context_tokens, "latency_s": a.latency_s, "retrieved_ids": a.context_source_ids,
           "first_query_ids": [[s for s in h["source_ids"]] for h in first], "j": j, "rule": a.rule,
           "judge_prompt_tokens": judge_usage.prompt_tokens if judge_usage else 0}
    retrieval = {"qid": q.qid, "evidence": list(q.evidence_ids), "preload": a.preload,
                 "queries": [asdict(t) for t in a.queries],
                 "context_ids": [e.id for e in a.context]}
    for t in retrieval["queries"]:
        for h in t["hits"]:
            h["evidence_hit"] = bool(set(h["source_ids"]) & set(q.evidence_ids))
    answer = {"qid": q.qid, "prompt_hash": a.prompt_hash, "prompt": a.prompt if len(a.prompt) < 4000 else
              a.prompt[:4000] + f"... [{len(a.prompt)} chars]", "response": a.response, "tool_calls": a.tool_calls,
              "prediction": a.prediction, "rule": a.rule, "usage": asdict(a.usage), "calls": a.calls,
              "latency_s": a.latency_s}
    return row, retrieval, answer


def _recall_at(row: dict[str, Any], k: int) -> float:
    ids = [s for h in row.get("first_query_ids", [])[:k] for s in h]
    return evidence_recall(ids, row.get("evidence") or [])


def summarize(pred: pd.DataFrame, cfg: ExperimentConfig) -> pd.DataFrame:
    """Per-category table: F1, BLEU-1, EM, J, Recall@k, tokens, calls, latency p50/p95."""
    scores = pred
    metrics = ["f1", "bleu1", "em"] + (["j"] if cfg.judge.model else [])
    metrics += [f"recall@{k}" for k in RECALL_KS] + ["context_recall"]
    summ = category_summary(scores, metrics=metrics)
    groups = [(int(c), scores[scores.category == c]) for c in sorted(scores.category.unique())]
    groups += [("overall 1-4", scores[scores.category.isin([1, 2, 3, 4])]), ("overall 1-5", scores)]
    extra = {}
    for name, g in groups:
        n = max(len(g), 1)
        extra[name] = {
            "prompt_tokens_qa": g.prompt_tokens.sum() / n, "completion_tokens_qa": g.completion_tokens.sum() / n,
            "cached_tokens_qa": g.cached_tokens.sum() / n,
            "tokens_qa": (g.prompt_tokens.sum() + g.completion_tokens.sum()) / n,
            "context_tokens_qa": g.context_tokens.sum() / n, "calls_qa": g.calls.sum() / n,
            "latency_p50_s": float(np.percentile(g.latency_s, 50)) if len(g) else np.nan,
            "latency_p95_s": float(np.percentile(g.latency_s, 95)) if len(g) else np.nan,
            "errors": int(g.error.notna().sum()),
        }
    return summ.join(pd.DataFrame(extra).T)


def _finalize(run_dir: Path, cfg: ExperimentConfig, info: dict[str, Any]) -> Run:
    rows = [json.loads(line) for line in open(run_dir / PREDICTIONS_LOG, encoding="utf-8")]
    order = {qid: i for i, qid in enumerate(info.get("qid_order", []))}
    rows.sort(key=lambda r: order.get(r["qid"], len(order)))
    pred = pd.DataFrame(rows)
    pred = score_frame(pred)
    pred["context_recall"] = [evidence_recall(r, e) for r, e in zip(pred.retrieved_ids, pred.evidence)]
    for k in RECALL_KS:
        pred[f"recall@{k}"] = [_recall_at(r, k) for r in rows]
    if "j" in pred:
        pred["j"] = pd.to_numeric(pred["j"], errors="coerce")
    summ = summarize(pred, cfg)
    out = pred.drop(columns=["first_query_ids"]).set_index("qid")
    write_table(run_dir / "predictions.csv", out)
    write_table(run_dir / "summary.csv", summ)
    write_json(run_dir / "summary.json", json.loads(summ.to_json(orient="index")))
    return Run(run_dir=run_dir, config=cfg, predictions=pred.drop(columns=["first_query_ids"]), summary=summ,
               info=info)


def run_experiment(config: ExperimentConfig | str | Path, results: str | Path | None = None,
                   resume: str | Path | None = None, progress: bool = True) -> Run:
    """Run one experiment (a config without a grid) and return its `Run`; ``resume`` finishes a killed run."""
    t_start = time.perf_counter()
    timings: dict[str, float] = {}
    if resume is not None:
        run_dir = Path(resume)
        if not (run_dir / "config.yaml").is_file():
            raise FileNotFoundError(f"{run_dir}: not a run folder (no config.yaml)")
        cfg = ExperimentConfig.from_dict(yaml.safe_load((run_dir / "config.yaml").read_text()),
                                         where=str(run_dir / "config.yaml"))
        root = run_dir.parent
    else:
        cfg = config if isinstance(config, ExperimentConfig) else ExperimentConfig.from_yaml(config)
        if cfg.grid:
            raise ValueError("this config is an ablation (it has a grid): use run_ablation, or expand() it")
        root = Path(results) if results is not None else results_root()
        run_dir = new_run_dir(cfg.name, root)
        (run_dir / "config.yaml").write_text(cfg.to_yaml())
        write_json(run_dir / "environment.json", environment())
    cache_root = root / ".cache"
    (run_dir / "traces").mkdir(exist_ok=True)
    t0 = time.perf_counter()
    data = load_locomo(cfg.dataset.path)
    picks = select_questions(cfg, data)
    convs = list({c.sample_id: c for c, _ in picks}.values())
    timings["load_s"] = time.perf_counter() - t0
    clients = Clients(cfg, cache_root / "responses.sqlite")
    answerer = build_answerer(cfg, clients)
    svc, ext_info = (None, {})
    if answerer.needs_memory:
        svc, ext_info = _extract(cfg, data, convs, clients, cache_root, run_dir, timings)
    judge = Judge(clients.get(cfg.judge.model), cfg.judge.prompt) if cfg.judge.model else None

    log = run_dir / PREDICTIONS_LOG
    done: set[str] = set()
    if log.is_file():
        kept = []
        for line in log.read_text(encoding="utf-8").splitlines():
            try:
                kept.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a line cut by the kill: everything after it is redone
        done = {r["qid"] for r in kept}
        _jsonl(log, kept)
        for name in ("retrieval", "answers"):  # drop trace lines of questions that did not finish
            p = run_dir / "traces" / f"{name}.jsonl"
            if p.is_file():
                lines = []
                for ln in p.read_text(encoding="utf-8").splitlines():
                    try:
                        if json.loads(ln)["qid"] in done:
                            lines.append(ln)
                    except json.JSONDecodeError:
                        break
                p.write_text("".join(x + "\n" for x in lines))
    todo = [(c, q) for c, q in picks if q.qid not in done]
    t0 = time.perf_counter()
    lock = threading.Lock()
    files = {n: open(run_dir / "traces" / f"{n}.jsonl", "a", encoding="utf-8") for n in ("retrieval", "answers")}
    logf = open(log, "a", encoding="utf-8")

    def record(out: tuple[dict, dict, dict]) -> None:
        row, retr, ans = out
        with lock:
            files["retrieval"].write(json.dumps(retr, default=str) + "\n")
            files["answers"].write(json.dumps(ans, default=str) + "\n")
            files["retrieval"].flush()
            files["answers"].flush()
            logf.write(json.dumps(row, default=str) + "\n")  # last: a logged question has its traces
            logf.flush()

    bar = tqdm(total=len(todo), desc=f"answer ({cfg.answer.arm})", disable=not progress, leave=False)
    try:
        if cfg.run.concurrency <= 1:
            for c, q in todo:
                record(_answer_one(cfg, answerer, judge, svc, c, q))
                bar.update()
        else:
            with cf.ThreadPoolExecutor(max_workers=cfg.run.concurrency) as pool:
                futs = [pool.submit(_answer_one, cfg, answerer, judge, svc, c, q) for c, q in todo]
                for f in cf.as_completed(futs):
                    record(f.result())
                    bar.update()
    finally:
        bar.close()
        logf.close()
        for f in files.values():
            f.close()
    timings["answering_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    info = {"run_id": run_dir.name, "status": "complete", "questions": len(picks), "resumed_skipped": len(done),
            "answered_now": len(todo), "qid_order": [q.qid for _, q in picks], "extraction": ext_info,
            "models": clients.totals(), "dataset": data.report.path}
    run = _finalize(run_dir, cfg, info)
    timings["scoring_s"] = time.perf_counter() - t0
    timings["total_s"] = time.perf_counter() - t_start
    info["timings"] = timings
    write_json(run_dir / "run.json", {k: v for k, v in info.items() if k != "qid_order"})
    if svc is not None:
        svc.close()
    return run


def run_ablation(config: ExperimentConfig | str | Path, results: str | Path | None = None,
                 progress: bool = True) -> list[Run]:
    cfg = config if isinstance(config, ExperimentConfig) else ExperimentConfig.from_yaml(config)
    return [run_experiment(c, results=results, progress=progress) for c in cfg.expand()]


def load_run(run_dir: str | Path) -> Run:
    """Reopen a finished run folder as a `Run` (tables from disk)."""
    d = Path(run_dir)
    if not (d / "config.yaml").is_file():
        raise FileNotFoundError(f"{d}: not a run folder (no config.yaml)")
    if not (d / "predictions.csv").is_file():
        raise FileNotFoundError(f"{d}: the run did not finish (no predictions.csv); "
                                f"finish it with: memlab run --resume {d}")
    cfg = ExperimentConfig.from_dict(yaml.safe_load((d / "config.yaml").read_text()), where=str(d))
    pred = pd.read_csv(d / "predictions.csv")
    summ = pd.read_csv(d / "summary.csv", index_col=0)
    summ.index = [int(i) if str(i).isdigit() else i for i in summ.index]
    info = json.loads((d / "run.json").read_text()) if (d / "run.json").is_file() else {}
    return Run(run_dir=d, config=cfg, predictions=pred, summary=summ, info=info)
