"""The HTML report's question-browser data (`memlab.report_html`): each question's three trace layers as the page
shows them (`layers`), found for a whole run through indexes built once (`QuestionTraces`), and packed for size
(`Tables`, `pack_runs`).

Speed matters here: a full LoCoMo-10 run has 1,986 questions, and slicing DataFrames per question made two runs'
page take minutes. `QuestionTraces` hands `layers` plain records grouped by question instead; its test
(tests/test_report_html.py) holds it to `memlab.trace.Traces.question`, the definition of the layers, for every
question of a memlab run and of a memory-system run.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from memlab import trace
from memlab.run.labels import category_name
from memlab.run.report import correct

MAX_TEXT = 300


_PLAIN = frozenset((str, int, bool, type(None)))


def _clean(v: Any) -> Any:
    """JSON-safe values (NaN -> None, numpy scalars -> Python). Called on every value of a page (millions), so
    the common types are answered first, and a container's plain items are kept without a call each."""
    t = type(v)
    if t in _PLAIN:
        return v
    if t is float:
        return None if math.isnan(v) or math.isinf(v) else v
    if t is dict:
        return {k if type(k) is str else str(k): x if type(x) in _PLAIN else _clean(x) for k, x in v.items()}
    if t is list or t is tuple:
        return [x if type(x) in _PLAIN else _clean(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return None
    if v is pd.NA or v is pd.NaT:
        return None
    return v


def _short(text: Any, n: int = MAX_TEXT) -> str:
    s = "" if text is None or (isinstance(text, float) and math.isnan(text)) else str(text)
    return s if len(s) <= n else s[: n - 1] + "…"


def _records(x: Any) -> list[dict[str, Any]]:
    """A layer's rows as records, whether a `Traces.question` DataFrame, records already, or nothing."""
    if x is None:
        return []
    return x.to_dict("records") if isinstance(x, pd.DataFrame) else list(x)


def _by_qid(df: pd.DataFrame, fields: Sequence[str] | None = None) -> dict[str, list[dict[str, Any]]]:
    """A table's rows grouped by question, in table order (only ``fields`` and ``qid`` when given)."""
    out: dict[str, list[dict[str, Any]]] = {}
    if fields is not None:
        df = df[["qid", *(f for f in fields if f in df.columns and f != "qid")]]
    for r in trace.table_records(df):
        out.setdefault(r["qid"], []).append(r)
    return out


#: The hit fields `layers` reads (a run's retrieval table is by far its largest: only these are turned to records).
HIT_READ = ("query_index", "rank", "dense_rank", "keyword_rank", "fused_rank", "via", "evidence_hit", "source_ids",
            "id")


class QuestionTraces:
    """`Traces.question`'s layers for every question of a run, fast: each table is turned into records once and
    grouped by question (hits, queries, answers) or by (conversation, evidence id) (extractor ops, memories), so
    a question's layers are dictionary look-ups, not DataFrame slices. `question` returns the same rows as
    `Traces.question` (records instead of DataFrames, which `layers` reads alike; of the hits, the fields `layers`
    reads, `HIT_READ`)."""

    def __init__(self, tr: trace.Traces):
        self.tr = tr
        self.q = {r["qid"]: r for r in tr.records("questions")}
        self.hits, self.queries, self.answers = (_by_qid(tr.retrieval, HIT_READ), _by_qid(tr.queries),
                                                 _by_qid(tr.answers))
        mm = tr.records("memories")
        self.mem_text = {m["id"]: m["text"] for m in mm}
        self.mems = mm
        self.ops = tr.records("extraction")
        self.ops_of: dict[tuple[str, str], list[int]] = {}
        for pos, o in enumerate(self.ops):
            for sid in o["source_ids"] or []:
                self.ops_of.setdefault((o["conversation"], sid), []).append(pos)
        self.mems_of: dict[tuple[str, str], list[int]] = {}
        for pos, m in enumerate(mm):
            for sid in m["source_ids"] or []:
                self.mems_of.setdefault((m["conversation"], sid), []).append(pos)

    def question(self, qid: str) -> dict[str, Any]:
        q = self.q[qid]
        conv, evidence = q["conversation_id"], trace.as_list(q["evidence"])
        ops = [{**self.ops[p], "final_text": self.mem_text.get(self.ops[p]["memory_id"])}
               for p in sorted({p for e in evidence for p in self.ops_of.get((conv, e), ())})]
        mems = [self.mems[p] for p in sorted({p for e in evidence for p in self.mems_of.get((conv, e), ())})]
        if self.tr.system is not None and not ops:  # a system's stores, as ops (as `Traces.question` makes them)
            ops = [{"conversation": conv, "job_status": "ran", "action": "store", "text": m["text"],
                    "kind": m.get("kind"), "source_ids": list(m["source_ids"]), "memory_id": m["id"],
                    "result": f"{self.tr.system}:{m.get('provenance') or 'exact'}", "error": None,
                    "reconcile": None, "final_text": m["text"]} for m in mems]
        answers = self.answers.get(qid, [])
        return {"question": q, "extractor": ops, "evidence_memories": mems, "retrieval": self.hits.get(qid, []),
                "queries": self.queries.get(qid, []), "answer": answers[0] if answers else {}}


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _round(v: Any, digits: int) -> float | None:
    """A number as the page shows it (rounded: full float precision would be most of the payload)."""
    return None if _missing(v) or v is pd.NA else round(float(v), digits)


def _int(v: Any) -> int | None:
    """A rank as an integer (a column with a missing rank is float: 2.0 would print as "2.0")."""
    if type(v) is int:  # most ranks (four per hit): answered without the checks
        return v
    return None if _missing(v) or v is pd.NA else int(v)


def _ids(src: Any) -> str:
    return ",".join(map(str, src if src is not None and not isinstance(src, float) else []))


def layers(v: dict[str, Any], mem_text: dict[str, str]) -> dict[str, Any]:
    """One question's three layers (a `Traces.question` result) as the page shows them: exactly what
    report.js's ``layersOf`` rebuilds from the packed tables (`pack_runs`). Memory records the page never
    displays (the evidence memories) are left out."""
    ops = []
    for o in _records(v["extractor"]):
        rec = o.get("reconcile") or {}
        ops.append({"action": o.get("action"), "result": o.get("result"), "tier": rec.get("tier"),
                    "score": _round(rec.get("score"), 4), "jaccard": _round(rec.get("jaccard"), 4),
                    "src": _ids(o.get("source_ids")),
                    "text": _short(o.get("text") if _missing(o.get("final_text")) else o.get("final_text")),
                    "error": _short(o.get("error"), 160)})
    hits_of: dict[Any, list[dict[str, Any]]] = {}
    for h in _records(v["retrieval"]):
        hits_of.setdefault(h["query_index"], []).append(h)
    queries = []
    for qm in _records(v["queries"]):
        queries.append({"query": qm["query"], "error": qm.get("error"),
                        "dropped": len(qm.get("dropped_by_dedupe") or []),
                        "fallback": len(qm.get("fallback_added") or []),
                        "hits": [{"rank": _int(h["rank"]), "dense": _int(h["dense_rank"]),
                                  "kw": _int(h["keyword_rank"]), "fused": _int(h["fused_rank"]),
                                  "via": h.get("via"), "ev": bool(h.get("evidence_hit")),
                                  "src": _ids(h.get("source_ids")), "text": _short(mem_text.get(h["id"], ""))}
                                 for h in hits_of.get(qm["query_index"], [])]})
    a = v["answer"] or {}
    usage = a.get("usage") or {}
    answer = {"rule": a.get("rule"), "calls": a.get("calls"), "prompt_tokens": usage.get("prompt_tokens"),
              "completion_tokens": usage.get("completion_tokens"), "latency": _round(a.get("latency_s"), 5),
              "prompt": _short(a.get("prompt"), 4000), "response": _short(a.get("response"), 1000),
              "tools": _short(json.dumps(a.get("tool_calls") or [], default=str), 1000)
              if a.get("tool_calls") else ""}
    return _clean({"ops": ops, "queries": queries, "answer": answer})


class Tables:
    """The page's data packed for size: every table column by column (one JSON array per field) and every text
    in one string table shared by all runs, so a memory text that 40 hits and two runs show is stored once.

    A table is ``{"s": [string fields], field: [values]}``; a string field holds indexes into ``strings``. A
    one-to-many relation (a question's queries, a query's hits) is a count column on the parent with the child
    rows in parent order; report.js rebuilds a question's layers from them when it is opened."""

    def __init__(self) -> None:
        self.strings: list[str] = []
        self.index: dict[str, int] = {}
        self.uses: list[int] = []
        self.tables: list[dict[str, Any]] = []

    def text(self, s: Any) -> int | None:
        if type(s) is not str:
            if s is None or (isinstance(s, float) and math.isnan(s)):
                return None
            s = str(s)
        i = self.index.get(s)
        if i is None:
            i = self.index[s] = len(self.strings)
            self.strings.append(s)
            self.uses.append(0)
        self.uses[i] += 1
        return i

    def table(self, rows: Sequence[dict[str, Any]], fields: Sequence[str], strings: Sequence[str] = ()) -> dict:
        out: dict[str, Any] = {"s": list(strings)}
        for f in fields:
            col = [r.get(f) for r in rows]
            out[f] = [self.text(v) for v in col] if f in strings else col
        self.tables.append(out)
        return out

    def finish(self) -> list[str]:
        """The string table, most used first (so "primary", repeated on every hit, costs one digit), with every
        table made so far renumbered to it."""
        order = sorted(range(len(self.strings)), key=lambda i: -self.uses[i])
        new = {old: i for i, old in enumerate(order)}
        for t in self.tables:
            for f in t["s"]:
                t[f] = [None if v is None else new[v] for v in t[f]]
        return [self.strings[i] for i in order]


OP_FIELDS = ("action", "result", "tier", "score", "jaccard", "src", "text", "error")
OP_STRINGS = ("action", "result", "tier", "src", "text", "error")
HIT_FIELDS = ("rank", "dense", "kw", "fused", "via", "ev", "mem")
ANSWER_FIELDS = ("rule", "calls", "prompt_tokens", "completion_tokens", "latency", "prompt", "response", "tools")
ANSWER_STRINGS = ("rule", "prompt", "response", "tools")


#: The prediction fields the browser shows of a question (its table and each run's outcome).
QUESTION_FIELDS = ("category", "conversation_id", "question", "answer", "evidence", "f1", "prediction", "error")


@dataclass
class RunBrowser:
    """One run's part of the question browser, from its traces alone: each question's fields (`QUESTION_FIELDS`)
    and its three layers (`layers`), in the run's question order. Plain data: a forked process makes it for one
    run while another makes the next (`memlab.report_html`), and sends it back pickled."""

    questions: dict[str, dict[str, Any]]
    layers: dict[str, dict[str, Any]]

    @classmethod
    def of(cls, tr: trace.Traces) -> RunBrowser:
        qt = QuestionTraces(tr)
        return cls({qid: {f: r.get(f) for f in QUESTION_FIELDS} for qid, r in qt.q.items()},
                   {qid: layers(qt.question(qid), qt.mem_text) for qid in qt.q})


def pack_runs(browsers: Sequence[RunBrowser], attributions: Sequence[pd.DataFrame], flipped: set[str]
              ) -> dict[str, Any]:
    """The question browser's data: the questions (in the first run's order, then any only later runs answered)
    and, per run, each question's outcome and three layers, as `Tables` (one string table for all runs)."""
    order = list(dict.fromkeys(q for b in browsers for q in b.questions))
    t = Tables()
    questions = []
    for qid in order:
        ref = next(b.questions[qid] for b in browsers if qid in b.questions)
        questions.append({"qid": qid, "cat": int(ref["category"]), "catName": category_name(int(ref["category"])),
                          "conv": ref["conversation_id"], "q": str(ref["question"]), "gold": _short(ref["answer"], 500),
                          "ev": ", ".join(map(str, trace.as_list(ref["evidence"]))), "flip": int(qid in flipped)})
    mems: list[dict[str, Any]] = []
    mem_ids: dict[tuple[Any, Any], int] = {}
    out_runs = []
    for b, att in zip(browsers, attributions):
        qs, run_layers = b.questions, b.layers
        labs = {r["qid"]: r for r in att.to_dict("records")} if len(att) else {}
        outcome, answers, ops, op_ids, op_refs, queries, hits = [], [], [], {}, [], [], []
        sequential = True  # every query's ranks are 1..n: the page numbers them itself
        for qid in order:
            if qid not in qs:
                outcome.append({"has": 0, "nops": 0, "nq": 0})
                answers.append({})
                continue
            row = qs[qid]
            lab = labs.get(qid)
            L = run_layers[qid]
            for o in L["ops"]:
                key = tuple(o[f] for f in OP_FIELDS)
                if key not in op_ids:
                    op_ids[key] = len(ops)
                    ops.append(o)
                op_refs.append(op_ids[key])
            for q in L["queries"]:
                for h in q["hits"]:
                    key = (h["text"], h["src"])
                    if key not in mem_ids:
                        mem_ids[key] = len(mems)
                        mems.append({"text": h["text"], "src": h["src"]})
                    hits.append({**h, "ev": int(h["ev"]), "mem": mem_ids[key]})
                queries.append({**q, "nh": len(q["hits"])})
                sequential = sequential and [h["rank"] for h in q["hits"]] == list(range(1, len(q["hits"]) + 1))
            answers.append(L["answer"])
            f1 = float(row["f1"])
            outcome.append({"has": 1, "pred": _short(row["prediction"], 500), "f1": _round(f1, 4),
                            "ok": int(correct(f1)), "label": None if lab is None else lab["label"],
                            "reason": None if lab is None else lab["reason"],
                            "error": None if pd.isna(row.get("error")) else str(row.get("error")),
                            "nops": len(L["ops"]), "nq": len(L["queries"])})
        out_runs.append({
            "q": t.table(outcome, ("has", "pred", "f1", "ok", "label", "reason", "error", "nops", "nq"),
                         ("pred", "label", "reason", "error")),
            "answer": t.table(answers, ANSWER_FIELDS, ANSWER_STRINGS),
            "ops": t.table(ops, OP_FIELDS, OP_STRINGS), "opref": op_refs,
            "queries": t.table(queries, ("query", "error", "dropped", "fallback", "nh"), ("query", "error")),
            "hits": t.table(hits, HIT_FIELDS[1:] if sequential else HIT_FIELDS, ("via",))})
    # every value is JSON-safe already (the layers are cleaned, the rest are str, int, rounded floats or None)
    return {"questions": t.table(questions, ("qid", "cat", "catName", "conv", "q", "gold", "ev", "flip"),
                                 ("qid", "catName", "conv", "q", "gold", "ev")),
            "mems": t.table(mems, ("text", "src"), ("text", "src")), "runs_data": out_runs, "strings": t.finish()}


def embed_json(data: Any) -> str:
    """JSON that is safe inside ``<script type="application/json">``: ``<``, ``>`` and ``&`` are written as
    ``\\u003c``..., so no text (``</script>``, ``<!--`` followed by ``<script``) can end or comment out the block;
    ``JSON.parse`` reads them back unchanged."""
    text = json.dumps(_clean(data), ensure_ascii=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
