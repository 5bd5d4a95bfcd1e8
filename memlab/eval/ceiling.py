"""Answer ceiling@k and answer-bearing@k: what retrieval put in front of the reader, whatever the reader
made of it (reader-independent; read beside evidence Recall@k and context tokens).

The *context* is the reader's memories, each as one *line* the way a reader sees it: the memory's event
date (``7 May 2023``, LoCoMo's answer format) then its text (`memory_line`). Lines are tokenised by the
official rule (`memlab.eval.scoring.stemmed_tokens`: commas, punctuation and a/an/the/and dropped,
Porter-stemmed).

- A **span** is any contiguous run of tokens of one line, ``tokens[i:j]``, of any length; a span never
  crosses two memories.
- A line is **about** the question (`about`, when the question is known: `Asked`) when it shares a content
  word of the question (not a function word, not a person's name, not the gold's words when the question
  offers them as a choice: "a beach or the mountains?"), or it comes
  from an evidence turn or a turn beside one in its session (``D3:6``-``D3:8`` for ``D3:7``: the neighbour
  often carries the same fact). A turn's words count, not those of the turn it replies to (``(replying to
  ...)``). When the question names a date ("on October 3, 2023", "in May 2023"), a line that is about it by its
  words must also be about that time: its date, or a date its own words imply ("yesterday" said on 4 October),
  within the date checks' slack (`memlab.eval.gold_checks.DATE_SLACK_DAYS`), or, for a month, in the month after
  it (`REPORTS_DAYS`: "has taken up photography" said on 17 November reports October). A line holding the gold's
  words by coincidence — "beach" in unrelated holiday pictures, a "yes" somewhere — is not about it. A line holds
  a hyphenated compound's words ("work-life" holds "work": `line_words`); its date stamp only for a date gold
  ("3 May 2023 ..." does not say the "3" of "How many dogs?": `stated_lines`). Without `Asked` every line counts.
- **Answer ceiling** — the best official LoCoMo F1 a prediction made of spans of lines about the question can
  score, i.e. what a perfect extractive reader of this context would get; a span credited for function words
  alone ("of" against a three-title gold) scores nothing. Categories 2 and 4: the best span; category 3:
  the same against the gold cut at its first ``;``; category 1 (the official comma split): one span per
  gold part, joined by commas — the mean over gold parts of each part's best span, which is exactly the
  best the official multi-hop F1 allows. A date part is also scored against the dates the lines imply (each
  line's date moved by its "yesterday", "last week" ...: `memlab.answer.temporal.resolve`; as a day, its month
  and its year), so the ceiling bounds a reader that computes dates too. Exact, not sampled: trimming a token
  that is not (or is an excess copy of) a gold token from either end of a span never lowers its F1, so only
  spans that start and end on gold tokens are tried (O(m·n) per line, m gold-token positions, n tokens).
- **Answer-bearing** (supported) — every content word of the gold (after the category-3 cut; a leading
  "yes"/"no" is never stated, it is inferred) occurs in the lines about the question; for a question about
  two people, also each person's own lines (a turn they said, or another line naming only them) hold at
  least half of those words: one person's volunteering does not support "both volunteer".

The **answer-bearing@k control** (``benchmarks/bearing_control.py``) is the same measure over a random context
of the same size drawn from the conversation's memories: how often the gold's words are supported by chance.
The definitions a hand labeller reads are the attribution guide's ("Failure labels"); these are their
computable form.

Category 5 has neither (NaN): its score is the abstention rule, not a span of the context. A gold answer
with no token left after normalisation has ceiling 0 and is not answer-bearing (no F1 above 0 exists).
Limit: both count literal words, and dates computed from a line's own date; an answer that must be counted or
inferred from the context is neither bearing nor above ceiling 0 even when a reasoning reader could derive it.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

from memlab.answer.temporal import fmt_month, resolve
from memlab.data.locomo import format_day
from memlab.eval.gold_checks import (
    POLARITY,
    answer_kind,
    asked_people,
    best_span_f1,
    content_tokens,
    conversation_bigrams,
    dates_agree,
    deglue,
    line_subjects,
    parse_date,
    period,
)
from memlab.eval.scoring import stemmed_tokens

#: Share of a gold's content words one person's lines must hold for a two-person question.
PERSON_SHARE = 0.5


@dataclass(frozen=True)
class Asked:
    """What makes a context line about a question (see the module doc): the question, its evidence dialog ids,
    the conversation's speakers (the people a question can be about) and word pairs for `deglue`."""

    question: str = ""
    evidence: tuple[str, ...] = ()
    speakers: tuple[str, ...] = ()
    bigrams: frozenset[str] = frozenset()


_BIGRAMS: dict[int, tuple[Any, frozenset[str]]] = {}


def asked_of(conv: Any, question: str, evidence: Iterable[str]) -> Asked:
    """`Asked` for a question of a loaded conversation (its word pairs computed once per conversation object)."""
    hit = _BIGRAMS.get(id(conv))
    if hit is None or hit[0] is not conv:
        if len(_BIGRAMS) > 64:
            _BIGRAMS.clear()
        hit = _BIGRAMS[id(conv)] = (conv, conversation_bigrams(t.searchable_text for t in conv.turns))
    return Asked(question, tuple(evidence), tuple(conv.speakers), hit[1])


@lru_cache(maxsize=32)
def conversation_words(turns: tuple[tuple[str, str], ...]) -> tuple[dict[str, list[str]], frozenset[str]]:
    """A conversation's (speaker, text) turns -> what each person says and its word pairs (what the gold checks
    read; its words, for a suggestion question only, `gold_issue` reads off the first); cached by the turns
    themselves, so the runs of one report share it (read only)."""
    spoken: dict[str, list[str]] = {}
    for speaker, text in turns:
        spoken.setdefault(speaker, []).append(text)
    return spoken, conversation_bigrams(x for xs in spoken.values() for x in xs)


_HYPHEN = re.compile(r"(?<=[A-Za-z])-(?=[A-Za-z])")


@lru_cache(maxsize=200_000)
def line_words(text: str) -> frozenset[str]:
    """The `content_tokens` a line or turn holds, a hyphenated compound's parts too: "work-life balance" holds
    "work" (the official normalisation glues it into "worklife"). Only a text's side: a gold's "self-care" stays
    one word to find."""
    mine = content_tokens(text)
    return mine | content_tokens(_HYPHEN.sub(" ", text)) if "-" in text else mine


def memory_line(text: str, event_time: Any = None) -> str:
    """One memory as the reader sees it: ``7 May 2023 <text>`` (no date when the memory has none).

    ``event_time`` may be a datetime, an ISO string (a trace's memories table) or None / NaN."""
    when = event_time
    if isinstance(when, str):
        try:
            when = datetime.fromisoformat(when)
        except ValueError:
            when = None
    if not isinstance(when, datetime):
        return str(text)
    return f"{format_day(when)} {text}"


def context_lines(entries: Iterable[Any]) -> list[str]:
    """`memory_line` of each memory (objects with ``text`` and ``event_time``, e.g. `MemoryEntry`)."""
    return [memory_line(e.text, getattr(e, "event_time", None)) for e in entries]


def gold_parts(answer: Any, category: int) -> list[str]:
    """The gold as the official metric splits it: category 1 at commas, category 3 cut at its first ``;``."""
    gold = "" if answer is None else str(answer)
    if category == 3:
        gold = gold.split(";")[0].strip()
    return [p.strip() for p in gold.split(",")] if category == 1 else [gold]


def neighbours(ids: Iterable[str]) -> set[str]:
    """The dialog ids and the turns beside each in its session: ``D3:7`` -> ``D3:6``, ``D3:7``, ``D3:8``."""
    out = set()
    for d in ids:
        m = re.fullmatch(r"(D\d+):(\d+)", str(d))
        out.add(str(d))
        if m:
            out.update(f"{m.group(1)}:{int(m.group(2)) + k}" for k in (-1, 1))
    return out


def about(lines: Sequence[str], sources: Sequence[Sequence[str]] | None, asked: Asked | None,
          answer: Any = "") -> list[bool]:
    """Per line, whether it is about the question (see the module doc); every line without ``asked``."""
    if asked is None:
        return [True] * len(lines)
    names = {w.lower() for sp in asked.speakers for w in sp.split()}
    topic = content_tokens(asked.question) - set(stemmed_tokens(" ".join(names)))
    gold = content_tokens(POLARITY.sub("", str(answer or "")))
    if gold <= topic:  # a choice the question offers ("a beach or the mountains?"): its words are no topic
        topic -= gold
    near = neighbours(asked.evidence)
    srcs = list(sources) if sources is not None else [()] * len(lines)
    when = period(asked.question)  # "Which city was Calvin at on October 3, 2023?": a line about another time is not
    own = [line.split(" (replying to ")[0] for line in lines]
    return [bool(near & set(src)) or (bool(topic & line_words(mine)) and (
        when is None or any(d is not None and _about_time(when, d) for d in map(period, line_dates(mine)))))
        for mine, src in zip(own, srcs)]


#: A line dated this long after a month a question names may report it ("has taken up photography", said on
#: 17 November, for "Which hobby did Dave pick up in October 2023?").
REPORTS_DAYS = 31


def _about_time(when: tuple[datetime, datetime, str], said: tuple[datetime, datetime, str]) -> bool:
    """Whether a line's date (or one its words imply) is about the time a question names: within the date checks'
    slack (`memlab.eval.gold_checks.DATE_SLACK_DAYS`), or, for a month, in the `REPORTS_DAYS` after it."""
    return dates_agree(when, said) or (when[2] == "month" and 0 <= (said[0] - when[1]).days <= REPORTS_DAYS)


def reached(facts: Mapping[str, Sequence[frozenset[str]]], own: Mapping[str, Sequence[str]], lines: Sequence[str],
            sources: Sequence[Sequence[str]] | None, share: float = 0.5, wordless_near: bool = False
            ) -> tuple[set[str], set[str]]:
    """(evidence ids whose fact reached the reader, those only part of whose fact did). ``facts``: per evidence
    id, the gold words its turn holds, one set per gold part (a list item); ``own``: the context lines sourced
    from it. A turn's fact reaches through its own lines or its same-session neighbours' (which often carry the
    same fact): ``share`` of each part's words in them, or less (a summary or a neighbour that kept "joy" of "a
    sense of joy and freedom": the rest was missed). A turn with no gold word (a bridge hop, a photo) is reached
    by being in the context; with ``wordless_near`` (an inferred answer's grounds, a date's anchor turn) also by
    its same-session neighbour's being there."""
    srcs = list(sources) if sources is not None else []
    shown = {x for src in srcs for x in src}
    full: set[str] = set()
    part: set[str] = set()
    for s, fact in facts.items():
        if not any(fact):
            if own.get(s) or (wordless_near and neighbours([s]) & shown):
                full.add(s)
            continue
        near = [line for line, src in zip(lines, srcs) if s not in src and neighbours([s]) & set(src)]
        held = {t for x in [*own.get(s, ()), *near] for t in line_words(x)}
        if all(len(p & held) >= share * len(p) for p in fact):
            full.add(s)
        elif any(p & held for p in fact):
            part.add(s)
    return full, part


_LINE_DATE = re.compile(r"^(\d{1,2} [A-Z][a-z]+ \d{4}) ")


@lru_cache(maxsize=100_000)
def line_dates(line: str) -> tuple[str, ...]:
    """The dates one line is about: its own date (``8 May 2023 ...``) and that date moved by each of its relative
    phrases ("yesterday" -> ``7 May 2023``; "last week" -> ``the week before 8 May 2023``). Cached: attribution
    reads the same lines for many questions."""
    m = _LINE_DATE.match(line)
    if not m:
        return ()
    when = datetime.strptime(m.group(1), "%d %B %Y")
    said = (resolve(x, when) for x in re.split(r"(?<=[.!?])\s+", line[m.end():]))
    return (format_day(when), *(d for d, phrase in said if phrase is not None))


def implied_dates(lines: Iterable[str]) -> list[str]:
    """The dates lines imply, as a reader computing them would write them: each line's `line_dates`, and the
    month and year of each of those that is a day."""
    out: list[str] = []
    for line in lines:
        for said in line_dates(line):
            out.append(said)
            d = parse_date(said)
            if d is not None and d[1] == "day":
                out += [fmt_month(d[0]), str(d[0].year)]
    return list(dict.fromkeys(out))


def _token_f1(pred: Sequence[str], gold: Sequence[str]) -> float:
    same = sum((Counter(pred) & Counter(gold)).values())
    return 0.0 if not same else 2 * same / (len(pred) + len(gold))


def stated_lines(answer: Any, category: int, lines: Sequence[str], sources: Sequence[Sequence[str]] | None,
                 asked: Asked | None) -> list[str]:
    """The lines about the question, as the words they state: a line's date stamp is a date gold's to use, and
    coincidence for any other ("3 May 2023 ..." does not say the "3" of "How many dogs?")."""
    kept = [s for s, a in zip(lines, about(lines, sources, asked, answer)) if a]
    return kept if answer_kind(str(answer), int(category)) == "date" else [_LINE_DATE.sub("", s) for s in kept]


def answer_ceiling(answer: Any, category: int, lines: Sequence[str], sources: Sequence[Sequence[str]] | None = None,
                   asked: Asked | None = None) -> float:
    """The answer ceiling of one question over its context ``lines`` (see the module doc); NaN for category 5.
    ``sources``: each line's dialog ids; ``asked``: the question (None: every line is about it)."""
    if int(category) == 5:
        return math.nan
    kept = stated_lines(answer, category, lines, sources, asked)
    toks = [stemmed_tokens(s) for s in kept]
    parts = gold_parts(answer, int(category))
    dates = None
    total = 0.0
    for p in parts:
        gold = stemmed_tokens(p)
        best = best_span_f1(gold, toks, content_tokens(p))
        if best < 1.0 and parse_date(p) is not None:
            dates = implied_dates(kept) if dates is None else dates
            best = max([best, *(_token_f1(stemmed_tokens(d), gold) for d in dates)])
        total += best
    return total / len(parts)


def jointly_asked(question: str, speakers: Sequence[str]) -> list[str]:
    """The two people a question asks about together ("What have John and Maria both done?", "Jon and Gina"),
    or [] for a question about one (or about one person's dealings with the other: "What did Sam tell Evan?")."""
    people = asked_people(question, speakers)
    if len(people) != 2:
        return []
    a, b = (re.escape(p.split()[0][:3]) for p in people)
    pair = rf"\b({a}\w*\W+and\W+{b}|{b}\w*\W+and\W+{a})"
    return people if re.search(rf"\bboth\b|{pair}", question, re.IGNORECASE) else []


def _stated(answer: Any, category: int, bigrams: frozenset[str] = frozenset()) -> set[str]:
    """The gold's content words a line can state (glued words split, a leading yes/no dropped)."""
    return content_tokens(POLARITY.sub("", deglue(" ".join(gold_parts(answer, int(category))), bigrams)))


def answer_bearing(answer: Any, category: int, lines: Sequence[str], sources: Sequence[Sequence[str]] | None = None,
                   asked: Asked | None = None) -> float:
    """1.0 when the context supports the gold (see the module doc), else 0.0; NaN for category 5."""
    if int(category) == 5:
        return math.nan
    gold = _stated(answer, category, asked.bigrams if asked else frozenset())
    if not gold:
        return 0.0
    kept = stated_lines(answer, category, lines, sources, asked)
    if not gold <= {t for s in kept for t in line_words(s)}:
        return 0.0
    people = jointly_asked(asked.question, asked.speakers) if asked is not None else []
    words = gold - content_tokens(" ".join(people))  # the names in "Evan and Sam use ..." say nothing of either
    for person in people:
        own = {t for s in kept if line_subjects(s, asked.speakers) == {person} for t in line_words(s)}
        if not words or len(words & own) < PERSON_SHARE * len(words):
            return 0.0
    return 1.0
