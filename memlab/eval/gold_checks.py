"""A gold answer checked against its evidence turns, with no run needed: whether its date contradicts what the
turns imply, whether the turns are the other speaker's, whether it is only a relative time or glued words, and how
the answer relates to its evidence (`answer_kind`); the words that tie a text to an answer (`content_tokens`).
Durations, suggestions and the whole check (`gold_issue`) are `memlab.eval.gold_issues`'.
Failure attribution (`memlab.attribution`) labels a question whose gold fails one of these a ``label-issue``;
the definitions a hand labeller reads are the attribution guide's ("Failure labels"), and these checks are
their computable form."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache, lru_cache
from typing import Any

from memlab.answer.temporal import resolve
from memlab.data.locomo import format_day
from memlab.eval.scoring import normalize_answer, score_answer, stem, stemmed_tokens
from memlab.index.text import stop_words

#: How far (days) a gold date may sit from the date or period its evidence turn implies, by the gold's
#: precision: a day gold 10 days; a month gold a week past the month's ends ("last week" said on 16 July 2023
#: is 9 July, not June 2023); a year gold none (the years must be equal).
DATE_SLACK_DAYS = {"day": 10, "month": 7, "year": 0}


@dataclass
class EvidenceTurn:
    """One evidence turn as the dataset has it: who said it, when (its session's date), what, and the turn it
    follows in its session (speaker, text; None: the session's first, or unknown)."""

    id: str
    speaker: str
    text: str
    date: datetime | None = None
    follows: tuple[str, str] | None = None


#: Stop words that carry an answer: numbers (a count's "three"), the month "may" and nouns scikit-learn's list holds.
_NOT_FUNCTION = frozenset("one two three four five six seven eight nine ten eleven twelve fifteen twenty forty fifty "
                          "sixty hundred first third once twice fire bill system interest call name find found full "
                          "side top bottom front back move part show serious cry thick thin fill empty detail mill "
                          "describe may".split())


#: Chat filler every conversation says everywhere ("like", "use", "really"): no more a tie than "of".
_FILLER = frozenset("like use used using way thing things really just get got lot lots does did doing".split())


@cache
def function_words() -> frozenset[str]:
    """Words that tie no text to an answer ("of", "with", "it", "like" ...): scikit-learn's English stop words
    less the numbers and nouns among them, plus chat filler."""
    return (stop_words() - _NOT_FUNCTION) | _FILLER


@lru_cache(maxsize=200_000)
def content_tokens(text: str) -> frozenset[str]:
    """The official stemmed tokens of ``text`` that are not `function_words`: the words that can tie a text to
    an answer. Empty when ``text`` has none. Cached: attribution reads the same lines for many questions."""
    stops = function_words()  # normalize_answer's words are normalized already: stemmed as they are
    return frozenset(map(stem, [w for w in normalize_answer(text).split() if w not in stops]))


def best_span_f1(gold: Sequence[str], lines_tokens: Iterable[Sequence[str]], content: set[str] | None = None) -> float:
    """Highest token F1 (official multiset F1) of any contiguous span of any line against ``gold`` tokens; with
    ``content`` (the gold's content tokens), a span scores only when it holds one of them."""
    need = Counter(gold)
    g = len(gold)
    if not g:
        return 0.0
    content = content or set()
    best = 0.0
    for toks in lines_tokens:
        starts = [i for i, t in enumerate(toks) if t in need]
        for i in starts:
            have: Counter[str] = Counter()
            same = 0
            credited = not content
            for j in range(i, len(toks)):
                t = toks[j]
                if t in need:
                    credited = credited or t in content
                    if have[t] < need[t]:
                        same += 1
                    have[t] += 1
                    f1 = 2 * same / (j - i + 1 + g)
                    if f1 > best and credited:
                        best = f1
                        if best == 1.0:
                            return 1.0
    return best


def _first(name: str) -> str:
    return name.split()[0].lower() if name.split() else ""


def asked_people(question: str, speakers: Sequence[str]) -> list[str]:
    """The conversation's speakers the question names, in ``speakers`` order; a short form names its speaker
    ("Deb" names Deborah, "Mel" Melanie: a capitalised word of two or more letters that starts the first name)."""
    words = {w.lower() for w in re.findall(r"\b[A-Z][a-z]+", question)}
    return [s for s in speakers if any(len(w) >= 2 and _first(s).startswith(w) for w in words)]


def line_subjects(text: str, speakers: Sequence[str]) -> set[str]:
    """Whom a context line is about: a turn (``"Jon: ..."``, maybe after its date) is its speaker's; another line
    (an observation, a summary) is about every speaker whose first name it holds."""
    body = re.sub(r"^\d{1,2} [A-Z][a-z]+ \d{4} ", "", text)
    for sp in speakers:
        if body.startswith(f"{sp}:"):
            return {sp}
    low = set(re.findall(r"[a-z]+", body.lower()))
    return {sp for sp in speakers if _first(sp) in low}


MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
           "november", "december")
_MON, _TH = "|".join(MONTHS), "(?:st|nd|rd|th)?"  # "3rd May 2023", "May 3, 2023"
_DAY_RE = re.compile(rf"(?i)\b(?:(\d{{1,2}}){_TH}\s+({_MON})|({_MON})\s+(\d{{1,2}}){_TH}),?\s+(\d{{4}})\b")
_MONTH_RE = re.compile(rf"\b({_MON}),?\s+(\d{{4}})\b", re.IGNORECASE)
_YEAR_RE = re.compile(r"\b(19\d\d|20\d\d)\b")
_MONTH_WORD = re.compile(rf"\b({_MON}|monday|tuesday|wednesday|thursday|friday|saturday|sunday|weekend)\b",
                         re.IGNORECASE)
#: Words that tie a turn to a time of its own, so its session's date says nothing about the gold.
_OWN_TIME = re.compile(rf"\b({_MON}|\d+|since|ago|years?|months?|weeks?|when i was|once|used to|back then|"
                       r"a while|ages|recently|lately|few|couple|before|after|until|ago|next|tomorrow|summer|"
                       r"winter|spring|fall|autumn|christmas|thanksgiving|halloween|birthday)\b", re.IGNORECASE)


def parse_date(text: str) -> tuple[datetime, str] | None:
    """The first date in ``text`` with its precision: ``7 May 2023`` (day), ``May 2023`` (month), ``2022``."""
    m = _DAY_RE.search(text)
    if m:
        return datetime(int(m[5]), MONTHS.index((m[2] or m[3]).lower()) + 1, int(m[1] or m[4])), "day"
    m = _MONTH_RE.search(text)
    if m:
        return datetime(int(m.group(2)), MONTHS.index(m.group(1).lower()) + 1, 1), "month"
    m = _YEAR_RE.search(text)
    return (datetime(int(m.group(1)), 1, 1), "year") if m else None


WEEK_BEFORE = re.compile(r"\bthe (?:week|weekend|monday|tuesday|wednesday|thursday|friday|saturday|sunday) before\b",
                     re.IGNORECASE)


def period(text: str) -> tuple[datetime, datetime, str] | None:
    """The days a date phrase covers (first, last, precision): ``7 May 2023`` one day, ``May 2023`` the month,
    ``2022`` the year, ``the week before 9 June 2023`` (LoCoMo's and the resolver's form) the seven days before."""
    d = parse_date(text)
    if d is None:
        return None
    when, prec = d
    if prec == "day":
        week = WEEK_BEFORE.search(text)
        return (when - timedelta(days=7), when - timedelta(days=1), prec) if week else (when, when, prec)
    if prec == "month":
        nxt = when.replace(year=when.year + when.month // 12, month=when.month % 12 + 1)
        return when, nxt - timedelta(days=1), prec
    return when, when.replace(month=12, day=31), prec


def dates_agree(gold: tuple[datetime, datetime, str], said: tuple[datetime, datetime, str]) -> bool:
    """Whether two periods lie within the gold precision's slack (`DATE_SLACK_DAYS`) of each other."""
    gap = max((said[0] - gold[1]).days, (gold[0] - said[1]).days, 0)
    return gap <= DATE_SLACK_DAYS[gold[2]]


#: The form of a date question ("In which month ..."), not its event.
@cache
def _when_words() -> frozenset[str]:
    """Words of time that say nothing about a question's topic (stemmed on first use: the stemmer costs an import)."""
    return frozenset(stemmed_tokens("month months year years week weeks day days date time"))


def date_contradiction(answer: str, turns: Sequence[EvidenceTurn], question: str = "") -> str | None:
    """Why a dated gold answer contradicts its evidence turns, or None (no date, or a turn agrees).

    A turn implies its session's date and, for each sentence with a relative phrase, that date moved
    by it (`memlab.answer.temporal.resolve`: "yesterday", "last year", "two weeks ago"; "last week" is the
    seven days before); the gold agrees with a turn when it lies within `DATE_SLACK_DAYS` of any of these. A
    turn with no relative phrase but time words of its own ("since 2016", "in June", "years") implies nothing
    and the check stays silent. When some evidence turns name the event (hold a content word of
    ``question``) and others do not, only the naming turns date it: an unnamed "last week" turn does not
    excuse a gold that the naming turn's "last Friday" contradicts; within a turn, the sentences naming it
    ("Last week I scored 40 points", not "So much has happened in the last month").
    """
    gold = period(str(answer))
    if gold is None or not turns or any(t.date is None for t in turns):
        return None
    topic = content_tokens(question) - {_first(w) for w in re.findall(r"\b[A-Z][a-z]+", question)} - _when_words()
    sentences = {t.id: re.split(r"(?<=[.!?])\s+", t.text) for t in turns}
    resolved = {t.id: [(x, *resolve(x, t.date)) for x in sentences[t.id]] for t in turns}  # type: ignore[arg-type]
    if any(all(p is None for _, _, p in resolved[t.id]) and _OWN_TIME.search(t.text) for t in turns):
        return None
    naming = {t.id: [(a, p) for x, a, p in resolved[t.id] if p is not None and topic & content_tokens(x)]
              for t in turns}
    implied = []
    for t in [t for t in turns if naming[t.id] or topic & content_tokens(t.text)] or turns:
        phrases = naming[t.id] or [(a, p) for _, a, p in resolved[t.id] if p is not None]
        periods = [period(a) for a, _ in phrases] + [(t.date, t.date, "day")]
        if any(d is None or dates_agree(gold, d) for d in periods):  # type: ignore[arg-type]
            return None
        implied.append(f"{t.id} said {format_day(t.date)}"  # type: ignore[arg-type]
                       + "".join(f" ({p!r} -> {a})" for a, p in phrases))
    return f"gold date {answer!r} contradicts its evidence: " + "; ".join(implied)


#: A name said to someone, not about them: "Hey Evan!", "Thanks, Sam", "Evan, ..." at a sentence's start.
_VOCATIVE = r"(?:^|[.!?]\s+)(?:(?:hey|hi|hello|thanks|thank you|wow|oh|yeah|yes|no|congrats|sorry)\W+)?{name}\b\W"


def speaker_contradiction(question: str, turns: Sequence[EvidenceTurn], speakers: Sequence[str], answer: str = "",
                          spoken: Mapping[str, Sequence[str]] | None = None) -> str | None:
    """Why the evidence was spoken by the other person than the one the question asks about, or None.

    Every evidence turn is the other speaker's, none names the person asked other than in a greeting ("Hey
    Evan!") or follows their saying of themself what the question asks (`_tells`), and either no evidence turn
    says "you" (the other person speaks about themself) or — given ``spoken``, each speaker's turns in the whole
    conversation — the person asked never says the gold themself (no span of a turn of theirs, photo captions
    aside, scores `SAYS` F1 against the gold: a few shared words are chat, not the answer)."""
    if len(speakers) != 2 or not turns:
        return None
    named = asked_people(question, speakers)
    if len(named) == 2:  # "What did Evan share with Sam?" asks about Evan; "... learn from Sam?" about both
        low = question.lower()
        first, second = sorted(named, key=lambda p: low.find(_first(p)[:3]))
        later = re.escape(_first(second)[:3])
        if re.search(rf"\b(and|from|about|by|of|for)\s+{later}|{later}\w*'s|\bboth\b", low):
            return None
        named = [first]
    if len(named) != 1:
        return None
    asked = named[0]
    other = next(s for s in speakers if s != asked)
    name = re.escape(_first(asked))
    topic = content_tokens(question) - content_tokens(" ".join(speakers)) - _when_words()
    for t in turns:
        mentions = len(re.findall(rf"\b{name}\b", t.text, re.IGNORECASE))
        greetings = len(re.findall(_VOCATIVE.format(name=name), t.text, re.IGNORECASE))
        if t.speaker != other or mentions > greetings or _tells(t.follows, asked, topic):
            return None
    why = f"the question asks about {asked}, but every evidence turn ({', '.join(t.id for t in turns)}) is {other}"
    if not any(_YOU.search(t.text) for t in turns):
        return f"{why} speaking about themself"
    gold = content_tokens(POLARITY.sub("", answer))
    own = [_CAPTION.sub(" ", x) for x in (spoken or {}).get(asked, ())]  # their words, not their photos' captions
    if spoken is None or not gold or best_span_f1(stemmed_tokens(POLARITY.sub("", answer)),
                                                  [stemmed_tokens(x) for x in own], gold) >= SAYS:
        return None
    return f"{why}'s, and {asked} never says it"


def turn_before(turn_index: Mapping[str, Any], dia_id: str) -> tuple[str, str] | None:
    """(speaker, text) of the turn ``dia_id`` follows in its session (``D19:5`` for ``D19:6``), or None; ``turn_index``:
    a conversation's turns by dia id."""
    m = re.fullmatch(r"(D\d+):(\d+)", dia_id)
    prev = turn_index.get(f"{m.group(1)}:{int(m.group(2)) - 1}") if m else None
    return None if prev is None else (prev.speaker, prev.searchable_text)


def _tells(follows: tuple[str, str] | None, asked: str, topic: frozenset[str]) -> bool:
    """Whether the turn an evidence turn follows is the person asked saying, of themself, what the question asks:
    one sentence in the first person holding half the question's topic words ("It reminds me of one of my
    favorite Disney movies." before "Ratatouille is one of my favorites!"); the fact is theirs, the other person
    only names it. A question to the other ("What did you do?") is not, nor a passing word ("Italy is on my list")."""
    if follows is None or follows[0] != asked:
        return False
    return any(2 * len(topic & content_tokens(x)) >= len(topic) > 0 and _FIRST_PERSON.search(x)
               and not x.rstrip().endswith("?")
               for x in re.split(r"(?<=[.!?])\s+", _CAPTION.sub(" ", follows[1])))


_FIRST_PERSON = re.compile(r"\b(i|i'm|i've|i'd|i'll|me|my|mine|myself)\b", re.IGNORECASE)
#: F1 a span of one turn must score against the gold for its speaker to have said it.
SAYS = 2 / 3
_CAPTION = re.compile(r"\[shared a photo:[^\]]*\]")
_YOU = re.compile(r"\b(you|your|yours|you're|you've|you'd|you'll|ya)\b", re.IGNORECASE)
#: A gold's leading yes/no: never a word a line states (a line's "Yes" answers something else).
POLARITY = re.compile(r"^\W*(yes|no)\b\W*", re.IGNORECASE)


_INFERRED = re.compile(r"^\s*(likely|probably|maybe|possibly|yes|no|not|unlikely|somewhat)\b", re.IGNORECASE)


_COUNT = re.compile(r"\W*(\d+|one|two|three|four|five|six|seven|eight|nine|ten|once|twice)\b.*", re.IGNORECASE)


#: A duration, maybe hedged ("nearly three months", "about 2 years"): computed from the evidence turns' dates.
_DURATION = re.compile(r"\W*(?:(?:about|around|nearly|almost|over|roughly|approximately|just|more than|less than)\s+)*"
                       r"(?:an?\s+)?(?:\d+|an?|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|few|several|couple)"
                       r"(?:\s+of)?\s+(?:days?|weeks?|months?|years?)\W*", re.IGNORECASE)


def answer_kind(answer: str, category: int) -> str:
    """How a gold answer relates to its evidence text: ``count`` (a number: every evidence turn is one
    instance, all are needed), ``date`` (computed from a turn's date; a duration from two), ``inferred``
    (open-domain, yes/no, likely: any sufficient part of the evidence supports it) or ``literal`` (words
    read off a turn)."""
    if parse_date(answer) is not None or _MONTH_WORD.search(answer) or _DURATION.fullmatch(answer.strip()):
        return "date"
    if _COUNT.fullmatch(answer.strip()):
        return "count"
    if category == 3 or _INFERRED.search(answer):
        return "inferred"
    return "literal"


_RELATIVE_ONLY = re.compile(r"^\W*(the\s+)?(yesterday|today|tomorrow|recently|(last|next|this)\s+(week|weekend|month|"
                            r"year|summer|winter|spring|fall|night|\w+day)|(a\s+)?(few|couple(\s+of)?|several|some|"
                            r"\d+|one|two|three|four|five|six|ten)\s+(days?|weeks?|months?|years?)\s+ago|a\s+while\s+ago)\W*$",
                            re.IGNORECASE)


def relative_time_only(answer: str) -> bool:
    """Whether the gold is only a relative time ("Last year"), which depends on when it was said."""
    return bool(_RELATIVE_ONLY.match(answer))


#: Punctuation between a letter and a letter or digit ("April.2023", "S.Lewis", "relief,worry"), not in a decimal
#: ("3.5"): the official normalisation deletes it and glues the two words into one token ("april2023").
_GLUED = re.compile(r"(?<=[A-Za-z])[.;:/,](?=[A-Za-z0-9])|(?<=[0-9])[.;:/](?=[A-Za-z])")
#: A number glued to a month or word ("3June"), a word to a number ("Sunday3").
_NUMBER_GLUE = re.compile(r"(?<=\d)(?=[A-Za-z]{3})|(?<=[a-z])(?=\d)")


def conversation_bigrams(texts: Iterable[str]) -> frozenset[str]:
    """Adjacent lower-case word pairs of a conversation's turns ("watching movies"): what a glued gold word is
    split into (`deglue`)."""
    out: set[str] = set()
    for t in texts:
        ws = re.findall(r"[a-z0-9]+", t.lower())
        out.update(f"{a} {b}" for a, b in zip(ws, ws[1:]))
    return frozenset(out)


@lru_cache(maxsize=16)
def _pair_words(bigrams: frozenset[str]) -> frozenset[str]:
    """The words of a conversation's word pairs (computed once per conversation: a frozenset hashes once)."""
    return frozenset(w for pair in bigrams for w in pair.split())


#: Pieces that are an English word's prefix or suffix, not a glued word: "boxing" is not "box ing", "Sunday" not
#: "Sun day", "himself" not "him self", "returned" not "re turned".
_PREFIXES = frozenset("re un de dis per pre".split())
_SUFFIXES = frozenset("ing ings er ers ed est ly day days self selves thing things what on".split())


@lru_cache(maxsize=100_000)
def deglue(answer: str, bigrams: frozenset[str] = frozenset()) -> str:
    """The gold with its glued words split for matching: punctuation between words ("April.2023", "relief,worry"),
    a number and a word ("3June"), and a word the conversation never says whose split is a word pair it does say
    ("watchingmovies" -> "watching movies", "hanging withfriends" -> "hanging with friends"; ``bigrams``:
    `conversation_bigrams`). The official score is never computed on it: LoCoMo's F1 reads the gold as written."""
    text = _NUMBER_GLUE.sub(" ", _GLUED.sub(lambda m: ", " if m.group(0) == "," else " ", str(answer)))
    if not bigrams:
        return text
    words = _pair_words(bigrams)

    def split(m: re.Match[str]) -> str:
        w = m.group(0)
        low = w.lower()
        if low in words:
            return w
        cuts = [i for i in range(2, len(low) - 1) if low[:i] not in _PREFIXES and low[i:] not in _SUFFIXES]
        for i in cuts:  # a pair the conversation says, else two words it says ("localzoo": "local", "zoo")
            if f"{low[:i]} {low[i:]}" in bigrams:
                return f"{w[:i]} {w[i:]}"
        for i in cuts:
            if low[:i] in words and low[i:] in words:
                return f"{w[:i]} {w[i:]}"
        return w

    return re.sub(r"[A-Za-z]{5,}", split, text)


def glued_gold(answer: str, prediction: str, category: int, threshold: float = 0.5,
               bigrams: frozenset[str] = frozenset()) -> str | None:
    """Why the gold's glued words failed a right prediction, or None: the official normalisation glues two words
    of the gold into a token no prediction can hold ("April.2023" -> "april2023"; or LoCoMo wrote them glued,
    "watchingmovies"), and the prediction scores ``threshold`` or more against the gold with its words split
    (`deglue`)."""
    spaced = deglue(answer, bigrams)
    if spaced == answer or score_answer(prediction, answer, category) >= threshold \
            or score_answer(prediction, spaced, category) < threshold:
        return None
    return (f"the gold {answer!r} normalises to {normalize_answer(answer)!r}, gluing words; the prediction "
            f"matches {spaced!r}")
