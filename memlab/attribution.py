"""Failure attribution: every failed question gets exactly one label, by a documented rule.

A question *fails* when its F1 is below ``threshold`` (0.5), or, for adversarial questions
(category 5), when the reader did not abstain. Labels, decided in this order:

1. ``label-issue`` — the gold label is unusable: the question has no valid evidence id (all
   malformed or dangling), or some of its raw evidence ids were dangling/malformed;
2. ``abstain-error`` — an adversarial question answered instead of abstained, or an abstention
   on a non-adversarial question although a memory sourced from its evidence was retrieved;
3. ``write-miss`` — no stored memory is sourced from any evidence id, or the memories that are
   lost the answer: the gold answer's words are in the evidence turns (coverage >= 0.5) but in
   none of those memories (coverage < 0.5);
4. ``retrieval-miss`` — a memory sourced from the evidence exists but is not among the memories
   given to the reader;
5. ``reading-miss`` — it was given to the reader and the answer is still wrong.

Coverage is the share of the gold answer's normalised, stemmed tokens found in a text (the
official metric's tokenisation, `memlab.eval.scoring.stemmed_tokens`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from memlab.data import LoCoMo, load_locomo
from memlab.eval.scoring import is_abstention, stemmed_tokens
from memlab.trace import Traces, _as_list, load

LABELS = ("label-issue", "abstain-error", "write-miss", "retrieval-miss", "reading-miss")
F1_THRESHOLD = 0.5
COVERAGE = 0.5


def coverage(answer: str, text: str) -> float:
    gold = set(stemmed_tokens(str(answer)))
    if not gold:
        return 0.0
    return len(gold & set(stemmed_tokens(text))) / len(gold)


def failed(row: Mapping[str, Any], threshold: float = F1_THRESHOLD) -> bool:
    if int(row["category"]) == 5:
        return not is_abstention(str(row.get("prediction") or ""))
    return float(row["f1"]) < threshold


def label_question(row: Mapping[str, Any], evidence_memories: Sequence[Mapping[str, Any]], context_ids: set[str],
                   evidence_text: str) -> tuple[str, str]:
    """(label, reason) for one failed question.

    ``evidence_memories``: stored memories (dicts with ``id``, ``text``) sourced from the evidence;
    ``context_ids``: ids of the memories the reader was given; ``evidence_text``: the evidence turns.
    """
    evidence = _as_list(row.get("evidence"))
    raw = _as_list(row.get("evidence_raw")) or evidence
    if not evidence:
        return "label-issue", "no valid evidence id"
    if len(set(raw) - set(evidence)) > 0:
        return "label-issue", f"malformed or dangling evidence ids {sorted(set(raw) - set(evidence))}"
    cat = int(row["category"])
    retrieved = [m for m in evidence_memories if m["id"] in context_ids]
    if cat == 5:
        return "abstain-error", "adversarial question answered instead of abstained"
    if is_abstention(str(row.get("prediction") or "")) and retrieved:
        return "abstain-error", f"abstained although {len(retrieved)} evidence memories were retrieved"
    if not evidence_memories:
        return "write-miss", "no stored memory is sourced from the evidence"
    answer = str(row.get("answer") or "")
    turn_cov = coverage(answer, evidence_text)
    mem_cov = coverage(answer, " ".join(m["text"] for m in evidence_memories))  # multi-hop: answers span memories
    if turn_cov >= COVERAGE and mem_cov < COVERAGE:
        return "write-miss", f"answer lost in extraction (turns cover {turn_cov:.2f}, memories {mem_cov:.2f})"
    if not retrieved:
        return "retrieval-miss", f"{len(evidence_memories)} evidence memories stored, none given to the reader"
    return "reading-miss", f"{len(retrieved)} evidence memories given to the reader, answer still wrong"


def attribute(run: str | Path | Traces | Any, data: LoCoMo | None = None, threshold: float = F1_THRESHOLD
              ) -> pd.DataFrame:
    """One row per failed question: qid, category, label, reason (plus the prediction and gold)."""
    tr = run if isinstance(run, Traces) else load(getattr(run, "run_dir", run))
    if data is None:
        import json

        info = json.loads((tr.run_dir / "run.json").read_text()) if (tr.run_dir / "run.json").is_file() else {}
        data = load_locomo(info.get("dataset"))
    mems_by_conv: dict[str, list[dict[str, Any]]] = {}
    for m in tr.memories.to_dict("records"):
        mems_by_conv.setdefault(m["conversation"], []).append(m)
    contexts = {qid: set(ids) for qid, ids in tr.contexts.items()}
    rows = []
    for row in tr.questions.to_dict("records"):
        if not failed(row, threshold):
            continue
        evidence = set(_as_list(row.get("evidence")))
        conv = data[row["conversation_id"]]
        ev_text = " ".join(conv.turn_index[e].searchable_text for e in evidence if e in conv.turn_index)
        ev_mems = [m for m in mems_by_conv.get(row["conversation_id"], []) if set(m["source_ids"]) & evidence]
        label, reason = label_question(row, ev_mems, contexts.get(row["qid"], set()), ev_text)
        rows.append({"qid": row["qid"], "conversation_id": row["conversation_id"], "category": int(row["category"]),
                     "label": label, "reason": reason, "f1": row["f1"], "question": row["question"],
                     "answer": row["answer"], "prediction": row["prediction"]})
    return pd.DataFrame(rows, columns=["qid", "conversation_id", "category", "label", "reason", "f1", "question",
                                       "answer", "prediction"])


def attribution_table(att: pd.DataFrame) -> pd.DataFrame:
    """Counts per category (rows) and label (columns), with totals."""
    t = pd.crosstab(att["category"], att["label"]).reindex(columns=list(LABELS), fill_value=0)
    t.loc["total"] = t.sum()
    t["failed"] = t.sum(axis=1)
    return t


def compare_attribution(runs: Mapping[str, Any], data: LoCoMo | None = None) -> pd.DataFrame:
    """Long table (arm, category, label, count) over several runs, for stacked bars."""
    frames = []
    for arm, run in runs.items():
        att = attribute(run, data)
        c = att.groupby(["category", "label"]).size().rename("count").reset_index()
        frames.append(c.assign(arm=arm))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["category", "label", "count",
                                                                                       "arm"])
