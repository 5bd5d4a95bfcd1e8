"""The offline reader: builds a short answer from the whole retrieved context, no model.

Rules, in order (each answer records which one fired, and the rank it used, in ``Answer.rule``):

1. *abstain* ("Not mentioned in the conversation.") when nothing is retrieved, or when the question
   names a conversation participant and none of the top ``speaker_window`` memories is that
   person's (the adversarial questions of LoCoMo ask about the wrong person);
2. *temporal* questions ("When ...", "What year ...") are answered from the dated memory, among all
   top-k, with the best score = question overlap + ``phrase_bonus`` if its own words carry a time
   phrase (resolved against its date, `memlab.answer.temporal`) - ``temporal_rank_weight * log2(rank)``;
3. otherwise the *span*: every sentence (``split="sentence"``; or comma/conjunction clause) of every
   retrieved memory is a candidate, scored by its overlap with the question (stemmed content
   words) - ``rank_weight * log2(rank)``; candidates that add no word to the question are skipped.
   The answer is the best candidate minus the words the question already says, stop words and
   filler words (``span="novel"``), or the whole clause (``span="clause"``), or the whole top memory
   (``span="memory"``, the top-1 baseline). A list question ("What activities has ...") joins the
   best candidates of up to ``list_spans`` different memories with commas.

Since every top-k memory is a candidate, k changes what the reader answers (the earlier reader read
only the top-1 memory for spans and the top-3 for dates, so top-k gave the same answers at every k).
Defaults measured on LoCoMo-10 (offline config, k = 10, overall 1-4 F1; the top-1/top-3 reader: 0.222):
rank_weight 1 / 2 / 3 -> 0.220 / 0.222 / 0.223 (temporal_rank_weight 1, phrase_bonus 4, list_spans 3);
phrase_bonus 2 instead of 4 -> 0.215; list_spans 1 (no lists) -> 0.220 at rank_weight 1.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from memlab.answer.base import ABSTAIN, ANSWERERS, Answer, AnswerContext, Answerer, retrieve
from memlab.answer.temporal import is_temporal_question, resolve
from memlab.data.locomo import Question
from memlab.index.text import STOP_WORDS, analyze, stem, words
from memlab.llm import count_tokens
from memlab.memory.entry import MemoryEntry

SPANS = ("novel", "clause", "memory")
_CONTEXT = re.compile(r"\s\((?:replying to|answered by) [^:]+: .*$", re.DOTALL)
_CLAUSE = re.compile(r"(?<=[.!?;,])\s+|\s+(?:and|but|so|because)\s+", re.IGNORECASE)
_SENTENCE = re.compile(r"(?<=[.!?;])\s+")
#: Words that carry no answer: dropped from spans (hedges, intensifiers, time fillers).
FILLER = frozenset("""really recently especially also just so very actually always definitely currently still
even lately pretty super totally quite already finally named called like""".split())
_PHOTO = re.compile(r"\s*\[shared a photo: [^\]]*\]")


def own_text(entry: MemoryEntry) -> str:
    """A memory's own words: speaker prefix and quoted neighbouring turns removed."""
    text = _CONTEXT.sub("", entry.text)
    for p in entry.participants:
        if text.startswith(f"{p}: "):
            text = text[len(p) + 2:]
    return text.strip()


def named_people(question: str, people: tuple[str, ...]) -> set[str]:
    ws = set(words(question))
    return {p for p in people if p.lower().split()[0] in ws}


#: A question asking for several things ("What activities has ...", "What kinds of ...", "Which cities ...").
LIST_QUESTION = re.compile(
    r"^\s*(?:what|which)\s+(?:(?:kinds?|types?|sorts?)\s+of\s+)?(?!is\b|was\b|does\b|has\b|this\b)"
    r"(\w+(?:ies|[^s'\W]s))\s+(?:has|have|does|do|did|are|were)\b"
    r"|\bin what ways\b",
    re.IGNORECASE,
)


def is_list_question(question: str) -> bool:
    return bool(LIST_QUESTION.search(question))


@ANSWERERS.register("extractive")
class ExtractiveAnswerer(Answerer):
    """The offline reader over the whole retrieved context (every top-k memory is a candidate).

    Each candidate (a sentence of a memory, or a dated memory for a time question) is scored by its
    overlap with the question's stemmed content words minus ``rank_weight * log2(rank)``: a lower-
    ranked memory wins only when it matches the question clearly better, so k changes the answer
    where a deeper memory matches better, and top-1 is recovered at ``rank_weight`` -> infinity.
    Span candidates with no word the question does not already say are skipped (they cannot answer).
    A list question (`is_list_question`) joins the best spans of up to ``list_spans`` different
    memories with commas. ``span_window`` / ``temporal_window`` cap the ranks considered (None: all).
    """

    name = "extractive"

    @classmethod
    def from_config(cls, section: Any, client_for: Callable[[str], Any]) -> Answerer:
        return cls(span=section.span, abstain=section.abstain, speaker_window=section.speaker_window,
                   temporal_window=section.temporal_window, span_window=section.span_window,
                   max_words=section.max_words, split=section.split, drop_filler=section.drop_filler,
                   rank_weight=section.rank_weight, list_spans=section.list_spans, phrase_bonus=section.phrase_bonus,
                   temporal_rank_weight=section.temporal_rank_weight)

    def __init__(self, span: str = "novel", abstain: bool = True, speaker_window: int = 1,
                 temporal_window: int | None = None, span_window: int | None = None, max_words: int = 12,
                 split: str = "sentence", drop_filler: bool = True, rank_weight: float = 3.0, list_spans: int = 3,
                 phrase_bonus: float = 4.0, temporal_rank_weight: float = 1.0):
        if span not in SPANS:
            raise ValueError(f"span: expected one of {SPANS}, got {span!r}")
        if rank_weight < 0:
            raise ValueError(f"rank_weight: expected >= 0, got {rank_weight!r}")
        self.span = span
        self.abstain = abstain
        self.speaker_window = speaker_window
        self.temporal_window = temporal_window
        self.span_window = span_window
        self.max_words = max_words
        self.split = split
        self.drop_filler = drop_filler
        self.rank_weight = rank_weight
        self.list_spans = list_spans
        self.phrase_bonus = phrase_bonus
        self.temporal_rank_weight = temporal_rank_weight

    def _rank_penalty(self, rank: int, weight: float | None = None) -> float:
        return (self.rank_weight if weight is None else weight) * math.log2(max(rank, 1))

    def _novel(self, clause: str, qstems: set[str]) -> list[str]:
        return [w for w in clause.split() if (core := w.strip(".,!?;:\"'()").lower())
                and core not in STOP_WORDS and stem(core.split("'")[0]) not in qstems
                and not (self.drop_filler and core in FILLER)]

    def answer(self, question: Question, ctx: AnswerContext) -> Answer:
        res, trace = retrieve(ctx, question.question)
        hits = res.hits
        ans = Answer(prediction=ABSTAIN, context=res.entries, queries=[trace])
        ans.context_tokens = count_tokens("\n".join(e.text for e in res.entries) + "\n" + question.question)
        if not hits:
            ans.rule = "abstain: no memory retrieved"
            return ans
        people = named_people(question.question, ctx.conversation.speakers)
        if self.abstain and people:
            top = [h.entry for h in hits[: self.speaker_window]]
            if ctx.search.participant_boost:  # judge the premise on a search that does not favour the name
                plain, _ = retrieve(ctx, question.question, participant_boost=False)
                top = plain.entries[: self.speaker_window]
            if not any(people & set(e.participants) for e in top):
                ans.rule = f"abstain: top memory is not {'/'.join(sorted(people))}'s"
                return ans
        qstems = set(analyze(question.question))
        if self.span != "memory" and is_temporal_question(question.question):
            best_t: tuple[float, str, str] | None = None
            for h in hits[: self.temporal_window]:
                if h.entry.event_time is None:
                    continue
                text, phrase = resolve(own_text(h.entry), h.entry.event_time)
                score = len(qstems & set(analyze(own_text(h.entry)))) + (self.phrase_bonus if phrase else 0.0)
                score -= self._rank_penalty(h.rank, self.temporal_rank_weight)
                if best_t is None or score > best_t[0]:
                    how = f"'{phrase}'" if phrase else "date"
                    best_t = (score, text, f"temporal: {how} at rank {h.rank}")
            if best_t is not None:
                ans.prediction, ans.rule = best_t[1], best_t[2]
                return ans
        if self.span == "memory":
            ans.prediction, ans.rule = own_text(hits[0].entry), "span: top memory"
            return ans
        splitter = _CLAUSE if self.split == "clause" else _SENTENCE
        cands: list[tuple[float, int, str, list[str]]] = []  # (score, rank, clause, novel words)
        for h in hits[: self.span_window]:
            for clause in splitter.split(_PHOTO.sub("", own_text(h.entry))):
                clause = clause.strip(" .!?;,")
                novel = self._novel(clause, qstems) if clause else []
                if not novel:
                    continue
                score = len(qstems & set(analyze(clause))) - self._rank_penalty(h.rank)
                cands.append((score, h.rank, clause, novel))
        if not cands:
            ans.prediction, ans.rule = own_text(hits[0].entry), "span: top memory (no clause adds a word)"
            return ans
        cands.sort(key=lambda c: (-c[0], c[1]))
        score, rank, clause, novel = cands[0]
        if self.span == "clause":
            ans.prediction = " ".join(clause.split()[: self.max_words])
            ans.rule = f"span: best clause (rank {rank})"
            return ans
        if self.list_spans > 1 and is_list_question(question.question):
            parts, ranks = [], []
            for _, r, _, nv in cands:
                if r in ranks:
                    continue
                parts.append(" ".join(nv[: self.max_words]))
                ranks.append(r)
                if len(parts) == self.list_spans:
                    break
            ans.prediction = ", ".join(parts)
            ans.rule = f"span: list of the best clauses (ranks {', '.join(map(str, ranks))})"
            return ans
        ans.prediction = " ".join(novel[: self.max_words])
        ans.rule = f"span: novel words of the best clause (rank {rank})"
        return ans
