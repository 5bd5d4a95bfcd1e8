"""Failure attribution: every failed question gets exactly one label, by a documented rule.

A question *fails* when its F1 is below ``threshold`` (0.5), or, for adversarial questions
(category 5), when the reader did not abstain; when the run had a judge, also when the judge said
wrong (J = 0) or failed. Questions an errata file marks ``invalid`` are listed too (label-issue).

Terms. *Gold tokens*: the gold answer's normalised, stemmed tokens (the official tokenisation,
`memlab.eval.scoring.stemmed_tokens`). *Coverage* of a text: the share of gold tokens found in it; a
text *carries the answer* at coverage >= 0.5. *Evidence memories*: stored memories whose
``source_ids`` meet the question's evidence dialog ids; an evidence id is *written* when some
evidence memory is sourced from it. The *context*: the memories the reader was given (all queries'
hits plus preload), each as the line a reader sees (`memlab.eval.ceiling.memory_line`: date, text).
The context is *answer-bearing* when every gold token occurs in it, whichever turn brought it; its
*answer ceiling* is the best official F1 a span of it could score (`memlab.eval.ceiling`).
An evidence id is *reached* by content: a context memory sourced from it holds a gold content token
(a gold token that is not a stop word: every text holds "with" or "it"), or the evidence turn itself
holds none (a bridge hop) and a memory sourced from it is in the context; a summary (an observation)
that dropped the answer's words does not reach its turn. A gold's leading "yes"/"no" is never a word a
turn states (a turn's "Yes" answers something else): content tokens, coverage of the evidence turns and
reach leave it out, so a bare "Yes" is inferred from whatever evidence reached the reader. The *answer
kind* (`answer_kind`): a ``count`` needs every evidence turn (each is one instance), an ``inferred``
answer (open-domain, yes/no, likely) is supported by any sufficient part of its evidence, a ``date`` is
computed from a turn's date, a ``literal`` answer is read off a turn.
The evidence memories *lost the answer* when there are none, or when the evidence turns carry the
answer but the evidence memories together do not.

Rules, tried in this order; the first that holds names the label (so labels are mutually
exclusive; ``abstain-error`` and ``reading-miss`` have two rules each). Rules 4-7 are only tried
when the context is not answer-bearing (a reader who had every word of the answer lost it itself),
and, for an inferred answer whose words are not in its evidence turns, when no evidence id was
reached.

1. ``label-issue`` — the gold or its evidence is wrong or unusable: the errata file marks the gold
   invalid; the question has no valid evidence id; a raw evidence entry names no existing turn even
   after recovery (``'D8:6; D9:17'`` is recovered to two ids and is fine); a dated gold answer
   contradicts its evidence turns (the date each turn implies — its session's date moved by the
   turn's own "yesterday", "last year", ... — is more than 10 days, a month or a year, at the gold's
   precision, from the gold date); or the question names one speaker while every evidence turn is
   the other speaker's, about themself (no "you", no name of the person asked about; a short form
   such as "Deb" names Deborah; not category 5, whose questions swap the person on purpose); or the
   gold is only a relative time ("Last year"), which depends on when it was said; or the official
   normalisation glues two words of the gold across punctuation into a token no answer can hold
   (``'April.2023'`` -> ``april2023``) and the prediction passes against the gold read with a space there;
2. ``judge-error`` — the judge call failed, or the judge said wrong (J = 0) to an exact match
   (EM = 1);
3. ``abstain-error`` — an adversarial question (category 5) answered instead of abstaining;
4. ``reconcile-loss`` — the evidence memories lost the answer, and reconcile is why: an extractor
   proposal sourced from the evidence was *skipped* as a duplicate (and it carried the answer, or
   nothing from the evidence was stored at all), or was *rewritten into an update* of a memory
   whose final text does not carry the answer although the proposal did;
5. ``write-miss`` — the evidence memories lost the answer (none stored, or the answer's words
   are in the evidence turns but not in the memories);
6. ``retrieval-miss`` — evidence memories exist, no evidence id was reached, and no comma part of
   a multi-hop gold reached the reader through another turn (coverage of its content tokens >= 0.5);
7. ``partial-retrieval`` — some written evidence ids (or gold parts) were reached, others not (the
   typical multi-hop failure: one hop found, the other not), and a missed one could have added what the
   answer needs: for a count, every instance; otherwise a gold content token the context lacks, or, for a
   turn that holds none of the gold's words (a bridge hop, a photo, a paraphrase), no evidence turn of its
   session (its date) reached the reader. A missed turn whose gold words were all in the context through
   other memories, or a wordless one beside a reached turn of its session, is redundant: the rules go on
   (a stricter test, that one context line must hold at least half a gold part's words, agreed better with
   the hand labels it was designed on and worse with the next blind sample, ``holdout5``: not kept);
8. ``abstain-error`` — a non-adversarial question abstained although the context was
   answer-bearing or every written evidence id was reached;
9. ``reading-miss`` — the context could have given a better answer: it was answer-bearing, or
   its answer ceiling is above the prediction's F1, or the answer has to be inferred or computed
   (its words are not in the evidence turns: an open-domain or yes/likely answer, a number, a date)
   and every written evidence id was reached;
   otherwise ``label-issue`` — every evidence id was reached, the gold's words are in neither the
   evidence turns nor the context and nothing marks the answer as inferred: the gold is not
   supported by its evidence (a title that appears in no text).

The retrieval trace records where each evidence memory sat in each query's full ranking (up to
depth 100, `memlab.answer.base.evidence_ranks`); retrieval-miss and partial-retrieval reasons
quote the best rank of each missed evidence id, so a reader sees whether a larger k would help.
Each attribution row carries the question's ``ceiling`` and ``bearing``: the run's own (its predictions carry
them, `memlab.eval.ceiling`), recomputed here only where the run has none or errata corrected the gold.
The gold-versus-evidence checks of rule 1 and `answer_kind` live in `memlab.eval.gold_checks`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from memlab.data import LoCoMo, load_dataset
from memlab.data.locomo import recover_evidence_ids
from memlab.eval.ceiling import answer_bearing, answer_ceiling, memory_line
from memlab.eval.errata import INVALID, Errata, apply_errata, load_errata
from memlab.eval.gold_checks import (
    DATE_SLACK_DAYS,
    EvidenceTurn,
    answer_kind,
    date_contradiction,
    glued_gold,
    parse_date,
    relative_time_only,
    speaker_contradiction,
)
from memlab.eval.scoring import is_abstention, normalize_answer, score_answer, stemmed_tokens
from memlab.index.text import stop_words
from memlab.trace import Traces, as_list, load

__all__ = ["ATTRIBUTION_COLUMNS", "COVERAGE", "DATE_SLACK_DAYS", "F1_THRESHOLD", "LABELS", "EvidenceTurn",
           "QuestionEvidence", "answer_kind", "attribute", "attribution_table", "coverage", "date_contradiction",
           "failed", "label_question", "parse_date", "speaker_contradiction"]

LABELS = ("label-issue", "judge-error", "abstain-error", "reconcile-loss", "write-miss", "retrieval-miss",
          "partial-retrieval", "reading-miss")
F1_THRESHOLD = 0.5
COVERAGE = 0.5
ATTRIBUTION_COLUMNS = ("qid", "conversation_id", "category", "label", "reason", "f1", "ceiling", "bearing",
                       "question", "answer", "prediction", "provenance")


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
    """The prediction row: category, answer, prediction, f1, em, j, evidence, evidence_raw, errata, question ..."""
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
    context: Sequence[str] | None = None
    """The reader's whole context as memory lines; None: the evidence memories in ``context_ids``."""
    turns: Sequence[EvidenceTurn] = ()
    """The evidence turns with speaker and date (the gold-versus-evidence checks need them)."""
    speakers: Sequence[str] = ()
    """The conversation's two speakers."""
    ceiling: float | None = None
    bearing: float | None = None
    """The run's own answer ceiling and answer-bearing share of the context (computed while answering,
    `memlab.eval.ceiling`); None: computed here from the context."""


def _where(ev: QuestionEvidence, ids: Sequence[str]) -> str:
    if not ev.ranks:
        return ", ".join(ids)
    out = []
    for s in ids:
        r = ev.ranks.get(s)
        out.append(f"{s} at rank {r}" if r is not None else f"{s} absent (beyond rank {ev.depth or '?'})")
    return ", ".join(out)


def _content(answer: str) -> set[str]:
    """Gold tokens without stop words ("with", "it" ...), which any text holds."""
    stops = stop_words()
    kept = " ".join(w for w in normalize_answer(answer).split() if w not in stops)
    return set(stemmed_tokens(kept)) or set(stemmed_tokens(answer))


def _holds_gold(gold: set[str], text: str) -> bool:
    return bool(gold & set(stemmed_tokens(text)))


def _adds(gold: set[str], have: set[str], turn: str, same_session: bool) -> bool:
    """Whether a missed evidence turn could have added what the answer needs: a gold content token the
    context lacks; a turn with none of the gold's words adds nothing by content when an evidence turn of
    its session (its date) reached the reader, and may otherwise (a bridge hop, a photo, a paraphrase)."""
    carried = gold & set(stemmed_tokens(turn))
    if carried:
        return bool(carried - have)
    return not same_session


#: A leading yes/no: a turn that says "Yes" replies to something else, so the polarity is always inferred.
_POLARITY = re.compile(r"^\W*(yes|no)\b\W*", re.IGNORECASE)


def label_question(ev: QuestionEvidence) -> tuple[str, str]:
    """(label, reason) for one failed question, by the ordered rules of the module doc."""
    row = ev.row
    evidence = as_list(row.get("evidence"))
    raw = as_list(row.get("evidence_raw")) or evidence
    cat = int(row["category"])
    answer = str(row.get("answer") or "")
    abstained = is_abstention(str(row.get("prediction") or ""))
    # 1. label-issue
    if row.get("errata") == INVALID:
        return "label-issue", "errata: the gold answer is marked invalid"
    if not evidence and cat != 5:  # a question to abstain on may have none (LongMemEval's *_abs; LoCoMo has none)
        return "label-issue", "no valid evidence id"
    unusable = [r for r in raw if r not in evidence and not set(recover_evidence_ids(str(r))) & set(evidence)]
    if unusable:
        return "label-issue", f"evidence ids that name no turn {sorted(unusable)}"
    if cat != 5:
        if relative_time_only(answer):
            return "label-issue", f"the gold {answer!r} is a relative time with no date: it depends on when it was said"
        why = glued_gold(answer, str(row.get("prediction") or ""), cat, F1_THRESHOLD) or \
            date_contradiction(answer, ev.turns) or \
            speaker_contradiction(str(row.get("question") or ""), ev.turns, ev.speakers)
        if why:
            return "label-issue", why
    # 2. judge-error
    if ev.judged and _judge_failed(row):
        return "judge-error", f"the judge call failed: {row.get('judge_error') or row.get('rule')}"
    if ev.judged and _num(row.get("j")) == 0.0 and _num(row.get("em")) == 1.0:
        return "judge-error", "the judge said wrong to an exact match"
    # 3. abstain-error (adversarial)
    if cat == 5:
        return "abstain-error", "adversarial question answered instead of abstained"
    lines = list(ev.context) if ev.context is not None else \
        [str(m["text"]) for m in ev.memories if m["id"] in ev.context_ids]
    if ev.ceiling is not None and ev.bearing is not None:
        ceiling, bearing = ev.ceiling, ev.bearing == 1.0
    else:
        ceiling, bearing = answer_ceiling(answer, cat, lines), answer_bearing(answer, cat, lines) == 1.0
    f1 = _num(row.get("f1"))
    ctx = f"ceiling {ceiling:.2f}"
    evs = set(evidence)
    stated = _POLARITY.sub("", answer)  # the answer's words a turn can state ("" for a bare yes/no)
    gold = _content(stated) if stated.strip() else set()
    turn_of = {t.id: t.text for t in ev.turns}
    date_of = {t.id: t.date for t in ev.turns}
    redundant: list[str] = []
    written = sorted({s for m in ev.memories for s in m["source_ids"] if s in evs})
    reached = sorted({s for m in ev.memories if m["id"] in ev.context_ids for s in m["source_ids"] if s in evs
                      and (_holds_gold(gold, str(m["text"])) or
                           not _holds_gold(gold, turn_of.get(s, ev.turn_text)))})
    turn_cov = coverage(stated, ev.turn_text)
    kind = answer_kind(answer, cat)
    # an inferred answer is supported by any sufficient part of its evidence: a reached turn leaves it to the reader
    supported = kind == "inferred" and turn_cov < COVERAGE and bool(reached)
    if not bearing and not supported:
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
                if (p.get("result") == "updated" and rec.get("tier") == "update" and rec.get("rewritten")
                        and carried and coverage(answer, str(ev.memory_text.get(p.get("memory_id") or "", "")))
                        < COVERAGE):
                    return "reconcile-loss", (f"reconcile merged an evidence proposal into {p.get('memory_id')}, "
                                              f"whose final text lost the answer")
            # 5. write-miss
            if not ev.memories:
                return "write-miss", "no stored memory is sourced from the evidence"
            return "write-miss", f"answer lost in extraction (turns cover {turn_cov:.2f}, memories {mem_cov:.2f})"
        # 6. retrieval-miss (a multi-hop part that reached the reader through another turn still counts)
        parts = [p.strip() for p in answer.split(",") if p.strip()] if cat == 1 else []
        have = set(stemmed_tokens(" ".join(lines)))
        carried = [p for p in parts if len(parts) > 1 and len(_content(p) & have) >= COVERAGE * len(_content(p))]
        if not reached and carried:
            return "partial-retrieval", (f"no evidence id reached, but the context carries {carried} through other "
                                         f"turns; missed {_where(ev, written)} ({ctx})")
        if not reached:
            return "retrieval-miss", (f"{len(ev.memories)} evidence memories stored, none that holds the answer "
                                      f"given to the reader ({ctx}); {_where(ev, written)}")
        # 7. partial-retrieval, when a missed evidence turn could have added what the answer needs
        missed = [s for s in written if s not in reached]
        reached_dates = {t.date for t in ev.turns if t.id in reached and t.date is not None}
        needed = [s for s in missed if kind == "count" or s not in turn_of  # no turn text: it may have
                  or _adds(gold, have, turn_of[s], date_of.get(s) in reached_dates)]
        if needed:
            return "partial-retrieval", f"reached {', '.join(reached)}; missed {_where(ev, needed)} ({ctx})"
        redundant = missed
    # 8. abstain-error (non-adversarial)
    where = ("the context held every answer word" if bearing else
             f"evidence {', '.join(reached)} reached the reader and the answer is inferred" if supported else
             f"evidence {', '.join(reached)} reached the reader; missed {', '.join(redundant)} carry nothing the "
             f"context lacks" if redundant else
             "every written evidence id reached the reader")
    if abstained:
        return "abstain-error", f"abstained although {where} ({ctx})"
    # 9. reading-miss, when the context could have given a better answer
    if bearing or (not math.isnan(f1) and ceiling > f1):
        return "reading-miss", f"{where}; a span scores {ceiling:.2f}, the answer {f1:.2f}"
    if turn_cov < COVERAGE and kind != "literal":
        return "reading-miss", f"{where}; the answer must be inferred or computed from it ({ctx})"
    if turn_cov >= COVERAGE:
        return "reading-miss", f"{where}; the evidence memories hold part of the answer ({ctx})"
    return "label-issue", (f"the gold answer's words are in neither its evidence turns (coverage {turn_cov:.2f}) "
                           f"nor the context ({ctx}): the gold is not supported by its evidence")


def _fmt(v: Any) -> str:
    return "-" if v is None else f"{float(v):.2f}"


def _run_judged(tr: Traces) -> bool:
    p = tr.run_dir / "config.yaml"
    if p.is_file():
        import yaml

        return bool(((yaml.safe_load(p.read_text()) or {}).get("judge") or {}).get("model"))
    return "j" in tr.questions and tr.questions["j"].notna().any()


def run_ceiling(row: Mapping[str, Any]) -> tuple[float | None, float | None]:
    """(answer ceiling, answer-bearing) the run computed while answering (`memlab.eval.ceiling`: the reader's
    context against the dataset's gold); (None, None) where it has none (category 5, a run from before them)
    or errata corrected the gold since."""
    c, b = _num(row.get("answer_ceiling")), _num(row.get("answer_bearing"))
    if math.isnan(c) or math.isnan(b) or row.get("errata") == "corrected":
        return None, None
    return c, b


def _with_errata(qs: pd.DataFrame, errata: Errata | str | Path | None) -> pd.DataFrame:
    if errata is None:
        return qs
    e = errata if isinstance(errata, Errata) else load_errata(errata)
    out = apply_errata(qs.drop(columns=["errata"], errors="ignore"), e)
    fixed = out["errata"] == "corrected"
    out.loc[fixed, "f1"] = [score_answer(str(p or ""), a, int(c)) for p, a, c in
                            zip(out.loc[fixed, "prediction"], out.loc[fixed, "answer"], out.loc[fixed, "category"])]
    return out


class _SourceIndex:
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


def attribute(run: str | Path | Traces | Any, data: LoCoMo | None = None, threshold: float = F1_THRESHOLD,
              errata: Errata | str | Path | None = None) -> pd.DataFrame:
    """One row per failed (or errata-invalid) question: qid, category, label, reason, F1, the context's answer
    ceiling and answer-bearing (`memlab.eval.ceiling`, against the gold after errata), prediction, gold.

    ``errata`` (a file or `Errata`) corrects gold answers (F1 rescored with the official metric)
    or marks them invalid, on top of any errata the run was scored with.
    """
    tr = run if isinstance(run, Traces) else load(getattr(run, "run_dir", run))
    if data is None:
        info = json.loads((tr.run_dir / "run.json").read_text()) if (tr.run_dir / "run.json").is_file() else {}
        data = load_dataset(info.get("dataset"))  # LoCoMo or LongMemEval
    judged = _run_judged(tr)
    qs = _with_errata(tr.questions, errata)
    memories = tr.memories.to_dict("records")
    mems_by_conv: dict[str, list[dict[str, Any]]] = {}
    for m in memories:
        mems_by_conv.setdefault(m["conversation"], []).append(m)
    text_of = {m["id"]: m["text"] for m in memories}
    line_of = {m["id"]: memory_line(m["text"], m.get("event_time")) for m in memories}
    ops_by_conv: dict[str, list[dict[str, Any]]] = {}
    for o in tr.extraction.to_dict("records") if len(tr.extraction) else []:
        ops_by_conv.setdefault(o["conversation"], []).append(o)
    mems_citing, ops_citing = _SourceIndex(mems_by_conv), _SourceIndex(ops_by_conv)
    recovered = {c for c, ms in mems_by_conv.items() if any(m.get("provenance") == "recovered" for m in ms)}
    contexts = {qid: set(ids) for qid, ids in tr.contexts.items()}
    rows = []
    for row in qs.to_dict("records"):
        if row.get("errata") != INVALID and not failed(row, threshold, judged):
            continue
        evidence = set(as_list(row.get("evidence")))
        conv = data[row["conversation_id"]]
        turns = [EvidenceTurn(e, conv.turn_index[e].speaker, conv.turn_index[e].searchable_text,
                              conv.session_by_index[conv.turn_index[e].session_index].date_time)
                 for e in as_list(row.get("evidence")) if e in conv.turn_index]
        ev_text = " ".join(t.text for t in turns)
        ev_mems = mems_citing.citing(row["conversation_id"], evidence)
        props = ops_citing.citing(row["conversation_id"], evidence)
        ceiling, bearing = run_ceiling(row)
        ev = QuestionEvidence(row=row, memories=ev_mems, context_ids=contexts.get(row["qid"], set()),
                              turn_text=ev_text, proposals=props, memory_text=text_of, judged=judged,
                              ranks=tr.best_ranks(row["qid"]), depth=tr.rank_depth.get(row["qid"]),
                              context=[line_of[i] for i in tr.contexts.get(row["qid"], []) if i in line_of],
                              turns=turns, speakers=conv.speakers, ceiling=ceiling, bearing=bearing)
        label, reason = label_question(ev)
        cat = int(row["category"])
        context = ev.context or []
        rows.append({"qid": row["qid"], "conversation_id": row["conversation_id"], "category": cat,
                     "label": label, "reason": reason, "f1": row["f1"],
                     "ceiling": ceiling if ceiling is not None else answer_ceiling(row["answer"], cat, context),
                     "bearing": bearing if bearing is not None else answer_bearing(row["answer"], cat, context),
                     "question": row["question"],
                     "answer": row["answer"], "prediction": row["prediction"],
                     # a black-box system's memories got their dialog ids by alignment (memlab.systems)
                     "provenance": "recovered" if row["conversation_id"] in recovered else "exact"})
    return pd.DataFrame(rows, columns=list(ATTRIBUTION_COLUMNS))


def attribution_table(att: pd.DataFrame) -> pd.DataFrame:
    """Counts per category (rows) and label (columns, in rule order), with totals."""
    t = pd.crosstab(att["category"], att["label"]).reindex(columns=list(LABELS), fill_value=0)
    t.loc["total"] = t.sum()
    t["failed"] = t.sum(axis=1)
    return t
