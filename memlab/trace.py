"""Traces of a run as DataFrames, and one question's three layers in readable form.

Layers, joined by question id and memory id:
1. extractor — every op that touched a memory sourced from the question's evidence dialog ids
   (proposed, reconcile tier/score/Jaccard, applied or failed, and the memory's final text);
2. retrieval — each query issued, its hits with dense / keyword / fused ranks and scores, dedupe
   drops, kind-fallback additions, whether a hit's source_ids intersect the evidence, and where
   every evidence memory sits in the query's full ranking (to depth 100, or absent);
3. answer — prompt (truncated, with its hash), response, tool calls, tokens, latency, score.

`Traces.show` prints only what carries information: reconcile tiers that were not decided
(disabled, not an add) and zero token usage of an offline reader are left out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from memlab.memory.search_types import HIT_COLUMNS, HitRecord
from memlab.run.records import ExtractionTraceRecord, MemoryRecord, PredictionRecord, read_frame, read_jsonl
from memlab.run.results import read_run_json


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line:
                out.append(json.loads(line))
    return out


def as_list(v: Any) -> list[Any]:
    return list(v) if isinstance(v, (list, tuple)) else []


def table_records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """``df.to_dict("records")``, built column by column: the same values (a nullable column's missing value is
    None, as there), several times faster on a run's tables (to_dict boxes every value on its own)."""
    if not len(df):
        return []
    cols = []
    for c in df.columns:
        vals = df[c].tolist()
        if not isinstance(df[c].dtype, np.dtype):  # Int64, boolean, Float64: tolist gives pd.NA, to_dict None
            vals = [None if v is pd.NA else v for v in vals]
        cols.append(vals)
    names = list(df.columns)
    return [dict(zip(names, row)) for row in zip(*cols)]


@dataclass
class Traces:
    run_dir: Path
    questions: pd.DataFrame
    """One row per question: prediction, scores, tokens, evidence, context ids."""
    retrieval: pd.DataFrame
    """One row per (question, query, hit)."""
    queries: pd.DataFrame
    """One row per (question, query): the query text, dedupe drops and kind-fallback additions."""
    answers: pd.DataFrame
    extraction: pd.DataFrame
    """One row per applied (or skipped, or failed) extractor op."""
    memories: pd.DataFrame
    """The store at answering time: one row per memory."""
    contexts: dict[str, list[str]]
    """Per question, the ids of the memories the reader was given (all queries' hits plus preload)."""
    evidence_memories: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Per question, the evidence-sourced memories at answering time (id, source_ids, in_context)."""
    rank_depth: dict[str, int] = field(default_factory=dict)
    """Per question, how deep the trace-only full ranking went."""
    system: str | None = None
    """The memory system of a run on one other than memlab's pipeline (it has no extractor ops: its extractor
    layer is what it stored from the evidence turns, `memories.jsonl`, with how the turn ids are known)."""
    _ranks_of: tuple[pd.DataFrame, dict[str, list[Any]]] | None = field(default=None, repr=False, compare=False)
    """``queries`` and its evidence ranks grouped by question (`best_ranks`)."""
    _records: dict[str, tuple[pd.DataFrame, list[dict[str, Any]]]] = field(default_factory=dict, repr=False,
                                                                          compare=False)

    def records(self, table: str) -> list[dict[str, Any]]:
        """`table_records` of one table (``"memories"``, ``"extraction"`` ...), made once per table (rebuilt if
        the attribute is replaced): the failure attribution and the HTML report's browser both read them.
        Shared between readers: never modify them."""
        df = getattr(self, table)
        got = self._records.get(table)
        if got is None or got[0] is not df:
            got = self._records[table] = (df, table_records(df))
        return got[1]

    def best_ranks(self, qid: str) -> dict[str, int | None]:
        """Best rank of each evidence dialog id over the question's queries (None: not within the depth).

        Empty when the run recorded no full ranking (an older run, or an arm that reads no memory).
        """
        if not len(self.queries) or "evidence_ranks" not in self.queries:
            return {}
        if self._ranks_of is None or self._ranks_of[0] is not self.queries:  # grouped once, not filtered per question
            groups: dict[str, list[Any]] = {}
            for q, er in zip(self.queries.qid.tolist(), self.queries["evidence_ranks"].tolist()):
                groups.setdefault(q, []).append(er)
            self._ranks_of = (self.queries, groups)
        best: dict[str, int | None] = {}
        for er in self._ranks_of[1].get(qid, ()):
            if not isinstance(er, dict):
                continue
            for s, r in er.items():
                if r is not None and (best.get(s) is None or r < best[s]):
                    best[s] = int(r)
                else:
                    best.setdefault(s, None)
        return best

    # ------------------------------------------------------------------------ one question
    def question(self, qid: str) -> dict[str, Any]:
        """The three layers of one question as DataFrames / dicts."""
        if qid not in set(self.questions.qid):
            raise KeyError(f"{qid!r} is not a question of {self.run_dir}")
        q = self.questions.set_index("qid").loc[qid]
        evidence = set(as_list(q["evidence"]))
        conv = q["conversation_id"]
        ops = self.extraction
        if len(ops):
            ops = ops[(ops.conversation == conv) & ops.source_ids.apply(lambda s: bool(set(s) & evidence))]
            mem_text = self.memories.set_index("id")["text"].to_dict() if len(self.memories) else {}
            ops = ops.assign(final_text=ops.memory_id.map(mem_text))
        mems = self.memories
        if len(mems):
            mems = mems[(mems.conversation == conv) & mems.source_ids.apply(lambda s: bool(set(s) & evidence))]
        if self.system is not None and not len(ops):  # a system's stores, as ops (a memory stored, no op log)
            ops = pd.DataFrame([{"conversation": conv, "job_status": "ran", "action": "store", "text": m["text"],
                                 "kind": m.get("kind"), "source_ids": list(m["source_ids"]), "memory_id": m["id"],
                                 "result": f"{self.system}:{m.get('provenance') or 'exact'}", "error": None,
                                 "reconcile": None, "final_text": m["text"]} for m in mems.to_dict("records")],
                               columns=[*ops.columns, "final_text"])
        hits = self.retrieval[self.retrieval.qid == qid] if len(self.retrieval) else self.retrieval
        ans = self.answers[self.answers.qid == qid].iloc[0].to_dict() if len(self.answers) else {}
        return {"question": q.to_dict() | {"qid": qid}, "extractor": ops, "evidence_memories": mems,
                "retrieval": hits, "queries": self.queries[self.queries.qid == qid] if len(self.queries) else None,
                "answer": ans}

    def show(self, qid: str, max_hits: int = 10) -> str:
        """A readable, layer-by-layer account of one question (print it in a notebook)."""
        v = self.question(qid)
        q = v["question"]
        ceiling = q.get("answer_ceiling")  # what a perfect reader of this context could score (eval.ceiling)
        head = f"== {qid}  category {q['category']}  F1 {q.get('f1', float('nan')):.3f}"
        if isinstance(ceiling, (int, float)) and ceiling == ceiling:
            head += f"  answer ceiling {ceiling:.2f}  answer-bearing {'yes' if q.get('answer_bearing') else 'no'}"
        lines = [head,
                 f"Q: {q['question']}", f"gold: {q['answer']}   prediction: {q['prediction']}",
                 f"evidence: {', '.join(as_list(q['evidence'])) or '(none)'}", "",
                 "-- 1. extractor layer (ops touching memories sourced from the evidence)"]
        ops = v["extractor"]
        if ops is None or not len(ops):
            lines.append("   no op touched the evidence turns: nothing was written from them")
        else:
            lines += [op_line(o) for _, o in ops.iterrows()]
        lines += ["", "-- 2. retrieval layer"]
        hits = v["retrieval"]
        if hits is None or not len(hits):
            lines.append("   no retrieval (this arm reads no memory)")
        else:
            mem_text = self.memories.set_index("id")["text"].to_dict() if len(self.memories) else {}
            ranks = {} if v["queries"] is None or not len(v["queries"]) else \
                v["queries"].set_index("query_index").to_dict("index")
            evidence = as_list(q["evidence"])
            for qi, g in hits.groupby("query_index"):
                lines.append(f"   query {qi}: {g.iloc[0]['query']!r}")
                er = ranks.get(qi, {}).get("evidence_ranks")
                if isinstance(er, dict):
                    lines.append(f"   evidence in the full ranking (depth {self.rank_depth.get(qid, '?')}): "
                                 + format_ranks(evidence, er))
                for _, h in g.head(max_hits).iterrows():
                    mark = "*" if h.evidence_hit else " "
                    lines.append(f"  {mark} #{h['rank']:<2d} dense {h.dense_rank} kw {h.keyword_rank} fused "
                                 f"{h.fused_rank} via {h.via:13s} [{','.join(h.source_ids)}] "
                                 f"{str(mem_text.get(h['id'], ''))[:90]}")
            lines.append("   (* = sourced from an evidence turn)")
        a = v["answer"]
        head = f"   rule: {a.get('rule')}"
        if a.get("calls") or a.get("cached_calls"):
            head += f"   calls {a.get('calls')}"
        usage = a.get("usage") or {}
        if any(isinstance(x, (int, float)) and x for x in usage.values()):
            head += "   usage " + ", ".join(f"{k} {x}" for k, x in usage.items() if x)
        head += f"   latency {a.get('latency_s', 0):.4f} s"
        if a.get("prompt_hash"):
            head += f"   prompt hash {a.get('prompt_hash')}"
        lines += ["", "-- 3. answer layer", head]
        if a.get("tool_calls"):
            lines.append(f"   tool calls: {a['tool_calls']}")
        if a.get("response"):
            lines.append(f"   response: {a['response'][:200]}")
        lines += format_reading(a.get("reading"))
        return "\n".join(lines)


def format_reading(reading: Any) -> list[str]:
    """What an offline reader read (`memlab.answer.extractive.reading_trace`): the people the question
    names, the abstain test, and its best candidates with rank, owner and score."""
    if not isinstance(reading, dict) or not reading:
        return []
    people = reading.get("people") or []
    lines = [f"   reader read {reading.get('candidates_read', 0)} candidates of the context above"
             + (f"; the question names {'/'.join(people)}" if people else "")]
    t = reading.get("abstain_test")
    if isinstance(t, dict):
        own = t.get("best_owned")
        lines.append(f"   abstain test: best candidate {t.get('best', float('nan')):.2f}, best owned by "
                     f"{'/'.join(people)} " + ("none" if own is None else f"{own:.2f}")
                     + f" (abstain when behind by more than {t.get('margin', float('nan')):.2f})")
    rule = reading.get("abstain_rule")
    if isinstance(rule, dict):
        lines.append(f"   learned abstain rule: p(not mentioned) {rule.get('p', float('nan')):.2f} (abstain above "
                     f"{rule.get('threshold', float('nan')):.2f})")
    if reading.get("composed"):
        lines.append(f"   composed the spans of ranks {', '.join(map(str, reading['composed']))}")
    for c in reading.get("top_candidates") or []:
        lines.append(f"     #{c.get('rank', '?'):<2} {'/'.join(c.get('owners') or []) or '-':10s} score "
                     f"{c.get('score', float('nan')):6.2f}  {str(c.get('text', ''))[:70]!r} -> {c.get('answer', '')!r}")
    return lines


def load(run_dir: str | Path) -> Traces:
    """Load a run folder's traces as DataFrames."""
    d = Path(run_dir)
    if (d / "predictions.parquet").is_file():
        qs = read_frame(d / "predictions").reset_index()
    elif (d / "predictions.jsonl").is_file():  # a run still going, or killed: its resume log
        qs = pd.DataFrame([r.to_dict() for r in read_jsonl(d / "predictions.jsonl", PredictionRecord)])
    else:
        raise FileNotFoundError(f"{d}: not a run folder (no predictions)")
    rows, qrows = [], []
    contexts: dict[str, list[str]] = {}
    ev_mems: dict[str, list[dict[str, Any]]] = {}
    depth: dict[str, int] = {}
    where = str(d / "traces" / "retrieval.jsonl")  # named in a bad hit's error (joined once, not per hit)
    for r in _read_jsonl(d / "traces" / "retrieval.jsonl"):
        contexts[r["qid"]] = list(r.get("context_ids") or [])
        if "evidence_memories" in r:
            ev_mems[r["qid"]] = r["evidence_memories"]
            depth[r["qid"]] = int(r.get("rank_depth") or 0)
        for qi, qt in enumerate(r.get("queries", [])):
            qrows.append({"qid": r["qid"], "query_index": qi, "query": qt["query"], "n_hits": len(qt["hits"]),
                          "dropped_by_dedupe": qt.get("dropped_by_dedupe", []),
                          "fallback_added": qt.get("fallback_added", []), "error": qt.get("error"),
                          "evidence_ranks": qt.get("evidence_ranks"), "memory_ranks": qt.get("memory_ranks")})
            for i, h in enumerate(qt["hits"]):
                hit = HitRecord.from_dict(h, where=f"{where}: {r['qid']} query {qi} hit {i}")
                rows.append({"qid": r["qid"], "query_index": qi, "query": qt["query"], **vars(hit)})  # flat fields
    retrieval = pd.DataFrame(rows, columns=["qid", "query_index", "query", *HIT_COLUMNS])  # every field, always
    for col in ("rank", "dense_rank", "keyword_rank", "fused_rank"):
        retrieval[col] = retrieval[col].astype("Int64")
    extraction, mems = load_extraction(d), load_memories(d)
    info = read_run_json(d / "run.json") if (d / "run.json").is_file() else {}
    return Traces(run_dir=d, questions=qs, retrieval=retrieval, queries=pd.DataFrame(qrows),
                  answers=pd.DataFrame(_read_jsonl(d / "traces" / "answers.jsonl")), extraction=extraction,
                  memories=mems, contexts=contexts, evidence_memories=ev_mems, rank_depth=depth,
                  system=(info.get("system") or {}).get("name"))


def load_extraction(run_dir: str | Path) -> pd.DataFrame:
    """A run folder's extraction trace (`Traces.extraction`): one row per proposed op or job without ops."""
    ext = []
    ext_path = Path(run_dir) / "traces" / "extraction.jsonl"
    for x in read_jsonl(ext_path, ExtractionTraceRecord) if ext_path.is_file() else []:
        op = x.op or {}
        ext.append({"conversation": x.conversation, "job_status": x.job_status,
                    "action": op.get("action"), "text": op.get("text"), "kind": op.get("kind"),
                    "source_ids": op.get("source_ids") or [], "memory_id": x.memory_id,
                    "result": x.result or ("dropped" if x.dropped is not None else x.job_status),
                    "error": x.error or x.dropped or x.reason, "reconcile": x.reconcile})
    return pd.DataFrame(ext, columns=None if ext else ["conversation", "job_status", "action", "text", "kind",
                                                        "source_ids", "memory_id", "result", "error", "reconcile"])


def load_memories(run_dir: str | Path) -> pd.DataFrame:
    """A run folder's memories trace (`Traces.memories`): what the store held when answering began."""
    mem_path = Path(run_dir) / "traces" / "memories.jsonl"
    mems = pd.DataFrame([{k: v for k, v in m.to_dict().items() if k != "schema"}  # checked on read, not a column
                         for m in read_jsonl(mem_path, MemoryRecord)] if mem_path.is_file() else [])
    if not len(mems):
        mems = pd.DataFrame(columns=["conversation", "id", "text", "kind", "event_time", "source_ids"])
    return mems


def trace_size_mb(run_dir: str | Path) -> float:
    d = Path(run_dir) / "traces"
    return sum(p.stat().st_size for p in d.glob("*.jsonl")) / 2**20


def format_ranks(evidence: list[str], ranks: dict[str, int | None]) -> str:
    """``D5:4 at rank 3, D9:1 at rank 41, D1:18 absent, D2:7 not written`` for one query."""
    out = []
    for e in evidence:
        if e not in ranks:
            out.append(f"{e} not written")
        elif ranks[e] is None:
            out.append(f"{e} absent")
        else:
            out.append(f"{e} at rank {ranks[e]}")
    return ", ".join(out) if out else "(no evidence)"


def op_line(op: Any) -> str:
    """One extractor op as `Traces.show` prints it: action, result, the reconcile decision, the dialog ids it
    came from and the memory's text (for a skipped proposal, its own text and the memory kept instead)."""
    return (f"   {op.get('action', '?'):6s} -> {op.get('result', '?'):11s}{_reconcile_note(op)}"
            f"  [{','.join(op.get('source_ids', ()))}]  {_op_text(op)}")


def _reconcile_note(op: Any) -> str:
    """The reconcile decision of one op, or nothing when reconcile decided nothing (disabled, not an add)."""
    rec = op.get("reconcile") or {}
    tier = rec.get("tier")
    if not tier or tier in ("disabled", "not-an-add", "verbatim"):
        return ""
    parts = [f" reconcile {tier}"]
    if rec.get("score") is not None:
        parts.append(f"score {float(rec['score']):.2f}")
    if rec.get("jaccard") is not None:
        parts.append(f"Jaccard {float(rec['jaccard']):.2f}")
    if rec.get("candidate_id") and tier in ("skip", "update"):
        parts.append(f"vs {rec['candidate_id']}")
    return " ".join(parts)


def _op_text(op: Any) -> str:
    """The memory's final text; for a skipped proposal its own text and the memory it was taken for."""
    if op.get("result") == "skipped":
        dup = op.get("final_text")
        return f"{str(op.get('text'))[:80]!r}" + (f" (kept instead: {str(dup)[:60]!r})" if isinstance(dup, str) else "")
    return str(op.get("final_text") or op.get("text"))[:110]


def run_judged(tr: Traces) -> bool:
    """Whether the run had a judge (its config names a judge model; an older folder: a J column with values)."""
    p = tr.run_dir / "config.yaml"
    if p.is_file():
        import yaml

        return bool(((yaml.safe_load(p.read_text()) or {}).get("judge") or {}).get("model"))
    return "j" in tr.questions and tr.questions["j"].notna().any()


class SourceIndex:
    """Per conversation, which of its items (memories, proposed ops) cite each dialog id, so a question's evidence
    items are found by its evidence ids rather than by a scan of the conversation's items (quadratic over a run)."""

    def __init__(self, by_conv: Mapping[str, list[dict[str, Any]]]):
        self.by_conv = by_conv
        self.rows: dict[str, dict[str, list[int]]] = {}
        for conv, items in by_conv.items():
            index = self.rows[conv] = {}
            for i, item in enumerate(items):
                for sid in dict.fromkeys(item.get("source_ids") or []):
                    index.setdefault(sid, []).append(i)

    def citing(self, conv: str, evidence: set[str]) -> list[dict[str, Any]]:
        """The conversation's items citing any of ``evidence``, in their order."""
        index, items = self.rows.get(conv, {}), self.by_conv.get(conv, [])
        return [items[i] for i in sorted({i for s in evidence for i in index.get(s, ())})]
