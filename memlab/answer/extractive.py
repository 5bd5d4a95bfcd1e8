"""The offline reader: builds a short answer from the whole retrieved context, no model.

Two scorers choose among the candidates read here: ``scorer="weights"`` (the default) is the hand-weighted
score described below; ``scorer="learned"`` hands them to the fitted model of `memlab.answer.learned` (a
candidate's official F1 predicted from the features of `memlab.answer.reading_features`, shorter spans,
multi-part composition, a learned abstain rule; one model per ``reader_family`` of context). Held out by
conversation it beats the weights on categories 1-4 at k = 10 but lets category 5 fall below 0.583 at k = 20
and 40, and its minilm question encode costs ~20 ms CPU per question (issue 36; docs/benchmarks/reader.md), so
it is opt-in; so is reading the observations that cite each retrieved turn (``context_citing``), with which the
``retrieval-best`` family is fit (the hand weights on those contexts let category 5 fall below 0.583).

Every retrieved memory is read. A memory is cut into *segments*, each with its owner: a turn memory
("Bob: ... (replying to Ann: ...)") gives Bob's own words and Ann's quoted words; another memory
(an observation) is owned by its participants. Each sentence (``split="sentence"``; or clause) of
each segment that adds a word to the question is a *candidate*; a *temporal* question ("When ...")
has one candidate per dated segment instead, its answer the date or the time phrase resolved against
it (`memlab.answer.temporal`). A candidate's score is a weighted sum of its features (`FEATURES`):

- ``overlap``: question terms (stemmed content words) in the candidate (weight 1, the scale);
- ``memory``: question terms elsewhere in the memory the candidate came from;
- ``agreement``: how many *other* retrieved memories that share a question term also carry the
  candidate's answer words (support across the context, weighted by their question coverage);
- ``rank``: log2 of the memory's retrieval rank (``rank_weight``, or ``temporal_rank_weight``);
- ``speaker``: 1 when the segment's owner is a person the question names;
- ``date``: 1 when the question names a year or month and the memory is dated in it;
- ``length``: log2(1 + answer words); ``phrase``: 1 when a temporal candidate has a time phrase.

Abstain ("Not mentioned in the conversation.") when nothing is retrieved, or — the adversarial
questions of LoCoMo ask about the wrong person — when the question names a participant and the
best candidate that person owns scores more than ``abstain_margin`` below the best candidate
overall (scores without the speaker feature), or that person owns none. Only the context given is
read; what was read (candidates, owners, scores, the abstain test) is returned in ``Answer.reading``.

The answer is the best candidate's words minus those the question already says, stop words and
filler (``span="novel"``), or the whole clause (``span="clause"``), or the whole top memory
(``span="memory"``, the top-1 baseline). A list question ("What activities has ...") joins the
best candidates of up to ``list_spans`` different memories with commas.

Weights default to `memlab.answer.reader_weights`, fit by ``benchmarks/fit_reader.py`` with
leave-conversations-out cross-validation on LoCoMo-10 (its held-out figures are in that module).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import Annotated, Any

import numpy as np

from memlab.answer.base import ABSTAIN, ANSWERERS, Answer, AnswerContext, Answerer, retrieve, retrieve_citing
from memlab.answer.learned import FAMILIES, choose_learned, family_model
from memlab.answer.reader_weights import WEIGHTS
from memlab.answer.semantic import shared
from memlab.answer.temporal import is_temporal_question, resolve
from memlab.data.locomo import Question
from memlab.index.embedders import MiniLMEmbedder
from memlab.index.text import analyze, stem, stop_words, words
from memlab.llm import count_tokens
from memlab.memory.entry import MemoryEntry
from memlab.params import OneOf, Range, check_params

SPANS = ("novel", "clause", "memory")
#: How candidates are scored: the fitted model of `memlab.answer.learned`, or the hand-set weights below.
SCORERS = ("learned", "weights")
#: How a memory is cut into candidate segments: at sentence ends, or at clause boundaries too.
SPLITS = ("sentence", "clause")
_QUOTE = re.compile(r"\s\((replying to|answered by) ([^:]+): (.*)\)\s*$", re.DOTALL)
_CONTEXT = re.compile(r"\s\((?:replying to|answered by) [^:]+: .*$", re.DOTALL)
_CLAUSE = re.compile(r"(?<=[.!?;,])\s+|\s+(?:and|but|so|because)\s+", re.IGNORECASE)
_SENTENCE = re.compile(r"(?<=[.!?;])\s+")
#: Words that carry no answer: dropped from spans (hedges, intensifiers, time fillers).
FILLER = frozenset("""really recently especially also just so very actually always definitely currently still
even lately pretty super totally quite already finally named called like""".split())
_PHOTO = re.compile(r"\s*\[shared a photo: [^\]]*\]")
_MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
           "november", "december")
_YEAR = re.compile(r"\b(19|20)\d\d\b")
#: Candidate features, in the order of `Candidate.features` (the fit script reads this order).
FEATURES = ("overlap", "memory", "agreement", "rank", "temporal_rank", "speaker", "date", "length", "phrase")
#: The weight of each feature: a constructor parameter (``overlap`` is the scale, fixed at 1).
WEIGHT_OF = {"memory": "memory_weight", "agreement": "agreement_weight", "rank": "rank_weight",
             "temporal_rank": "temporal_rank_weight", "speaker": "speaker_weight", "date": "date_weight",
             "length": "length_weight", "phrase": "phrase_bonus"}
PENALTIES = ("rank", "temporal_rank")
"""Features subtracted (a deeper rank lowers the score): their weights are >= 0."""


def own_text(entry: MemoryEntry) -> str:
    """A memory's own words: speaker prefix and quoted neighbouring turns removed."""
    text = _CONTEXT.sub("", entry.text)
    for p in entry.participants:
        if text.startswith(f"{p}: "):
            text = text[len(p) + 2:]
    return text.strip()


def segments(entry: MemoryEntry) -> list[tuple[str, frozenset[str]]]:
    """(text, owners) of each part of a memory: a turn's own words (its speaker's) and the neighbouring
    turn it quotes (that turn's speaker's); any other memory is one segment owned by its participants."""
    text = entry.text
    out: list[tuple[str, frozenset[str]]] = []
    m = _QUOTE.search(text)
    quoted = None
    if m:
        quoted = (m.group(3).strip(), frozenset({m.group(2).strip()}))
        text = text[: m.start()]
    speaker = next((p for p in entry.participants if text.startswith(f"{p}: ")), None)
    if speaker is not None:
        out.append((text[len(speaker) + 2:].strip(), frozenset({speaker})))
    else:
        out.append((text.strip(), frozenset(entry.participants)))
    if quoted is not None and quoted[0]:
        out.append(quoted)
    return out


@lru_cache(maxsize=200_000)
def _word_stems(clause: str) -> tuple[tuple[str, str | None, bool], ...]:
    """Each whitespace word of a clause with the stem `ExtractiveAnswerer.novel_words` compares with the question
    (None: no content, or a stop word: never novel) and whether it is filler. The same memory clauses are read
    for many questions, so this is worked out once per clause text."""
    stops = stop_words()
    out = []
    for w in clause.split():
        core = w.strip(".,!?;:\"'()").lower()
        st = stem(core.split("'")[0]) if core and core not in stops else None
        out.append((w, st, core in FILLER))
    return tuple(out)


@lru_cache(maxsize=200_000)
def _stem_set(text: str) -> frozenset[str]:
    """The set of `analyze` stems of a text (a memory's, read for every question it is retrieved for)."""
    return frozenset(analyze(text))


@lru_cache(maxsize=200_000)
def _split(text: str, splitter: re.Pattern[str]) -> tuple[str, ...]:
    """A segment cut into sentences or clauses, each stripped of edge punctuation (cached per segment text)."""
    return tuple(c.strip(" .!?;,") for c in splitter.split(text))


def named_people(question: str, people: Sequence[str]) -> set[str]:
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


def _dates_named(question: str) -> tuple[set[int], set[int]]:
    """The years and month numbers a question names."""
    low = question.lower()
    return ({int(y.group(0)) for y in _YEAR.finditer(low)},
            {i + 1 for i, mo in enumerate(_MONTHS) if re.search(rf"\b{mo}\b", low)})


def _date_fit(named: tuple[set[int], set[int]], when: datetime | None) -> float:
    """1 when the question names a year or month (``named``) and the memory is dated in it (0 without a date)."""
    years, months = named
    if when is None or (not years and not months):
        return 0.0
    return float((not years or when.year in years) and (not months or when.month in months))


@dataclass
class Candidate:
    """One possible answer read from the context, with the features that score it."""

    rank: int
    owners: frozenset[str]
    text: str
    """The sentence (or clause, or dated segment) the answer comes from."""
    answer: str
    """What the reader would say: novel words, the clause, or the resolved date."""
    novel: list[str]
    features: np.ndarray
    kind: str = "span"
    """``span`` or ``temporal`` (``temporal: '<phrase>'`` / ``temporal: date`` in the rule)."""
    phrase: str | None = None
    segment: int = 0
    """Which segment of its memory (0: the memory's own words; 1: the turn it quotes)."""
    position: int = 0
    """The sentence's place in its segment (0: the first)."""
    when: datetime | None = None
    memory_kind: str = ""


@dataclass
class Reading:
    """Everything the reader drew from one question's context (what `ExtractiveAnswerer.choose` decides on)."""

    question: str
    people: set[str]
    temporal: bool
    list_question: bool
    candidates: list[Candidate] = field(default_factory=list)
    top_memory: str = ""
    """The top memory's own words (the ``span="memory"`` answer and the fallback when no candidate adds a word)."""
    memories: int = 0
    """How many memories the context held."""


@ANSWERERS.register("extractive")
class ExtractiveAnswerer(Answerer):
    """The offline reader over the whole retrieved context (see the module docstring for the rules).

    Every weight is a constructor parameter; None takes the fitted default
    (`memlab.answer.reader_weights.WEIGHTS`). ``span_window`` / ``temporal_window`` cap the ranks
    read (None: all); ``abstain=False`` never abstains on a named person. ``context_citing``: after each
    retrieved dialog turn the reader also reads the notes (observations) citing it, at the turn's rank
    (`memlab.answer.base.with_citing`: a turn-unit search, ``retrieval.unit: turn``, ranks turns only); the
    context the run records and counts tokens of holds them.
    """

    name = "extractive"

    def __init__(self, span: Annotated[str, OneOf(SPANS)] = "novel", abstain: bool = True,
                 temporal_window: Annotated[int | None, Range(1)] = None,
                 span_window: Annotated[int | None, Range(1)] = None, max_words: Annotated[int, Range(1)] = 12,
                 split: Annotated[str, OneOf(SPLITS)] = "sentence", drop_filler: bool = True,
                 list_spans: Annotated[int, Range(1)] = 3, rank_weight: Annotated[float | None, Range(0)] = None,
                 memory_weight: Annotated[float | None, Range()] = None,
                 agreement_weight: Annotated[float | None, Range()] = None,
                 speaker_weight: Annotated[float | None, Range()] = None,
                 date_weight: Annotated[float | None, Range()] = None,
                 length_weight: Annotated[float | None, Range()] = None,
                 phrase_bonus: Annotated[float | None, Range()] = None,
                 temporal_rank_weight: Annotated[float | None, Range(0)] = None,
                 abstain_margin: Annotated[float | None, Range()] = None,
                 scorer: Annotated[str, OneOf(SCORERS)] = "weights",
                 reader_family: Annotated[str, OneOf(FAMILIES)] = "offline", context_citing: bool = False):
        check_params(ExtractiveAnswerer, {k: v for k, v in locals().items() if k != "self"}, "the extractive reader")
        self.scorer = scorer
        self.context_citing = context_citing
        self.reader_family = reader_family
        #: the fitted model of ``reader_family`` (`memlab.answer.learned`), loaded here so a bad family fails early
        self.model = family_model(reader_family) if scorer == "learned" and span == "novel" else None
        if self.model is not None and self.model.semantic:  # its forests read minilm similarity: fail here, not mid-run
            ok, why = MiniLMEmbedder.available()
            if not ok:
                raise RuntimeError(f"the learned reader's {reader_family!r} family reads minilm similarity: {why}")
        self.span = span
        self.abstain = abstain
        self.temporal_window = temporal_window
        self.span_window = span_window
        self.max_words = max_words
        self.split = split
        self.drop_filler = drop_filler
        self.list_spans = list_spans
        given = {"rank_weight": rank_weight, "memory_weight": memory_weight, "agreement_weight": agreement_weight,
                 "speaker_weight": speaker_weight, "date_weight": date_weight, "length_weight": length_weight,
                 "phrase_bonus": phrase_bonus, "temporal_rank_weight": temporal_rank_weight,
                 "abstain_margin": abstain_margin}
        for name, v in given.items():  # checked above, against the constraints declared beside each
            setattr(self, name, float(WEIGHTS[name] if v is None else v))

    @property
    def weights(self) -> dict[str, float]:
        """The weights in force, by parameter name."""
        return {k: getattr(self, k) for k in WEIGHTS}

    def weight_vector(self) -> np.ndarray:
        """Weights in `FEATURES` order, penalties negated (score = features @ vector)."""
        return np.array([1.0 if f == "overlap" else (-1.0 if f in PENALTIES else 1.0) * getattr(self, WEIGHT_OF[f])
                         for f in FEATURES])

    def novel_words(self, clause: str, qstems: set[str]) -> tuple[list[str], set[str]]:
        """The clause's words the question does not hold (stop words and, with ``drop_filler``, filler out) and
        their stems (the stems the ``agreement`` feature looks up)."""
        kept = [(w, st) for w, st, filler in _word_stems(clause)
                if st is not None and st not in qstems and not (self.drop_filler and filler)]
        return [w for w, _ in kept], {st for _, st in kept}

    # ------------------------------------------------------------------ reading: context -> candidates
    def read(self, question: str, hits: Sequence[tuple[int, MemoryEntry]], speakers: Sequence[str]) -> Reading:
        """The candidates of a question's context (``hits``: (rank, memory), best first); no weight is used."""
        temporal = self.span != "memory" and is_temporal_question(question)
        r = Reading(question=question, people=named_people(question, speakers), temporal=temporal,
                    list_question=self.list_spans > 1 and is_list_question(question))
        if not hits:
            return r
        r.memories = len(hits)
        r.top_memory = own_text(hits[0][1])
        if self.span == "memory":
            return r
        window = self.temporal_window if temporal else self.span_window
        r.candidates = self._candidates(question, list(hits[:window]), r, temporal)
        if temporal and not r.candidates:  # no dated memory: read it as any other question
            r.temporal = False
            r.candidates = self._candidates(question, list(hits[: self.span_window]), r, False)
        return r

    def _candidates(self, question: str, hits: list[tuple[int, MemoryEntry]], r: Reading,
                    temporal: bool) -> list[Candidate]:
        qstems = set(analyze(question))
        segs = [segments(e) for _, e in hits]
        mem_stems = [_stem_set(_PHOTO.sub("", " ".join(t for t, _ in sg))) for sg in segs]
        mem_q = [len(qstems & s) for s in mem_stems]
        nq = max(len(qstems), 1)
        holders: dict[str, list[int]] = {}  # stem -> the memories (sharing a question term) that carry it
        for j, s in enumerate(mem_stems):
            if mem_q[j]:
                for t in s:
                    holders.setdefault(t, []).append(j)
        named = _dates_named(question)
        splitter = _CLAUSE if self.split == "clause" else _SENTENCE
        out: list[Candidate] = []
        for i, (rank, e) in enumerate(hits):
            date = _date_fit(named, e.event_time)
            for si, (seg, owners) in enumerate(segs[i]):
                seg = _PHOTO.sub("", seg)
                if temporal:
                    if e.event_time is None:
                        continue
                    answer, phrase = resolve(seg, e.event_time)
                    parts = [(seg, answer, phrase)]
                else:
                    parts = [(c, "", None) for c in _split(seg, splitter)]
                for pos, (text, answer, phrase) in enumerate(parts):
                    novel, nstems = self.novel_words(text, qstems) if text else ([], set())
                    if not temporal and not novel:
                        continue
                    overlap = len(qstems & _stem_set(text))
                    others = sorted({j for t in nstems for j in holders.get(t, ()) if j != i})
                    agree = sum(mem_q[j] / nq for j in others)
                    feats = np.array([overlap, mem_q[i] - overlap, agree,
                                      0.0 if temporal else math.log2(max(rank, 1)),
                                      math.log2(max(rank, 1)) if temporal else 0.0,
                                      float(bool(r.people & owners)), date,
                                      0.0 if temporal else math.log2(1 + len(novel)), float(phrase is not None)])
                    where = {"segment": si, "position": pos, "when": e.event_time, "memory_kind": e.kind}
                    if temporal:
                        out.append(Candidate(rank, owners, text, answer, novel, feats, "temporal", phrase, **where))
                    else:
                        out.append(Candidate(rank, owners, text, " ".join(novel[: self.max_words]), novel, feats,
                                             **where))
        return out

    # ------------------------------------------------------------------ deciding: candidates -> answer
    def choose(self, r: Reading, k: int | None = None) -> tuple[str, str, dict[str, Any]]:
        """(prediction, rule, what was decided) from a `Reading` with this reader's scorer; ``k``: the context
        size asked for (the learned scorer's ``context_size`` feature; None: the memories read)."""
        info: dict[str, Any] = {"people": sorted(r.people)}
        if self.model is not None and r.candidates:
            return choose_learned(r, k if k is not None else r.memories, self.model, self.abstain, info)
        if self.span == "memory" or not r.candidates:
            if not r.top_memory:
                return ABSTAIN, "abstain: no memory retrieved", info
            if self.span == "memory":
                return r.top_memory, "span: top memory", info
            return r.top_memory, "span: top memory (no clause adds a word)", info
        w = self.weight_vector()
        F = np.stack([c.features for c in r.candidates])
        spk = FEATURES.index("speaker")
        content = F @ w - F[:, spk] * w[spk]
        score = content + F[:, spk] * w[spk]
        info["scores"] = score.tolist()
        if self.abstain and r.people:
            own = F[:, spk] > 0
            best = float(content.max())
            best_own = float(content[own].max()) if own.any() else None
            info["abstain_test"] = {"best": best, "best_owned": best_own, "margin": self.abstain_margin}
            if best_own is None or best - best_own > self.abstain_margin:
                who = "/".join(sorted(r.people))
                top = r.candidates[int(np.argmax(content))]
                why = (f"no candidate is {who}'s" if best_own is None else
                       f"the best candidate (rank {top.rank}, {'/'.join(sorted(top.owners)) or 'no owner'}'s) "
                       f"outscores {who}'s best by {best - best_own:.2f} > {self.abstain_margin:.2f}")
                return ABSTAIN, f"abstain: {why}", info
        order = np.argsort(-score, kind="stable")
        c = r.candidates[int(order[0])]
        info["chosen"] = int(order[0])
        if c.kind == "temporal":
            how = f"'{c.phrase}'" if c.phrase else "date"
            return c.answer, f"temporal: {how} at rank {c.rank}", info
        if self.span == "clause":
            return " ".join(c.text.split()[: self.max_words]), f"span: best clause (rank {c.rank})", info
        if r.list_question:
            parts, ranks = [], []
            for j in order:
                cj = r.candidates[int(j)]
                if cj.rank in ranks:
                    continue
                parts.append(cj.answer)
                ranks.append(cj.rank)
                if len(parts) == self.list_spans:
                    break
            return ", ".join(parts), f"span: list of the best clauses (ranks {', '.join(map(str, ranks))})", info
        return c.answer, f"span: novel words of the best clause (rank {c.rank})", info

    def prepare(self, questions: Sequence[str]) -> int:
        """A family reading minilm similarity encodes the batch's questions in one pass (3 ms CPU a question
        against 13 one at a time: `benchmarks/reader_cost.py`)."""
        return shared().prepare(questions) if self.model is not None and self.model.semantic else 0

    def answer(self, question: Question, ctx: AnswerContext) -> Answer:
        if self.context_citing:
            hits, trace = retrieve_citing(ctx, question.question)
        else:
            res, trace = retrieve(ctx, question.question)
            hits = [(h.rank, h.entry) for h in res.hits]
        context = [e for _, e in hits]
        ans = Answer(prediction=ABSTAIN, context=context, queries=[trace])
        ans.context_tokens = count_tokens("\n".join(e.text for e in context) + "\n" + question.question)
        r = self.read(question.question, hits, ctx.conversation.speakers)
        ans.prediction, ans.rule, info = self.choose(r, ctx.search.max_results)
        ans.reading = reading_trace(r, info)
        return ans


def reading_trace(r: Reading, info: dict[str, Any], limit: int = 5) -> dict[str, Any]:
    """What the reader read, for the answer trace: the people named, the abstain test, and the best
    ``limit`` candidates (rank, owners, text, answer, score, non-zero features) of the context it was given."""
    out: dict[str, Any] = {"people": info.get("people", []), "temporal": r.temporal, "list": r.list_question,
                           "candidates_read": len(r.candidates)}
    for key in ("abstain_test", "abstain_rule", "composed"):
        if key in info:
            out[key] = info[key]
    scores = info.get("scores")
    if scores:
        best = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:limit]
        out["top_candidates"] = [
            {"rank": r.candidates[i].rank, "owners": sorted(r.candidates[i].owners), "text": r.candidates[i].text[:160],
             "answer": r.candidates[i].answer, "score": round(scores[i], 3),
             "features": {f: round(float(v), 3) for f, v in zip(FEATURES, r.candidates[i].features) if v}}
            for i in best]
    return out
