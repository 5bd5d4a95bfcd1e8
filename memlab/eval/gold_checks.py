"""A gold answer checked against its evidence turns, with no run needed: whether its date contradicts what
the turns imply, whether the turns are the other speaker's, whether it is only a relative time, and how
the answer relates to its evidence (`answer_kind`). Failure attribution (`memlab.attribution`) labels a
question whose gold fails one of these a ``label-issue``."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from memlab.answer.temporal import resolve
from memlab.data.locomo import format_day
from memlab.eval.scoring import normalize_answer, score_answer

#: How far a gold date may sit from the date its evidence turn implies, by the gold's precision.
DATE_SLACK_DAYS = {"day": 10, "month": 31}


@dataclass
class EvidenceTurn:
    """One evidence turn as the dataset has it: who said it, when (its session's date), what."""

    id: str
    speaker: str
    text: str
    date: datetime | None = None


_MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
           "november", "december")
_MON = "|".join(_MONTHS)
_DAY_RE = re.compile(rf"\b(\d{{1,2}})\s+({_MON}),?\s+(\d{{4}})\b", re.IGNORECASE)
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
        return datetime(int(m.group(3)), _MONTHS.index(m.group(2).lower()) + 1, int(m.group(1))), "day"
    m = _MONTH_RE.search(text)
    if m:
        return datetime(int(m.group(2)), _MONTHS.index(m.group(1).lower()) + 1, 1), "month"
    m = _YEAR_RE.search(text)
    return (datetime(int(m.group(1)), 1, 1), "year") if m else None


def _dates_agree(a: tuple[datetime, str], b: tuple[datetime, str]) -> bool:
    prec = {"day": 0, "month": 1, "year": 2}
    coarse = max(a[1], b[1], key=prec.__getitem__)
    if coarse == "year":
        return a[0].year == b[0].year
    if coarse == "month":
        ma, mb = a[0].year * 12 + a[0].month, b[0].year * 12 + b[0].month
        return abs(ma - mb) <= 1
    return abs((a[0] - b[0]).days) <= DATE_SLACK_DAYS["day"]


def date_contradiction(answer: str, turns: Sequence[EvidenceTurn]) -> str | None:
    """Why a dated gold answer contradicts every evidence turn, or None (no date, or one turn agrees).

    A turn implies its session's date and, for each sentence with a relative phrase, that date moved
    by it (`memlab.answer.temporal.resolve`: "yesterday", "last year", "two weeks ago"); the gold agrees
    with a turn when it agrees with any of these (LoCoMo writes "the week before <session date>"). A
    turn with no relative phrase but time words of its own ("since 2016", "in June", "years") implies
    nothing and the check stays silent.
    """
    gold = parse_date(str(answer))
    if gold is None or not turns or any(t.date is None for t in turns):
        return None
    implied = []
    for t in turns:
        said = [resolve(x, t.date) for x in re.split(r"(?<=[.!?])\s+", t.text)]  # type: ignore[arg-type]
        phrases = [(a, p) for a, p in said if p is not None]
        if not phrases and _OWN_TIME.search(t.text):
            return None
        dates = [parse_date(a) for a, _ in phrases] + [(t.date, "day")]
        if any(d is None or _dates_agree(gold, d) for d in dates):
            return None
        implied.append(f"{t.id} said {format_day(t.date)}"  # type: ignore[arg-type]
                       + "".join(f" ({p!r} -> {a})" for a, p in phrases))
    return f"gold date {answer!r} contradicts its evidence: " + "; ".join(implied)


_YOU = re.compile(r"\b(you|your|yours|you're|you've|you'd|you'll|ya)\b", re.IGNORECASE)


def speaker_contradiction(question: str, turns: Sequence[EvidenceTurn], speakers: Sequence[str]) -> str | None:
    """Why the evidence was spoken by the other person than the one the question asks about, or None."""
    if len(speakers) != 2 or not turns:
        return None
    first = {s: s.split()[0].lower() for s in speakers}
    words = {w.lower() for w in re.findall(r"\b[A-Z][a-z]+", question)}  # names and short forms: Deb, Mel, Jo
    named = [s for s in speakers if any(len(w) >= 2 and first[s].startswith(w) for w in words)]
    if len(named) != 1:
        return None
    asked = named[0]
    other = next(s for s in speakers if s != asked)
    for t in turns:
        if t.speaker != other or _YOU.search(t.text) or re.search(rf"\b{re.escape(first[asked])}\b", t.text,
                                                                  re.IGNORECASE):
            return None
    return (f"the question asks about {asked}, but every evidence turn ({', '.join(t.id for t in turns)}) is "
            f"{other} speaking about themself")


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
                            r"year|summer|winter|spring|fall|night|\w+day))\W*$", re.IGNORECASE)


def relative_time_only(answer: str) -> bool:
    """Whether the gold is only a relative time ("Last year"), which depends on when it was said."""
    return bool(_RELATIVE_ONLY.match(answer))


#: Punctuation between a letter and a letter or digit ("April.2023", "S.Lewis"), not in a decimal ("3.5"):
#: the official normalisation deletes it and glues the two words into one token ("april2023").
_GLUED = re.compile(r"(?<=[A-Za-z])[.;:/](?=[A-Za-z0-9])|(?<=[0-9])[.;:/](?=[A-Za-z])")


def glued_gold(answer: str, prediction: str, category: int, threshold: float = 0.5) -> str | None:
    """Why the gold's own punctuation failed a right prediction, or None: the official normalisation glues two
    words of the gold into a token no prediction can hold ("April.2023" -> "april2023"), and the prediction
    scores ``threshold`` or more against the gold with that punctuation read as a space ("April 2023")."""
    spaced = _GLUED.sub(" ", answer)
    if spaced == answer or score_answer(prediction, answer, category) >= threshold \
            or score_answer(prediction, spaced, category) < threshold:
        return None
    return (f"the gold {answer!r} normalises to {normalize_answer(answer)!r}, gluing two words; the prediction "
            f"matches {spaced!r}")
