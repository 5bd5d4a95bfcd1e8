"""One self-contained HTML page over finished runs (``memlab report --html OUT.html RUN [RUN ...]``).

The page needs no server and no network: plots are embedded as base64 PNG, the data as inline JSON, and
the script and style are inline. It holds the per-category table with 95 % intervals, the paired
comparisons of every run against the first, the plots, and a question browser: filter by category,
failure label (`memlab.attribution`), correct / incorrect (F1 >= 0.5) and flipped between runs; click a
question to see, per run, its three trace layers (`memlab.trace`): the extractor ops that touched its
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
from memlab.data import load_locomo
from memlab.run.report import (
    CONTEXT_NOTE,
    CORRECT_F1,
    category_name,
    correct,
    display_frame,
    distinguishing,
    load_runs,
    order_runs,
    paired,
    report_table,
    run_labels,
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


def _comparison_display(table: pd.DataFrame) -> pd.DataFrame:
    def num(x: Any, fmt: str = "{:+.3f}") -> str:
        return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)

    out = []
    for r in table.to_dict("records"):
        out.append({"category": category_name(r.get("group", r.get("category"))), "metric": r.get("metric", "f1"),
                    "n": r.get("n", ""), "delta [95 % CI]": f"{num(r.get('delta'))} [{num(r.get('lo'))}, "
                                                            f"{num(r.get('hi'))}]",
                    "p (permutation)": num(r.get("p_perm"), "{:.3g}"), "p (McNemar)": num(r.get("p_mcnemar"), "{:.3g}"),
                    "wins / losses / ties": f"{r.get('wins', '')} / {r.get('losses', '')} / {r.get('ties', '')}",
                    "MDD": num(r.get("mdd"), "{:.3f}")})
    return pd.DataFrame(out)


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
        evidence = trace._as_list(row.evidence.iloc[0])
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


def layers(v: dict[str, Any], mem_text: dict[str, str]) -> dict[str, Any]:
    """One question's three layers (a `Traces.question` result) as compact JSON for the page."""
    ops = []
    ex = v["extractor"]
    if ex is not None and len(ex):
        for o in ex.to_dict("records"):
            rec = o.get("reconcile") or {}
            ops.append({"action": o.get("action"), "result": o.get("result"), "tier": rec.get("tier"),
                        "score": rec.get("score"), "jaccard": rec.get("jaccard"),
                        "src": list(o.get("source_ids") or []),
                        "text": _short(o.get("text") if _missing(o.get("final_text")) else o.get("final_text")),
                        "error": _short(o.get("error"), 160)})
    mems = [{"id": m["id"], "text": _short(m["text"]), "src": list(m.get("source_ids") or [])}
            for m in (v["evidence_memories"].to_dict("records") if len(v["evidence_memories"]) else [])]
    queries = []
    qmeta = v["queries"].to_dict("records") if v["queries"] is not None and len(v["queries"]) else []
    hits = v["retrieval"]
    for qm in qmeta:
        qh = hits[hits.query_index == qm["query_index"]] if len(hits) else hits
        queries.append({"query": qm["query"], "error": qm.get("error"),
                        "dropped": len(qm.get("dropped_by_dedupe") or []),
                        "fallback": len(qm.get("fallback_added") or []),
                        "hits": [{"rank": h["rank"], "dense": h["dense_rank"], "kw": h["keyword_rank"],
                                  "fused": h["fused_rank"], "via": h.get("via"), "ev": bool(h.get("evidence_hit")),
                                  "src": list(h.get("source_ids") or []),
                                  "text": _short(mem_text.get(h["id"], ""), 200)}
                                 for h in qh.to_dict("records")]})
    a = v["answer"] or {}
    answer = {"rule": a.get("rule"), "calls": a.get("calls"), "usage": a.get("usage"), "latency": a.get("latency_s"),
              "prompt": _short(a.get("prompt"), 4000), "response": _short(a.get("response"), 1000),
              "tools": _short(json.dumps(a.get("tool_calls") or [], default=str), 1000)
              if a.get("tool_calls") else ""}
    return _clean({"ops": ops, "mems": mems, "queries": queries, "answer": answer})


def question_data(runs: Sequence[Run], labels: Sequence[str], attributions: Sequence[pd.DataFrame],
                  flipped: set[str]) -> list[dict[str, Any]]:
    """One record per question (in the first run's order): the question, and per run its outcome and layers."""
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
    atts = [att.set_index("qid") if len(att) else att for att in attributions]
    out = []
    for qid in order:
        ref = next(qs.loc[qid] for _, qs, _ in per_run if qid in qs.index)
        rec = {"qid": qid, "cat": int(ref["category"]), "catName": category_name(int(ref["category"])),
               "conv": ref["conversation_id"], "q": str(ref["question"]), "gold": _short(ref["answer"], 500),
               "ev": list(trace._as_list(ref["evidence"])), "flip": qid in flipped, "r": []}
        for (qt, qs, mem_text), att in zip(per_run, atts):
            if qid not in qs.index:
                rec["r"].append(None)
                continue
            row = qs.loc[qid]
            lab = att.loc[qid] if len(att) and qid in att.index else None
            rec["r"].append(_clean({
                "pred": _short(row["prediction"], 500), "f1": float(row["f1"]), "ok": correct(row["f1"]),
                "label": None if lab is None else lab["label"], "reason": None if lab is None else lab["reason"],
                "error": None if pd.isna(row.get("error")) else str(row.get("error")),
                "layers": layers(qt.question(qid), mem_text)}))
        out.append(rec)
    return out


# ---------------------------------------------------------------------------------- page
def build_html(runs: Sequence[Run | str | Path], title: str | None = None, table: pd.DataFrame | None = None) -> str:
    """The page as a string (see the module docstring)."""
    matplotlib.use("Agg", force=False)
    loaded, skipped = load_runs(runs, warn=False)
    if not loaded:
        raise FileNotFoundError("memlab report --html: no finished run among " + ", ".join(str(d) for d, _ in skipped))
    loaded = order_runs(loaded)
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
            datasets[key] = load_locomo(path)
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
    figs.append((f"Evidence recall ({labels[0]})", _png(plots.recall_curves(loaded[0]))))

    comparisons = []
    flipped: set[str] = set()
    for lab, run in zip(labels[1:], loaded[1:]):
        res = paired(loaded[0], run)
        t, fl = res.table, res.flipped
        flipped |= set(map(str, fl.qid)) if len(fl) else set()
        comparisons.append((lab, t, fl, list(getattr(res, "notes", []) or [])))

    questions = question_data(loaded, labels, atts, flipped)
    data = {"runs": [{"label": lab, "dir": str(r.run_dir)} for lab, r in zip(labels, loaded)],
            "questions": questions, "labels": list(attribution.LABELS),
            "cats": sorted({(q["cat"], q["catName"]) for q in questions})}
    payload = json.dumps(_clean(data), ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")

    notes = ["Means with 95 % clustered-bootstrap intervals [lo, hi] (conversations, then questions within them)."]
    if (table.get("tokens_source") == "context").any():
        notes.append(CONTEXT_NOTE)
    notes += [f"Skipped {d}: the run {why}." for d, why in skipped]
    parts = [f"<h1>{html.escape(title or 'memlab report')}</h1>",
             f'<p class="meta">{len(loaded)} run(s); generated {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC. '
             f"Correct = F1 &ge; {CORRECT_F1}.</p>",
             _table_html(pd.DataFrame({"run": labels, "folder": [str(r.run_dir) for r in loaded],
                                       "questions": [len(r.predictions) for r in loaded]}), "runs"),
             '<h2 id="summary">Summary per category</h2>', _table_html(display_frame(table), "summary"),
             "".join(f'<p class="note">{html.escape(n)}</p>' for n in notes)]
    if comparisons:
        parts.append('<h2 id="compare">Paired comparisons (question by question, against the first run)</h2>')
        for lab, t, fl, cnotes in comparisons:
            parts.append(f"<h3>{html.escape(lab)} &minus; {html.escape(labels[0])}: {len(fl)} flipped question(s)</h3>")
            parts.append(_table_html(_comparison_display(t), "compare"))
            parts.append("".join(f'<p class="note">{html.escape(str(n))}</p>' for n in cnotes))
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
