"""One self-contained HTML page over finished runs (``memlab report --html OUT.html RUN [RUN ...]``).

The page needs no server and no network: plots are embedded as base64 PNG, the data as inline JSON, and
the script and style are inline. The data holds only what the page shows, packed (`Tables`: column tables,
one shared string table; about 3.8 MB for two full LoCoMo-10 offline runs, from 23 MB as one nested record per
question), and is escaped (`embed_json`) so that no question or model reply can end the script block.

It holds the per-category table with 95 % intervals, the paired comparisons of every run against the first
(runs in the order given; each delta is run − A, the same numbers ``memlab compare`` prints, also in the page's
data as ``comparisons``), the plots (evidence recall for every run), and a question browser: filter by
category, failure label (`memlab.attribution`), correct / incorrect (F1 >= 0.5) and flipped between runs; click
a question to see, per run, its three trace layers (`memlab.trace`): the extractor ops that touched its
evidence memories, the retrieval ranks of every query, and the answer.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import io
import json
import math
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import pandas as pd

from memlab import attribution, plots, trace
from memlab.data import load_dataset
from memlab.eval.stats import Comparison
from memlab.run.report import (
    CORRECT_F1,
    TOKEN_NOTE,
    category_name,
    comparison_display,
    comparison_heading,
    correct,
    display_frame,
    distinguishing,
    load_runs,
    report_comparison,
    report_table,
    run_labels,
    run_legend,
)
from memlab.run.runner import Run

MAX_TEXT = 300
ASSETS = Path(__file__).resolve().parent / "assets"


# ---------------------------------------------------------------------------------- pieces
def _png(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _asset(name: str) -> str:
    """The page's inline style and script (kept as files so they read as CSS and JavaScript)."""
    return (ASSETS / name).read_text(encoding="utf-8").replace("</script", "<\\/script")


def _clean(v: Any) -> Any:
    """JSON-safe values (NaN -> None, numpy scalars -> Python)."""
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


def _table_html(df: pd.DataFrame, cls: str = "") -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    rows = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in r) + "</tr>"
                   for r in df.itertuples(index=False))
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>'


def comparison_data(cmp: Comparison) -> list[dict[str, Any]]:
    """The paired comparisons as page data: per run, its direction (``run − A``) and the signed rows."""
    cols = ["group", "metric", "n", "a", "b", "delta", "lo", "hi", "p_perm", "p_perm_holm", "p_mcnemar",
            "p_mcnemar_holm", "wins", "losses", "ties", "mdd"]
    return [{"run": name, "baseline": cmp.baseline, "direction": cmp.direction(name),
             "rows": cmp.table.loc[cmp.table["run"] == name, cols].to_dict("records")} for name in cmp.runs]


# ---------------------------------------------------------------------------------- traces
class QuestionTraces:
    """`Traces.question` for every question of a run, fast: each call sees a `Traces` cut down to that question's
    rows (its hits, queries, answer, and the extractor ops and memories sourced from its evidence), found through
    indexes built once, so the layers are memlab.trace's own and a full LoCoMo run takes seconds, not minutes."""

    def __init__(self, tr: trace.Traces):
        self.tr = tr
        self.q = tr.questions.set_index("qid", drop=False)
        self.by_qid = {name: {k: g for k, g in df.groupby("qid")} if len(df) else {}
                       for name, df in (("retrieval", tr.retrieval), ("queries", tr.queries), ("answers", tr.answers))}
        self.ops: dict[tuple[str, str], list[int]] = {}
        ex = tr.extraction
        if len(ex):
            for pos, (conv, src) in enumerate(zip(ex.conversation, ex.source_ids)):
                for sid in src or []:
                    self.ops.setdefault((conv, sid), []).append(pos)
        self.mems: dict[tuple[str, str], list[int]] = {}
        self.mem_pos: dict[str, int] = {}
        mm = tr.memories
        if len(mm):
            for pos, (conv, mid, src) in enumerate(zip(mm.conversation, mm.id, mm.source_ids)):
                self.mem_pos[mid] = pos
                for sid in src or []:
                    self.mems.setdefault((conv, sid), []).append(pos)

    def _rows(self, name: str, qid: str) -> pd.DataFrame:
        df = getattr(self.tr, name)
        return self.by_qid[name].get(qid, df.iloc[0:0]) if len(df) else df

    def question(self, qid: str) -> dict[str, Any]:
        row = self.q.loc[[qid]]
        conv = row.conversation_id.iloc[0]
        evidence = trace.as_list(row.evidence.iloc[0])
        ops = sorted({p for e in evidence for p in self.ops.get((conv, e), ())})
        ex = self.tr.extraction.iloc[ops] if len(self.tr.extraction) else self.tr.extraction
        mems = {p for e in evidence for p in self.mems.get((conv, e), ())}
        if len(ex):  # the memories those ops wrote, for their final text
            mems |= {self.mem_pos[m] for m in ex.memory_id if m in self.mem_pos}
        sub = dataclasses.replace(
            self.tr, questions=row.reset_index(drop=True), retrieval=self._rows("retrieval", qid),
            queries=self._rows("queries", qid), answers=self._rows("answers", qid), extraction=ex,
            memories=self.tr.memories.iloc[sorted(mems)] if len(self.tr.memories) else self.tr.memories,
            contexts={qid: self.tr.contexts.get(qid, [])})
        return sub.question(qid)


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _round(v: Any, digits: int) -> float | None:
    """A number as the page shows it (rounded: full float precision would be most of the payload)."""
    return None if _missing(v) or v is pd.NA else round(float(v), digits)


def _int(v: Any) -> int | None:
    """A rank as an integer (a column with a missing rank is float: 2.0 would print as "2.0")."""
    return None if _missing(v) or v is pd.NA else int(v)


def _ids(src: Any) -> str:
    return ",".join(map(str, src if src is not None and not isinstance(src, float) else []))


def layers(v: dict[str, Any], mem_text: dict[str, str]) -> dict[str, Any]:
    """One question's three layers (a `Traces.question` result) as the page shows them: exactly what
    report.js's ``layersOf`` rebuilds from the packed tables (`pack_runs`). Memory records the page never
    displays (the evidence memories) are left out."""
    ops = []
    ex = v["extractor"]
    if ex is not None and len(ex):
        for o in ex.to_dict("records"):
            rec = o.get("reconcile") or {}
            ops.append({"action": o.get("action"), "result": o.get("result"), "tier": rec.get("tier"),
                        "score": _round(rec.get("score"), 4), "jaccard": _round(rec.get("jaccard"), 4),
                        "src": _ids(o.get("source_ids")),
                        "text": _short(o.get("text") if _missing(o.get("final_text")) else o.get("final_text")),
                        "error": _short(o.get("error"), 160)})
    queries = []
    qmeta = v["queries"].to_dict("records") if v["queries"] is not None and len(v["queries"]) else []
    hits = v["retrieval"]
    for qm in qmeta:
        qh = hits[hits.query_index == qm["query_index"]] if len(hits) else hits
        queries.append({"query": qm["query"], "error": qm.get("error"),
                        "dropped": len(qm.get("dropped_by_dedupe") or []),
                        "fallback": len(qm.get("fallback_added") or []),
                        "hits": [{"rank": _int(h["rank"]), "dense": _int(h["dense_rank"]),
                                  "kw": _int(h["keyword_rank"]), "fused": _int(h["fused_rank"]),
                                  "via": h.get("via"), "ev": bool(h.get("evidence_hit")),
                                  "src": _ids(h.get("source_ids")), "text": _short(mem_text.get(h["id"], ""))}
                                 for h in qh.to_dict("records")]})
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
        if s is None or (isinstance(s, float) and math.isnan(s)):
            return None
        s = str(s)
        if s not in self.index:
            self.index[s] = len(self.strings)
            self.strings.append(s)
            self.uses.append(0)
        self.uses[self.index[s]] += 1
        return self.index[s]

    def table(self, rows: Sequence[dict[str, Any]], fields: Sequence[str], strings: Sequence[str] = ()) -> dict:
        out: dict[str, Any] = {"s": list(strings)}
        for f in fields:
            out[f] = [self.text(r.get(f)) if f in strings else r.get(f) for r in rows]
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


def pack_runs(runs: Sequence[Run], attributions: Sequence[pd.DataFrame], flipped: set[str]) -> dict[str, Any]:
    """The question browser's data: the questions (in the first run's order, then any only later runs answered)
    and, per run, each question's outcome and three layers (`layers`), as `Tables`."""
    per_run = []
    for run in runs:
        tr = trace.load(run.run_dir)
        mem_text = dict(zip(tr.memories.id, tr.memories.text)) if len(tr.memories) else {}
        per_run.append((QuestionTraces(tr), tr.questions.set_index("qid"), mem_text))
    order: list[str] = []
    seen: set[str] = set()
    for _, qs, _ in per_run:
        for q in qs.index:
            if q not in seen:
                seen.add(q)
                order.append(q)
    t = Tables()
    questions = []
    for qid in order:
        ref = next(qs.loc[qid] for _, qs, _ in per_run if qid in qs.index)
        questions.append({"qid": qid, "cat": int(ref["category"]), "catName": category_name(int(ref["category"])),
                          "conv": ref["conversation_id"], "q": str(ref["question"]), "gold": _short(ref["answer"], 500),
                          "ev": ", ".join(map(str, trace.as_list(ref["evidence"]))), "flip": int(qid in flipped)})
    mems: list[dict[str, Any]] = []
    mem_ids: dict[tuple[Any, Any], int] = {}
    out_runs = []
    for (qt, qs, mem_text), att in zip(per_run, attributions):
        att = att.set_index("qid") if len(att) else att
        outcome, answers, ops, op_ids, op_refs, queries, hits = [], [], [], {}, [], [], []
        sequential = True  # every query's ranks are 1..n: the page numbers them itself
        for qid in order:
            if qid not in qs.index:
                outcome.append({"has": 0, "nops": 0, "nq": 0})
                answers.append({})
                continue
            row = qs.loc[qid]
            lab = att.loc[qid] if len(att) and qid in att.index else None
            L = layers(qt.question(qid), mem_text)
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
    return _clean({"questions": t.table(questions, ("qid", "cat", "catName", "conv", "q", "gold", "ev", "flip"),
                                        ("qid", "catName", "conv", "q", "gold", "ev")),
                   "mems": t.table(mems, ("text", "src"), ("text", "src")), "runs_data": out_runs,
                   "strings": t.finish()})


def embed_json(data: Any) -> str:
    """JSON that is safe inside ``<script type="application/json">``: ``<``, ``>`` and ``&`` are written as
    ``\\u003c``..., so no text (``</script>``, ``<!--`` followed by ``<script``) can end or comment out the block;
    ``JSON.parse`` reads them back unchanged."""
    text = json.dumps(_clean(data), ensure_ascii=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


# ---------------------------------------------------------------------------------- page
def build_html(runs: Sequence[Run | str | Path], title: str | None = None, table: pd.DataFrame | None = None,
               questions: str = "same") -> str:
    """The page as a string (see the module docstring); runs keep the order given, the first is A of every delta.
    ``questions='intersection'`` compares runs with different question sets on their shared questions."""
    matplotlib.use("Agg", force=False)
    loaded, skipped = load_runs(runs, warn=False)
    if not loaded:
        raise FileNotFoundError("memlab report --html: no finished run among " + ", ".join(str(d) for d, _ in skipped))
    labels = run_labels(loaded)
    if table is None:
        table = report_table(loaded, warn=False)
    by_label = dict(zip(labels, loaded))
    datasets: dict[str, Any] = {}
    atts = []
    for run in loaded:
        path = run.info.get("dataset") or run.config.dataset.path
        key = str(path)
        if key not in datasets:
            datasets[key] = load_dataset(path)
        atts.append(attribution.attribute(run, datasets[key]))

    figs: list[tuple[str, str]] = []
    figs.append(("F1 per category", _png(plots.category_bars(by_label, "f1"))))
    figs.append(("F1 against tokens", _png(plots.f1_vs_tokens(by_label))))
    figs.append(("Failure attribution", _png(plots.attribution_bars(
        dict(zip(labels, atts)), n={lab: {int(k): int(v) for k, v in r.summary["n"].items() if str(k).isdigit()}
                                    for lab, r in by_label.items()}))))
    diffs = distinguishing(loaded)
    if len(loaded) > 1 and all(set(d) == {"retrieval.top_k"} for d in diffs):
        figs.append(("Top-k curve", _png(plots.topk_curve(loaded))))
    for lab, run in zip(labels, loaded):
        figs.append((f"Evidence recall ({lab})", _png(plots.recall_curves(run))))

    cmp = table.attrs.get("comparison")
    if cmp is None and len(loaded) > 1:
        cmp = report_comparison(loaded, labels, questions)
    flipped: set[str] = set(map(str, cmp.flipped.qid)) if isinstance(cmp, Comparison) and len(cmp.flipped) else set()

    data = {"runs": [{"label": lab, "dir": str(r.run_dir)} for lab, r in zip(labels, loaded)],
            "labels": list(attribution.LABELS), **pack_runs(loaded, atts, flipped),
            "comparisons": comparison_data(cmp) if isinstance(cmp, Comparison) else []}
    data["cats"] = sorted({(c, category_name(c)) for c in data["questions"]["cat"]})
    payload = embed_json(data)

    notes = ["Means with 95 % clustered-bootstrap intervals [lo, hi] (conversations, then questions within them)."]
    if any(c.endswith("tokens_qa") for c in table.columns):
        notes.append(TOKEN_NOTE)
    notes += [f"Skipped {d}: the run {why}." for d, why in skipped]
    parts = [f"<h1>{html.escape(title or 'memlab report')}</h1>",
             f'<p class="meta">{len(loaded)} run(s); generated {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC. '
             f"Correct = F1 &ge; {CORRECT_F1}.</p>",
             _table_html(run_legend(loaded).drop(columns=["name"]).assign(
                 questions=[len(r.predictions) for r in loaded]), "runs"),
             '<h2 id="summary">Summary per category</h2>', _table_html(display_frame(table), "summary"),
             "".join(f'<p class="note">{html.escape(n)}</p>' for n in notes)]
    if isinstance(cmp, str):
        parts.append(f'<h2 id="compare">Paired comparisons</h2><p class="note">{html.escape(cmp)}</p>')
    elif cmp is not None:
        parts.append('<h2 id="compare">Paired comparisons (question by question, against the first run)</h2>')
        parts.append(f'<p class="note">{html.escape(comparison_heading(cmp))}</p>')
        shown = comparison_display(cmp)
        for lab in cmp.runs:
            nfl = int((cmp.flipped["run"] == lab).sum()) if len(cmp.flipped) else 0
            parts.append(f"<h3>B &minus; A = {html.escape(lab)} &minus; {html.escape(cmp.baseline)}: "
                         f"{nfl} flipped question(s)</h3>")
            parts.append(_table_html(shown[shown["run"] == lab].drop(columns=["run"]), "compare"))
        parts.append("".join(f'<p class="note">{html.escape(str(n))}</p>' for n in [*cmp.legend(), *cmp.notes]))
    parts.append('<h2 id="plots">Plots</h2><div class="plots">' + "".join(
        f'<figure><img alt="{html.escape(c)}" src="{src}"><figcaption>{html.escape(c)}</figcaption></figure>'
        for c, src in figs) + "</div>")
    parts.append(_BROWSER)
    body = "\n".join(parts)
    head = f'<meta charset="utf-8"><title>{html.escape(title or "memlab report")}</title>'
    return (f'<!DOCTYPE html><html lang="en"><head>{head}<style>{_asset("report.css")}</style></head><body>{body}'
            f'<script type="application/json" id="memlab-data">{payload}</script>'
            f'<script>{_asset("report.js")}</script></body></html>')


def write_html(out: str | Path, runs: Sequence[Run | str | Path], title: str | None = None,
               table: pd.DataFrame | None = None) -> Path:
    p = Path(out)
    p.parent.mkdir(parents=True, exist_ok=True)
    from memlab.atomic import write_text  # a full disk keeps the old file

    write_text(p, build_html(runs, title=title, table=table))
    return p


_BROWSER = """
<h2 id="questions">Question browser</h2>
<div class="filters">
 <label>judge by run <select id="f-run"></select></label>
 <label>category <select id="f-cat"><option value="">all</option></select></label>
 <label>failure label <select id="f-label"><option value="">any</option></select></label>
 <label>outcome <select id="f-outcome"><option value="">all</option><option value="ok">correct</option>
   <option value="bad">incorrect</option></select></label>
 <label><input type="checkbox" id="f-flip"> flipped between runs only</label>
 <label>text <input id="f-text" size="16" placeholder="question or answer"></label>
 <span id="f-count"></span>
</div>
<div id="browser"><div id="qlist"><table><thead id="qhead"></thead><tbody id="qbody"></tbody></table></div>
<div id="detail"><p class="note">Click a question to see its three trace layers in every run.</p></div></div>
"""
