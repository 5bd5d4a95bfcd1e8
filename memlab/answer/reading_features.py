"""What the learned reader knows about a question and each candidate answer (`memlab.answer.learned`).

A question is typed by its wording (`question_type`: when / how many / who / where / yes-no / ...);
the answer type it expects is compared with each candidate's type (a number, a capitalised name, a
place after "in/at/to/from", a date or time phrase). A candidate is one sentence's *novel* words (the
extractive reader's span) or a *window* of them (a shorter span, since LoCoMo's golds are a few words),
or a temporal candidate's resolved date at day, month or year grain. `candidate_features` gives one
row per candidate in `FEATURE_NAMES` order; every feature is computed from the question, the context
the reader was given and the candidate alone (no gold, no category).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

import numpy as np

from memlab.answer.semantic import SEMANTIC_FEATURES
from memlab.data.locomo import format_day
from memlab.index.text import analyze

#: Question types, tested in this order on the lower-cased question (the first match wins).
QTYPES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("how_many", re.compile(r"\bhow (many|much)\b|\bhow old\b|\bnumber of\b")),
    ("how_long", re.compile(r"\bhow long\b|\bhow often\b|\bhow frequently\b")),
    ("when", re.compile(r"^\s*(when|what (year|month|date|day|time)|which (year|month|day|date)|in which (year|"
                        r"month))\b|\bwhen\b")),
    ("who", re.compile(r"^\s*(who|whom|whose)\b|\bwho\b")),
    ("where", re.compile(r"^\s*where\b|\bwhich (city|country|state|place|town)\b|\bwhere\b")),
    ("why", re.compile(r"^\s*why\b|\bwhy\b")),
    ("yes_no", re.compile(r"^\s*(is|are|was|were|do|does|did|has|have|had|can|could|will|would|should)\b|"
                          r"answer yes or no")),
    ("likely", re.compile(r"\b(likely|might|would|could|probably)\b")),
    ("how", re.compile(r"^\s*how\b")),
    ("which", re.compile(r"^\s*which\b")),
    ("what", re.compile(r"^\s*what\b|\bwhat\b")),
)
QTYPE_NAMES = tuple(n for n, _ in QTYPES) + ("other",)
_NUMBER_WORDS = frozenset("one two three four five six seven eight nine ten eleven twelve twice once thrice "
                          "dozen hundred thousand first second third couple few several".split())
_MONTHS = frozenset("january february march april may june july august september october november december".split())
_PLACE_PREP = re.compile(r"\b(in|at|to|from|near|visited|visit)\s+(?:the\s+)?[A-Z][a-z]+")
_CAP = re.compile(r"(?<![.!?]\s)(?<!^)\b[A-Z][a-z]+")
_DIGIT = re.compile(r"\d")
_YOU = re.compile(r"\b(you|your|you're|yours)\b", re.IGNORECASE)
#: Candidate kinds: the sentence's novel words, a window of them, a temporal date (day / month / year grain), a
#: window of the sentence's own words (``orig``: function words kept inside, as golds keep them).
KINDS = ("novel", "window", "date", "month", "year", "orig")

FEATURE_NAMES: tuple[str, ...] = (
    # the sentence-level features of `memlab.answer.extractive.FEATURES`
    "overlap", "memory", "agreement", "rank", "temporal_rank", "speaker", "date", "length", "phrase",
    # relative to the rest of the context
    "overlap_frac", "overlap_rel", "idf_overlap", "idf_rel", "rank_recip", "context_size",
    "sentence_pos", "quoted", "observation", "n_owners",
    # the question's and the sentence's minilm vectors (`memlab.answer.semantic`)
    *SEMANTIC_FEATURES,
    # the question
    *(f"q_{n}" for n in QTYPE_NAMES), "q_list", "q_people", "q_len", "q_plural",
    # the candidate
    *(f"kind_{n}" for n in KINDS), "words", "window_start", "window_end", "window_frac",
    "has_number", "has_cap", "has_place", "has_month", "type_match", "next_to_question", "cap_frac",
)
INDEX = {n: i for i, n in enumerate(FEATURE_NAMES)}


def question_type(question: str) -> str:
    low = question.lower()
    return next((n for n, p in QTYPES if p.search(low)), "other")


def question_row(question: str, list_question: bool, people: int) -> dict[str, float]:
    """The question's features (the same for every candidate of it)."""
    qt = question_type(question)
    toks = question.split()
    plural = any(t.lower().rstrip("?").endswith(("ies", "s")) and len(t) > 3 for t in toks[1:3])
    out = {f"q_{n}": float(n == qt) for n in QTYPE_NAMES}
    out.update(q_list=float(list_question), q_people=float(people), q_len=math.log2(1 + len(toks)),
               q_plural=float(plural))
    return out


def word_types(words: Sequence[str]) -> tuple[float, float, float, float]:
    """(has a number, has a capitalised word, share of capitalised words, has a month/year) of span words."""
    kinds = [_word_kind(w) for w in words]
    caps = sum(k[1] for k in kinds)
    return (float(any(k[0] for k in kinds)), float(caps > 0), caps / max(len(words), 1),
            float(any(k[2] for k in kinds)))


@lru_cache(maxsize=100_000)
def _word_kind(w: str) -> tuple[bool, bool, bool]:
    """(a number, capitalised, a month or year) of one word (cached: the same words are cut into many spans)."""
    core = w.strip(".,!?;:")
    return (bool(_DIGIT.search(w)) or w.lower().strip(".,!?;:") in _NUMBER_WORDS, w[:1].isupper(),
            core.lower() in _MONTHS or bool(re.fullmatch(r"(19|20)\d\d", core)))


def type_match(qtype: str, has_number: float, has_cap: float, has_place: float, has_month: float,
               kind: str) -> float:
    """1 when the candidate is of the type the question asks for."""
    if qtype == "when":
        return float(kind in ("date", "month", "year"))
    if qtype in ("how_many", "how_long"):
        return has_number
    if qtype == "who":
        return has_cap
    if qtype == "where":
        return max(has_place, has_cap)
    return 0.0


def windows(novel: Sequence[str], longest: int) -> list[tuple[int, int]]:
    """The contiguous runs of a sentence's novel words, 1 to ``longest`` words long (the whole run apart)."""
    n = len(novel)
    return [(i, j) for i in range(n) for j in range(i + 1, min(n, i + longest) + 1) if (i, j) != (0, n)]


#: Words a span of the sentence's own words does not start or end on (articles, conjunctions, prepositions,
#: auxiliaries, pronouns that open a clause): the trimmed edges of an ``orig`` window.
EDGE_STOP = frozenset("""a an the and or but so to of in on at for with by from as that which who whom whose than
then if because while when is am are was were be been being do does did have has had will would can could should
i you he she it we they me him us them my your its our their this these those there here it's i'm i've that's
really very just also too not no yes oh well""".split())


def original_windows(words_all: Sequence[str], novel_at: Sequence[int], question_at: Sequence[int],
                     longest: int) -> list[tuple[int, int]]:
    """Runs ``a:b`` of a sentence's own words, 1 to ``longest`` long, that hold a novel word (``novel_at``: their
    places), start and end on a word outside `EDGE_STOP` and the question's words (``question_at``), and are not
    a run of novel words alone (those are ``window`` candidates already)."""
    novel, asked = set(novel_at), set(question_at)
    ok = [i not in asked and w.strip(".,!?;:\"'()").lower() not in EDGE_STOP and any(c.isalnum() for c in w)
          for i, w in enumerate(words_all)]
    out = []
    for a in range(len(words_all)):
        if not ok[a]:
            continue
        for b in range(a + 1, min(len(words_all), a + longest) + 1):
            inside = range(a, b)
            if ok[b - 1] and any(i in novel for i in inside) and not all(i in novel for i in inside):
                out.append((a, b))
    return out


def date_grains(answer: str, phrase: str | None, when: datetime) -> list[tuple[str, str]]:
    """(kind, answer) of a temporal candidate: its resolved date and, without a relative phrase, the month
    and year it falls in (a "which year" gold is "2022", a "when" gold often "May 2023")."""
    out = [("date", answer)]
    if phrase is None and answer == format_day(when):
        out += [("month", when.strftime("%B %Y")), ("year", str(when.year))]
    return out


def idf_table(texts: Sequence[str]) -> dict[str, float]:
    """Inverse document frequency of each stem over the context's memories (rarer = more telling)."""
    df: dict[str, int] = {}
    for t in texts:
        for s in set(analyze(t)):
            df[s] = df.get(s, 0) + 1
    n = len(texts)
    return {s: math.log((1 + n) / (1 + d)) + 1.0 for s, d in df.items()}


def stack(rows: list[dict[str, float]]) -> np.ndarray:
    """Rows of named features -> an array in `FEATURE_NAMES` order (a name missing from a row is 0)."""
    X = np.zeros((len(rows), len(FEATURE_NAMES)))
    for i, r in enumerate(rows):
        for k, v in r.items():
            X[i, INDEX[k]] = v
    return X


#: The context abstain features read from the semantic columns (0 in a family fit without them).
SEMANTIC_ABSTAIN = ("sem_own", "sem_other", "sem_gap")
CONTEXT_ABSTAIN = ("ov_own", "ov_other", "ov_gap", "top_own_share", "own_you", "own_names_other",
                   "other_names_asked", *SEMANTIC_ABSTAIN)


def context_abstain(r: Any, sents: Sequence[Any], top: int = 5) -> dict[str, float]:
    """Whose words match the question best (IDF-weighted overlap of each sentence with the question): the named
    person's (``ov_own``) or another's (``ov_other``), the share of the ``top`` best-matching sentences the named
    person owns, and whether the named person's best-matching sentences speak to someone (``own_you``), name
    another person (``own_names_other``), or the others' best sentence names the person asked about; ``sem_*``: the
    same ownership test by minilm similarity (whose sentence *means* what the question asks)."""
    per: dict[int, float] = {}
    sem: dict[int, float] = {}
    for s in sents:
        per[s.parent] = max(per.get(s.parent, 0.0), float(s.row[INDEX["idf_overlap"]]))
        sem[s.parent] = float(s.row[INDEX["sem"]])
    order = sorted(per, key=lambda i: -per[i])
    own = [i for i in order if r.people & r.candidates[i].owners]
    other = [i for i in order if not r.people & r.candidates[i].owners]
    ov_own = per[own[0]] if own else 0.0
    ov_other = per[other[0]] if other else 0.0
    asked = {p.split()[0] for p in r.people}
    others = {p.split()[0] for i in order for p in r.candidates[i].owners} - asked
    mine = [r.candidates[i].text for i in own[:3]]
    sem_own = max((sem[i] for i in own), default=0.0)
    sem_other = max((sem[i] for i in other), default=0.0)
    return dict(ov_own=ov_own, ov_other=ov_other, ov_gap=ov_other - ov_own, sem_own=sem_own, sem_other=sem_other,
                sem_gap=sem_other - sem_own,
                top_own_share=len([i for i in order[:top] if i in set(own)]) / max(min(top, len(order)), 1),
                own_you=sum(bool(_YOU.search(t)) for t in mine) / max(len(mine), 1),
                own_names_other=sum(any(o in t.split() or f"{o}'s" in t for o in others) for t in mine)
                / max(len(mine), 1),
                other_names_asked=float(bool(other) and any(a in r.candidates[other[0]].text for a in asked)))
