"""Failure attribution: every failed question gets exactly one label, by a documented rule.

The labels' definitions, in the words a hand labeller uses, are the attribution guide's "Failure labels"
page; these rules are their computable form, and a hand check measures how far the two agree
(``benchmarks/attribution_agreement.py``).

A question *fails* when its F1 is below ``threshold`` (0.5), or, for adversarial questions (category 5), when
the reader did not abstain; with a judge, also when it said wrong (J = 0) or failed. Questions an errata file
marks ``invalid`` are listed too (label-issue).

Terms. *Gold words*: the gold answer's content words (`memlab.eval.gold_checks.content_tokens`: the official
stemmed tokens less function words, which any text holds), matched with its glued words split
("watchingmovies" -> "watching movies": `memlab.eval.gold_checks.deglue`); *coverage* of a text: the share of
gold words found in it; a text *carries the answer* at coverage >= 0.5. A gold's leading "yes"/"no" is never
a word a turn states (a turn's "Yes" answers something else), so a bare "Yes" is inferred. *Evidence
memories*: stored memories whose ``source_ids`` meet the question's evidence dialog ids; an evidence id is
*written* when some evidence memory is sourced from it. The *context*: the memories the reader was given, each
as the line a reader sees (`memlab.eval.ceiling.memory_line`). A context line is *about* the question when it
shares the question's content words or comes from an evidence turn or a turn beside one in its session; the
context is *answer-bearing* (supports the answer) when the lines about the question hold every gold word —
for a question about two people, each person's own lines at least half — and its *answer ceiling* is the best
official F1 a span of those lines (or a date they imply) could score (`memlab.eval.ceiling`).
An evidence id is *reached* when the context memories sourced from it and the context lines from its
same-session neighbours (which often carry the same fact) hold at least half of each gold part's words that
its turn holds (or the turn holds none — a bridge hop — and a memory sourced from it is in the context; for
an inferred answer or a date, or a line from its same-session neighbour, which has its date);
*reached in part* when they hold fewer but some ("joy" of "a sense of joy and freedom": partial-retrieval
unless the rest is in the context); a summary that dropped the turn's gold words does not reach it. The
*answer kind* (`answer_kind`): a ``count`` needs every evidence turn (each is one instance), an ``inferred``
answer (open-domain, yes/no, likely) is supported by any sufficient part of its evidence, a ``date`` is
computed from a turn's date, a ``literal`` answer is read off a turn. The evidence memories *lost the
answer* when there are none, or when the evidence turns carry the answer but the evidence memories together do
not.

Rules, tried in this order; the first that holds names the label (``abstain-error`` and ``reading-miss`` have
two rules each). Rules 4-7 are only tried when the context is not answer-bearing, and, for an inferred answer
whose words are not in its evidence turns, when no evidence id was reached.

1. ``label-issue`` — the gold or its evidence is wrong or unusable (`memlab.eval.gold_issues.gold_issue`):
   the errata file marks it invalid; no valid evidence id; a raw evidence entry names no existing turn even
   after recovery; the gold is only a relative time ("Last year"); glued words ("April.2023",
   "watchingmovies") fail a prediction that passes with them split; a dated gold contradicts its evidence
   turns (the turn naming the event: "last week" said on 16 July 2023 is not "June 2023"); a duration its
   turns' dates contradict ("19 days" for 9 to 20 July); the question names one speaker while every evidence
   turn is the other's, about themself, and the person asked never says it (nor says of themself, right before
   an evidence turn, what the question asks: "It reminds me of one of my favorite Disney movies" before the
   other's "Ratatouille is one of my favorites!"; not category 5, whose questions swap the person on purpose);
   an open-ended suggestion whose words are nowhere in the conversation;
2. ``judge-error`` — the judge call failed, or the judge said wrong (J = 0) to an exact match (EM = 1);
3. ``abstain-error`` — an adversarial question (category 5) answered instead of abstaining;
4. ``reconcile-loss`` — the evidence memories lost the answer, and reconcile is why: an extractor
   proposal sourced from the evidence was *skipped* as a duplicate (and it carried the answer, or
   nothing from the evidence was stored at all), or was *rewritten into an update* of a memory
   whose final text does not carry the answer although the proposal did;
5. ``write-miss`` — the evidence memories lost the answer (none stored, or the answer's words
   are in the evidence turns but not in the memories);
6. ``retrieval-miss`` — evidence memories exist, no evidence id was reached (even in part), and no part of the
   answer reached the reader through another turn (a comma part of a multi-part gold, at coverage >= 0.5 in the lines
   about the question; for a question about two people, one person's support);
7. ``partial-retrieval`` — some written evidence ids (or gold parts, or people) were reached, others not,
   and a missed one could have added what the answer needs: for a count, every instance; for a question about
   two people, the turn of a person the context does not support; otherwise its words of a gold part that no
   one line about the question holds together, or, for a turn that holds none of the gold's words (a bridge
   hop, a photo, a paraphrase), no evidence turn of its session reached the reader. A missed turn (or one
   reached in part) whose words of each gold part one other line holds, or a wordless one beside a reached
   turn of its session, is redundant: the rules go on;
8. ``abstain-error`` — a non-adversarial question abstained although the context was
   answer-bearing or every written evidence id was reached;
9. ``reading-miss`` — the context could have given a better answer: it was answer-bearing, or
   its answer ceiling is above the prediction's F1, or the answer has to be inferred or computed
   (its words are not in the evidence turns: an open-domain or yes/likely answer, a number, a date)
   and every written evidence id was reached;
   otherwise ``label-issue`` — every evidence id was reached, the gold's words are in neither the
   evidence turns nor the context and nothing marks the answer as inferred: the gold is not
   supported by its evidence (a title that appears in no text).

Retrieval-miss and partial-retrieval reasons quote each missed evidence id's best rank in the full ranking
(depth 100, `memlab.answer.base.evidence_ranks`): would a larger k help? Each row carries ``ceiling`` and
``bearing``, computed here against the gold after errata (a run's own may predate supported lines).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from memlab.data import LoCoMo, load_dataset
from memlab.data.locomo import recover_evidence_ids
from memlab.eval.ceiling import (
    POLARITY,
    Asked,
    answer_bearing,
    answer_ceiling,
    conversation_words,
    jointly_asked,
    line_words,
    memory_line,
    reached,
)
from memlab.eval.ceiling import about as _about
from memlab.eval.errata import INVALID, Errata, rescored
from memlab.eval.gold_checks import (
    DATE_SLACK_DAYS,
    EvidenceTurn,
    answer_kind,
    content_tokens,
    conversation_bigrams,
    date_contradiction,
    deglue,
    line_subjects,
    parse_date,
    speaker_contradiction,
    turn_before,
)
from memlab.eval.gold_issues import gold_issue
from memlab.eval.scoring import is_abstention, stemmed_tokens
from memlab.trace import SourceIndex, Traces, as_list, load, run_judged, table_records

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
    """The share of the gold's content words (`_content`) found in ``text``."""
    gold = _content(answer)
    if not gold:
        return 0.0
    return len(gold & line_words(text)) / len(gold)


def _num(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def _judge_failed(row: Mapping[str, Any]) -> bool:
    err = row.get("judge_error")
    return bool(isinstance(err, str) and err) or "(judge failed" in str(row.get("rule") or "")


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
    context_sources: Sequence[Sequence[str]] | None = None
    """Each context line's dialog ids (what makes it an evidence turn's or its neighbour's); None: unknown."""
    spoken: Mapping[str, Sequence[str]] | None = None
    """Each speaker's turns in the whole conversation (whether the person asked ever says the gold)."""
    said: set[str] | None = None
    """The conversation's content words (a suggestion found nowhere); None: from ``spoken``."""
    bigrams: frozenset[str] = frozenset()
    """The conversation's word pairs, to split the gold's glued words (`memlab.eval.gold_checks.deglue`)."""
    ceiling: float | None = None
    bearing: float | None = None
    """Answer ceiling and answer-bearing already computed (`attribute`, or by hand in tests); None: computed
    from the context."""


def _where(ev: QuestionEvidence, ids: Sequence[str]) -> str:
    return ", ".join(f"{s} at rank {ev.ranks[s]}" if ev.ranks.get(s) is not None else
                     f"{s} absent (beyond rank {ev.depth or '?'})" if ev.ranks else s for s in ids)


def _content(answer: str) -> set[str]:
    """Gold tokens without function words ("with", "it" ...), which any text holds; all of them for a gold of
    function words only ("two")."""
    return content_tokens(answer) or set(stemmed_tokens(answer))


def _adds(pieces: Sequence[set[str]], about: Sequence[str], turn: str, same_session: bool) -> bool:
    """Whether a missed evidence turn could have added what the answer needs: a gold part's words (``pieces``) it
    holds that no one line about the question holds together ("gaming" in a tournament line, "courses" in a cooking
    one do not state "game design course"); a turn with none of the gold's words adds nothing when an evidence turn
    of its session (its date) reached the reader, and may otherwise (a bridge hop, a photo, a paraphrase)."""
    held = [w for w in (p & line_words(turn) for p in pieces) if w]
    if held:
        return any(not any(w <= line_words(x) for x in about) for w in held)
    return not same_session


def _reached(ev: QuestionEvidence, pieces: Sequence[set[str]], gold: set[str], evs: set[str], lines: Sequence[str],
             wordless_near: bool = False) -> tuple[list[str], list[str]]:
    """(evidence ids reached, ids reached in part): the module doc, `memlab.eval.ceiling.reached`."""
    own = {s: [str(m["text"]) for m in ev.memories if m["id"] in ev.context_ids and s in m["source_ids"]] for s in evs}
    turn_of = {t.id: t.text for t in ev.turns}
    for s in evs - set(turn_of):  # no turn text of its own: its memories' gold words, else all the turns' text
        mine = " ".join(own[s])
        turn_of[s] = mine if gold & line_words(mine) else ev.turn_text
    facts = {s: [w for w in (q & line_words(turn_of[s]) for q in pieces) if w] for s in evs}
    full, part = reached(facts, own, lines, ev.context_sources, wordless_near=wordless_near)
    return sorted(full), sorted(part)


def _supported_people(ev: QuestionEvidence, question: str, answer: str, lines: Sequence[str],
                      about: Sequence[bool]) -> tuple[list[str], list[str]]:
    """(people asked together, those whose own lines about the question hold half the gold's words)."""
    people = jointly_asked(question, ev.speakers)
    gold = _content(POLARITY.sub("", answer)) - content_tokens(" ".join(ev.speakers))  # "Evan and Sam use ..."
    held = [p for p in people if gold and 2 * len(gold & {t for line, a in zip(lines, about) if a
                                                   and line_subjects(line, ev.speakers) == {p}
                                                   for t in line_words(line)}) >= len(gold)]
    return people, held


def label_question(ev: QuestionEvidence) -> tuple[str, str]:
    """(label, reason) for one failed question, by the ordered rules of the module doc."""
    row = ev.row
    evidence = as_list(row.get("evidence"))
    raw = as_list(row.get("evidence_raw")) or evidence
    cat = int(row["category"])
    answer = str(row.get("answer") or "")
    question = str(row.get("question") or "")
    abstained = is_abstention(str(row.get("prediction") or ""))
    bigrams = ev.bigrams or (conversation_bigrams(x for xs in ev.spoken.values() for x in xs) if ev.spoken
                             else frozenset())
    # 1. label-issue
    if row.get("errata") == INVALID:
        return "label-issue", "errata: the gold answer is marked invalid"
    if not evidence and cat != 5:  # a question to abstain on may have none (LongMemEval's *_abs; LoCoMo has none)
        return "label-issue", "no valid evidence id"
    unusable = [r for r in raw if r not in evidence and not set(recover_evidence_ids(str(r))) & set(evidence)]
    if unusable:
        return "label-issue", f"evidence ids that name no turn {sorted(unusable)}"
    if cat != 5:
        why = gold_issue(answer, str(row.get("prediction") or ""), question, cat, ev.turns, ev.speakers, ev.spoken,
                         ev.said, bigrams, F1_THRESHOLD)
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
    if ev.context is not None:
        lines, sources = list(ev.context), ev.context_sources
    else:
        shown = [m for m in ev.memories if m["id"] in ev.context_ids]
        lines, sources = [str(m["text"]) for m in shown], [list(m["source_ids"]) for m in shown]
        ev = replace(ev, context_sources=sources)
    asked = Asked(question, tuple(evidence), tuple(ev.speakers), bigrams)
    ceiling = ev.ceiling if ev.ceiling is not None else answer_ceiling(answer, cat, lines, sources, asked)
    bearing = (ev.bearing if ev.bearing is not None else answer_bearing(answer, cat, lines, sources, asked)) == 1.0
    about = _about(lines, sources, asked, answer)
    f1 = _num(row.get("f1"))
    ctx = f"ceiling {ceiling:.2f}"
    evs = set(evidence)
    matched = deglue(answer, bigrams)  # the gold's words as a text can hold them
    stated = POLARITY.sub("", matched)  # the answer's words a turn can state ("" for a bare yes/no)
    gold = _content(stated) if stated.strip() else set()
    turn_of = {t.id: t.text for t in ev.turns}
    date_of = {t.id: t.date for t in ev.turns}
    redundant: list[str] = []
    written = sorted({s for m in ev.memories for s in m["source_ids"] if s in evs})
    kind = answer_kind(answer, cat)
    pieces = [_content(p) & gold for p in re.split(r"[,;]", stated)]  # the gold's words per list item
    turn_cov = coverage(stated, ev.turn_text)
    inferred = kind == "inferred" and turn_cov < COVERAGE  # its words are not in its evidence turns
    reached, partly = _reached(ev, pieces, gold, evs, lines, kind == "date" or inferred)  # wordless: by neighbour too
    # an inferred answer is supported by any sufficient part of its evidence: a reached turn leaves it to the reader
    supported = inferred and bool(reached)
    if not bearing and not supported:
        mem_cov = coverage(matched, " ".join(m["text"] for m in ev.memories))  # multi-hop: answers span memories
        lost = not ev.memories or (turn_cov >= COVERAGE and mem_cov < COVERAGE)
        # 4. reconcile-loss
        if lost:
            for p in ev.proposals:
                rec = p.get("reconcile") or {}
                carried = coverage(matched, str(p.get("text") or "")) >= COVERAGE
                if p.get("result") == "skipped" and (carried or not ev.memories):
                    return "reconcile-loss", (f"reconcile skipped an evidence proposal as a duplicate of "
                                              f"{p.get('memory_id')} (score {_fmt(rec.get('score'))}, Jaccard "
                                              f"{_fmt(rec.get('jaccard'))}): {str(p.get('text'))[:80]!r}")
                if (p.get("result") == "updated" and rec.get("tier") == "update" and rec.get("rewritten")
                        and carried and coverage(matched, str(ev.memory_text.get(p.get("memory_id") or "", "")))
                        < COVERAGE):
                    return "reconcile-loss", (f"reconcile merged an evidence proposal into {p.get('memory_id')}, "
                                              f"whose final text lost the answer")
            # 5. write-miss
            if not ev.memories:
                return "write-miss", "no stored memory is sourced from the evidence"
            return "write-miss", f"answer lost in extraction (turns cover {turn_cov:.2f}, memories {mem_cov:.2f})"
        # 6. retrieval-miss (a multi-hop part, or one person's support, that reached the reader through another
        # turn still counts; a date's comma parts are no parts: any line of 2022 holds the "2022" of "25 May, 2022")
        parts = [p.strip() for p in matched.split(",") if p.strip()] if cat == 1 and kind != "date" else []
        have = {t for line, a in zip(lines, about) if a for t in line_words(line)}
        carried = [p for p in parts if len(parts) > 1 and len(_content(p) & have) >= COVERAGE * len(_content(p))]
        people, held = _supported_people(ev, question, matched, lines, about)
        if not reached and not partly and (carried or held):
            what = carried or [f"{p}'s part" for p in held]
            return "partial-retrieval", (f"no evidence id reached, but the context carries {what} through other "
                                         f"turns; missed {_where(ev, written)} ({ctx})")
        if not reached and not partly:
            return "retrieval-miss", (f"{len(ev.memories)} evidence memories stored, none that holds the answer "
                                      f"given to the reader ({ctx}); {_where(ev, written)}")
        # 7. partial-retrieval, when a missed evidence turn could have added what the answer needs
        missed = [s for s in written if s not in reached]
        reached_dates = {t.date for t in ev.turns if t.id in reached and t.date is not None}
        lacking = set(people) - set(held)
        speaker_of = {t.id: t.speaker for t in ev.turns}
        needed = [s for s in missed if kind == "count" or s not in turn_of  # no turn text: it may have
                  or speaker_of.get(s) in lacking
                  or _adds(pieces, [x for x, a in zip(lines, about) if a], turn_of[s], date_of.get(s) in reached_dates)]
        if needed:
            got = ", ".join(reached) or "-", f" ({', '.join(partly)} in part)" if partly else ""
            return "partial-retrieval", f"reached {got[0]}{got[1]}; missed {_where(ev, needed)} ({ctx})"
        redundant = missed
    # 8. abstain-error (non-adversarial)
    where = ("the context supported every answer word" if bearing else
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
    judged = run_judged(tr)
    qs = rescored(tr.questions, errata)
    memories = tr.records("memories")  # shared with the HTML report's browser: read only
    mems_by_conv: dict[str, list[dict[str, Any]]] = {}
    for m in memories:
        mems_by_conv.setdefault(m["conversation"], []).append(m)
    text_of = {m["id"]: m["text"] for m in memories}
    line_of = {m["id"]: memory_line(m["text"], m.get("event_time")) for m in memories}
    ops_by_conv: dict[str, list[dict[str, Any]]] = {}
    for o in tr.records("extraction"):
        ops_by_conv.setdefault(o["conversation"], []).append(o)
    mems_citing, ops_citing = SourceIndex(mems_by_conv), SourceIndex(ops_by_conv)
    recovered = {c for c, ms in mems_by_conv.items() if any(m.get("provenance") == "recovered" for m in ms)}
    contexts = {qid: set(ids) for qid, ids in tr.contexts.items()}
    sources_of = {m["id"]: list(m["source_ids"]) for m in memories}
    rows, heard_of = [], {}
    for row in table_records(qs):
        if row.get("errata") != INVALID and not failed(row, threshold, judged):
            continue
        evidence = set(as_list(row.get("evidence")))
        conv = data[row["conversation_id"]]
        if conv.sample_id not in heard_of:  # the report's runs share it (keyed by the turns)
            heard_of[conv.sample_id] = conversation_words(tuple((t.speaker, t.searchable_text) for t in conv.turns))
        spoken, bigrams = heard_of[conv.sample_id]
        turns = [EvidenceTurn(e, (t := conv.turn_index[e]).speaker, t.searchable_text,
                              conv.session_by_index[t.session_index].date_time, turn_before(conv.turn_index, e))
                 for e in as_list(row.get("evidence")) if e in conv.turn_index]
        ev_text = " ".join(t.text for t in turns)
        ev_mems = mems_citing.citing(row["conversation_id"], evidence)
        props = ops_citing.citing(row["conversation_id"], evidence)
        shown = [i for i in tr.contexts.get(row["qid"], []) if i in line_of]
        cat = int(row["category"])
        asked = Asked(str(row["question"]), tuple(as_list(row.get("evidence"))), tuple(conv.speakers), bigrams)
        lines, sources = [line_of[i] for i in shown], [sources_of[i] for i in shown]
        ceiling, bearing = (answer_ceiling(row["answer"], cat, lines, sources, asked),
                            answer_bearing(row["answer"], cat, lines, sources, asked))
        ev = QuestionEvidence(row=row, memories=ev_mems, context_ids=contexts.get(row["qid"], set()),
                              turn_text=ev_text, proposals=props, memory_text=text_of, judged=judged,
                              ranks=tr.best_ranks(row["qid"]), depth=tr.rank_depth.get(row["qid"]),
                              context=lines, context_sources=sources, turns=turns, speakers=conv.speakers,
                              spoken=spoken, bigrams=bigrams,
                              ceiling=None if cat == 5 else ceiling, bearing=None if cat == 5 else bearing)
        label, reason = label_question(ev)
        rows.append({"qid": row["qid"], "conversation_id": row["conversation_id"], "category": cat,
                     "label": label, "reason": reason, "f1": row["f1"], "ceiling": ceiling, "bearing": bearing,
                     "question": row["question"], "answer": row["answer"], "prediction": row["prediction"],
                     # a black-box system's memories got their dialog ids by alignment (memlab.systems)
                     "provenance": "recovered" if row["conversation_id"] in recovered else "exact"})
    return pd.DataFrame(rows, columns=list(ATTRIBUTION_COLUMNS))


def attribution_table(att: pd.DataFrame) -> pd.DataFrame:
    """Counts per category (rows) and label (columns, in rule order), with totals."""
    t = pd.crosstab(att["category"], att["label"]).reindex(columns=list(LABELS), fill_value=0)
    t.loc["total"] = t.sum()
    t["failed"] = t.sum(axis=1)
    return t
