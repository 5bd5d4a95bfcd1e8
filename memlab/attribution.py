"""Failure attribution: every failed question gets exactly one label, by a documented rule.

A question *fails* when its F1 is below ``threshold`` (0.5), or, for adversarial questions
(category 5), when the reader did not abstain; when the run had a judge, also when the judge said
wrong (J = 0) or failed. Questions an errata file marks ``invalid`` are listed too (label-issue).

Terms. *Evidence memories*: stored memories whose ``source_ids`` meet the question's evidence
dialog ids. An evidence dialog id is *written* when some evidence memory is sourced from it, and
*reached* when such a memory is in the reader's context (all queries' hits plus preload).
*Coverage* of a text: the share of the gold answer's normalised, stemmed tokens found in it (the
official tokenisation, `memlab.eval.scoring.stemmed_tokens`); a text *carries the answer* at
coverage >= 0.5. The evidence memories *lost the answer* when there are none, or when the
evidence turns carry the answer but the evidence memories together do not.

Rules, tried in this order; the first that holds names the label (so labels are mutually
exclusive; ``abstain-error`` has two rules at two places):

1. ``label-issue`` — the errata file marks the gold answer invalid, or the question has no valid
   evidence id, or some raw evidence ids were malformed or dangling;
2. ``judge-error`` — the judge call failed, or the judge said wrong (J = 0) to an exact match
   (EM = 1);
3. ``abstain-error`` — an adversarial question (category 5) answered instead of abstaining;
4. ``reconcile-loss`` — the evidence memories lost the answer, and reconcile is why: an extractor
   proposal sourced from the evidence was *skipped* as a duplicate (and it carried the answer, or
   nothing from the evidence was stored at all), or was *rewritten into an update* of a memory
   whose final text does not carry the answer although the proposal did;
5. ``write-miss`` — the evidence memories lost the answer (none stored, or the answer's words
   are in the evidence turns but not in the memories);
6. ``retrieval-miss`` — evidence memories exist, none reached the reader;
7. ``partial-retrieval`` — some written evidence dialog ids reached the reader, others did not
   (the typical multi-hop failure: one hop found, the other not);
8. ``abstain-error`` — a non-adversarial question abstained although every written evidence
   dialog id reached the reader;
9. ``reading-miss`` — every written evidence id reached the reader and the answer is still wrong.

The retrieval trace records where each evidence memory sat in each query's full ranking (up to
depth 100, `memlab.answer.base.evidence_ranks`); retrieval-miss and partial-retrieval reasons
quote the best rank of each missed evidence id, so a reader sees whether a larger k would help.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from memlab.data import LoCoMo, load_locomo
from memlab.eval.errata import INVALID, Errata, apply_errata, load_errata
from memlab.eval.scoring import is_abstention, score_answer, stemmed_tokens
from memlab.trace import Traces, _as_list, load

LABELS = ("label-issue", "judge-error", "abstain-error", "reconcile-loss", "write-miss", "retrieval-miss",
          "partial-retrieval", "reading-miss")
F1_THRESHOLD = 0.5
COVERAGE = 0.5


def coverage(answer: str, text: str) -> float:
    gold = set(stemmed_tokens(str(answer)))
    if not gold:
        return 0.0
    return len(gold & set(stemmed_tokens(text))) / len(gold)


def _num(v: Any) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return math.nan
    return f


def _judge_failed(row: Mapping[str, Any]) -> bool:
    err = row.get("judge_error")
    if isinstance(err, str) and err:
        return True
    return "(judge failed" in str(row.get("rule") or "")


def failed(row: Mapping[str, Any], threshold: float = F1_THRESHOLD, judged: bool = False) -> bool:
    """Whether a question counts as failed (see the module doc); ``judged``: the run had a judge."""
    if judged and (_judge_failed(row) or _num(row.get("j")) == 0.0):
        return True
    if int(row["category"]) == 5:
        return not is_abstention(str(row.get("prediction") or ""))
    f1 = _num(row.get("f1"))
    return not math.isnan(f1) and f1 < threshold


@dataclass
class QuestionEvidence:
    """Everything the rule reads about one question (built from a run's traces, or by hand in tests)."""

    row: Mapping[str, Any]
    """The prediction row: category, answer, prediction, f1, em, j, evidence, evidence_raw, errata, ..."""
    memories: Sequence[Mapping[str, Any]] = ()
    """Stored memories sourced from the evidence (``id``, ``text``, ``source_ids``)."""
    context_ids: set[str] = field(default_factory=set)
    turn_text: str = ""
    """The evidence turns' text."""
    proposals: Sequence[Mapping[str, Any]] = ()
    """Extractor ops sourced from the evidence: ``text``, ``result`` (added, skipped, updated ...),
    ``memory_id`` and ``reconcile`` (the decision: ``tier``, ``rewritten``, ``score``, ``jaccard``)."""
    memory_text: Mapping[str, str] = field(default_factory=dict)
    """Final text of any stored memory (skip candidates and update targets)."""
    judged: bool = False
    ranks: Mapping[str, int | None] = field(default_factory=dict)
    """Best rank of each evidence dialog id over the question's queries (None: not within the depth)."""
    depth: int | None = None


def _where(ev: QuestionEvidence, ids: Sequence[str]) -> str:
    if not ev.ranks:
        return ", ".join(ids)
    out = []
    for s in ids:
        r = ev.ranks.get(s)
        out.append(f"{s} at rank {r}" if r is not None else f"{s} absent (beyond rank {ev.depth or '?'})")
    return ", ".join(out)


def label_question(ev: QuestionEvidence) -> tuple[str, str]:
    """(label, reason) for one failed question, by the ordered rules of the module doc."""
    row = ev.row
    evidence = _as_list(row.get("evidence"))
    raw = _as_list(row.get("evidence_raw")) or evidence
    cat = int(row["category"])
    answer = str(row.get("answer") or "")
    abstained = is_abstention(str(row.get("prediction") or ""))
    # 1. label-issue
    if row.get("errata") == INVALID:
        return "label-issue", "errata: the gold answer is marked invalid"
    if not evidence:
        return "label-issue", "no valid evidence id"
    if set(raw) - set(evidence):
        return "label-issue", f"malformed or dangling evidence ids {sorted(set(raw) - set(evidence))}"
    # 2. judge-error
    if ev.judged and _judge_failed(row):
        return "judge-error", f"the judge call failed: {row.get('judge_error') or row.get('rule')}"
    if ev.judged and _num(row.get("j")) == 0.0 and _num(row.get("em")) == 1.0:
        return "judge-error", "the judge said wrong to an exact match"
    # 3. abstain-error (adversarial)
    if cat == 5:
        return "abstain-error", "adversarial question answered instead of abstained"
    evs = set(evidence)
    written = sorted({s for m in ev.memories for s in m["source_ids"] if s in evs})
    reached = sorted({s for m in ev.memories if m["id"] in ev.context_ids for s in m["source_ids"] if s in evs})
    turn_cov = coverage(answer, ev.turn_text)
    mem_cov = coverage(answer, " ".join(m["text"] for m in ev.memories))  # multi-hop: answers span memories
    lost = not ev.memories or (turn_cov >= COVERAGE and mem_cov < COVERAGE)
    # 4. reconcile-loss
    if lost:
        for p in ev.proposals:
            rec = p.get("reconcile") or {}
            carried = coverage(answer, str(p.get("text") or "")) >= COVERAGE
            if p.get("result") == "skipped" and (carried or not ev.memories):
                return "reconcile-loss", (f"reconcile skipped an evidence proposal as a duplicate of "
                                          f"{p.get('memory_id')} (score {_fmt(rec.get('score'))}, Jaccard "
                                          f"{_fmt(rec.get('jaccard'))}): {str(p.get('text'))[:80]!r}")
            if (p.get("result") == "updated" and rec.get("tier") == "update" and rec.get("rewritten") and carried
                    and coverage(answer, str(ev.memory_text.get(p.get("memory_id") or "", ""))) < COVERAGE):
                return "reconcile-loss", (f"reconcile merged an evidence proposal into {p.get('memory_id')}, "
                                          f"whose final text lost the answer")
        # 5. write-miss
        if not ev.memories:
            return "write-miss", "no stored memory is sourced from the evidence"
        return "write-miss", f"answer lost in extraction (turns cover {turn_cov:.2f}, memories {mem_cov:.2f})"
    # 6. retrieval-miss
    if not reached:
        return "retrieval-miss", (f"{len(ev.memories)} evidence memories stored, none given to the reader; "
                                  f"{_where(ev, written)}")
    # 7. partial-retrieval
    missed = [s for s in written if s not in reached]
    if missed:
        return "partial-retrieval", (f"reached {', '.join(reached)}; missed {_where(ev, missed)}")
    # 8. abstain-error (non-adversarial)
    if abstained:
        return "abstain-error", f"abstained although every written evidence id reached the reader ({len(reached)})"
    # 9. reading-miss
    return "reading-miss", f"every written evidence id ({len(reached)}) reached the reader, answer still wrong"


def _fmt(v: Any) -> str:
    return "-" if v is None else f"{float(v):.2f}"


def _run_judged(tr: Traces) -> bool:
    p = tr.run_dir / "config.yaml"
    if p.is_file():
        import yaml

        return bool(((yaml.safe_load(p.read_text()) or {}).get("judge") or {}).get("model"))
    return "j" in tr.questions and tr.questions["j"].notna().any()


def _with_errata(qs: pd.DataFrame, errata: Errata | str | Path | None) -> pd.DataFrame:
    if errata is None:
        return qs
    e = errata if isinstance(errata, Errata) else load_errata(errata)
    out = apply_errata(qs.drop(columns=["errata"], errors="ignore"), e)
    fixed = out["errata"] == "corrected"
    out.loc[fixed, "f1"] = [score_answer(str(p or ""), a, int(c)) for p, a, c in
                            zip(out.loc[fixed, "prediction"], out.loc[fixed, "answer"], out.loc[fixed, "category"])]
    return out


def attribute(run: str | Path | Traces | Any, data: LoCoMo | None = None, threshold: float = F1_THRESHOLD,
              errata: Errata | str | Path | None = None) -> pd.DataFrame:
    """One row per failed (or errata-invalid) question: qid, category, label, reason, prediction, gold.

    ``errata`` (a file or `Errata`) corrects gold answers (F1 rescored with the official metric)
    or marks them invalid, on top of any errata the run was scored with.
    """
    tr = run if isinstance(run, Traces) else load(getattr(run, "run_dir", run))
    if data is None:
        info = json.loads((tr.run_dir / "run.json").read_text()) if (tr.run_dir / "run.json").is_file() else {}
        data = load_locomo(info.get("dataset"))
    judged = _run_judged(tr)
    qs = _with_errata(tr.questions, errata)
    mems_by_conv: dict[str, list[dict[str, Any]]] = {}
    for m in tr.memories.to_dict("records"):
        mems_by_conv.setdefault(m["conversation"], []).append(m)
    text_of = {m["id"]: m["text"] for m in tr.memories.to_dict("records")}
    ops_by_conv: dict[str, list[dict[str, Any]]] = {}
    for o in tr.extraction.to_dict("records") if len(tr.extraction) else []:
        ops_by_conv.setdefault(o["conversation"], []).append(o)
    contexts = {qid: set(ids) for qid, ids in tr.contexts.items()}
    rows = []
    for row in qs.to_dict("records"):
        if row.get("errata") != INVALID and not failed(row, threshold, judged):
            continue
        evidence = set(_as_list(row.get("evidence")))
        conv = data[row["conversation_id"]]
        ev_text = " ".join(conv.turn_index[e].searchable_text for e in evidence if e in conv.turn_index)
        ev_mems = [m for m in mems_by_conv.get(row["conversation_id"], []) if set(m["source_ids"]) & evidence]
        props = [o for o in ops_by_conv.get(row["conversation_id"], []) if set(o.get("source_ids") or []) & evidence]
        ev = QuestionEvidence(row=row, memories=ev_mems, context_ids=contexts.get(row["qid"], set()),
                              turn_text=ev_text, proposals=props, memory_text=text_of, judged=judged,
                              ranks=tr.best_ranks(row["qid"]), depth=tr.rank_depth.get(row["qid"]))
        label, reason = label_question(ev)
        rows.append({"qid": row["qid"], "conversation_id": row["conversation_id"], "category": int(row["category"]),
                     "label": label, "reason": reason, "f1": row["f1"], "question": row["question"],
                     "answer": row["answer"], "prediction": row["prediction"],
                     # a black-box system's memories got their dialog ids by alignment (memlab.systems)
                     "provenance": "recovered" if any(m.get("provenance") == "recovered"
                                                      for m in mems_by_conv.get(row["conversation_id"], []))
                     else "exact"})
    return pd.DataFrame(rows, columns=["qid", "conversation_id", "category", "label", "reason", "f1", "question",
                                       "answer", "prediction", "provenance"])


def attribution_table(att: pd.DataFrame) -> pd.DataFrame:
    """Counts per category (rows) and label (columns, in rule order), with totals."""
    t = pd.crosstab(att["category"], att["label"]).reindex(columns=list(LABELS), fill_value=0)
    t.loc["total"] = t.sum()
    t["failed"] = t.sum(axis=1)
    return t
