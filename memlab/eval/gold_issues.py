"""The whole gold-versus-evidence check (`gold_issue`) and its two checks that read more than one turn's date or
the whole conversation: a duration its turns' dates contradict, an open-ended suggestion found nowhere. The
single-turn checks and the word matching are `memlab.eval.gold_checks`'."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime

from memlab.answer.temporal import resolve
from memlab.eval.gold_checks import (
    MONTHS,
    WEEK_BEFORE,
    EvidenceTurn,
    answer_kind,
    content_tokens,
    date_contradiction,
    deglue,
    glued_gold,
    period,
    relative_time_only,
    speaker_contradiction,
)

_MON = "|".join(MONTHS)


#: A question asking for a suggestion, whose gold is an idea rather than a fact of the conversation.
_SUGGESTION = re.compile(r"\b(gifts?|advice|advise|suggest\w*|recommend\w*|appropriate|tips?|ideas?)\b", re.IGNORECASE)
_HEDGE = re.compile(r"\b(likely|probably|presumably|maybe|possibly|yes|no|not|unlikely|somewhat|would|could)\b",
                    re.IGNORECASE)


def unfounded_suggestion(answer: str, question: str, category: int, turns: Sequence[EvidenceTurn],
                         said: set[str]) -> str | None:
    """Why an open-ended suggestion gold is supported by nothing, or None: an open-domain question (category 3)
    asking for a suggestion (a gift, advice, a recommendation, an idea), whose gold has three or more content
    words beyond the question's, fewer than half of them said anywhere in the conversation (``said``: the
    conversation's `content_tokens`) and fewer than half in its evidence turns (which point elsewhere: a hike,
    a painting class). World knowledge is not a suggestion: a short answer ("Florida"), or one of names
    ("Skellig Michael, Malin Head": capitalised past its first word)."""
    if category != 3 or not _SUGGESTION.search(question) or answer_kind(answer, category) in ("date", "count"):
        return None
    # proper names the conversation never says ("Skellig Michael") are world knowledge, not a suggestion
    names = content_tokens(" ".join(w for w in answer.split()[1:] if w[:1].isupper()))
    gold = content_tokens(_HEDGE.sub(" ", answer)) - content_tokens(question)
    if len(gold) < 3 or 2 * len(gold & names) >= len(gold):
        return None
    found, ev = gold & said, gold & content_tokens(" ".join(t.text for t in turns))
    if 2 * len(found) >= len(gold) or 2 * len(ev) >= len(gold):
        return None
    return (f"the gold suggests what the conversation never says: {sorted(gold - found)} are in no turn and its "
            f"evidence turns hold {len(ev)} of its {len(gold)} words")


_WORD_NUM = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
             "ten": 10, "eleven": 11, "twelve": 12, "a": 1, "an": 1}
_DAYS = re.compile(r"^\W*(?:(?:about|around|nearly|almost|roughly|approximately|over)\s+)?(\d+|[a-z]+)\s+(days?|weeks?)"
                   r"\W*$", re.IGNORECASE)
_ORD = "(?:st|nd|rd|th)?"
_MONTH_DAY = re.compile(rf"\b(?:({_MON})\s+(\d{{1,2}}){_ORD}|(\d{{1,2}}){_ORD}\s+(?:of\s+)?({_MON}))\b", re.IGNORECASE)


def duration_contradiction(answer: str, turns: Sequence[EvidenceTurn]) -> str | None:
    """Why a gold duration in days or weeks contradicts its evidence turns, or None: the turns date both ends
    (their session dates, the days their "yesterday" / "tomorrow" / "last Friday" resolve to, the days they
    name: "return on July 20"), the gold is not said by a turn, and it is more than 3 days and 30 % off the span
    those dates cover (a trip "19 days" long whose turns give 9 July to 20 July)."""
    m = _DAYS.match(str(answer))
    if m is None or not turns or any(t.date is None for t in turns):
        return None
    n = int(m.group(1)) if m.group(1).isdigit() else _WORD_NUM.get(m.group(1).lower())
    if n is None:
        return None
    days = n * (7 if m.group(2).lower().startswith("week") else 1)
    if any(re.search(rf"\b{m.group(1)}\s+{m.group(2)[:3]}", t.text, re.IGNORECASE) for t in turns):
        return None
    dates = set()
    for t in turns:  # a turn's days: those it names, else those its phrases resolve to, else its session's
        named, phrased = set(), set()
        for mon, day, day2, mon2 in _MONTH_DAY.findall(t.text):
            try:
                named.add(datetime(t.date.year, MONTHS.index((mon or mon2).lower()) + 1,  # type: ignore[union-attr]
                                   int(day or day2)).date())
            except ValueError:
                continue
        for x in re.split(r"(?<=[.!?])\s+", t.text):
            a, p = resolve(x, t.date)  # type: ignore[arg-type]
            d = period(a) if p is not None else None
            if d is not None and d[2] == "day" and not WEEK_BEFORE.search(a):
                phrased.add(d[0].date())
        dates |= named or phrased or {t.date.date()}  # type: ignore[union-attr]
    if len(dates) < 2:
        return None
    span = (max(dates) - min(dates)).days
    if abs(span - days) <= max(3, 0.3 * days):
        return None
    return (f"gold duration {answer!r} contradicts its evidence: its turns date {min(dates):%d %B %Y} to "
            f"{max(dates):%d %B %Y}, {span} days")


def gold_issue(answer: str, prediction: str, question: str, category: int, turns: Sequence[EvidenceTurn],
               speakers: Sequence[str], spoken: Mapping[str, Sequence[str]] | None = None,
               said: set[str] | None = None, bigrams: frozenset[str] = frozenset(),
               threshold: float = 0.5) -> str | None:
    """Why a (non-adversarial) gold is wrong or unusable against its evidence, or None: only a relative time,
    glued words that fail a right prediction, a date or duration its turns contradict, the other person's
    turns, a suggestion found nowhere. ``spoken``: each speaker's turns; ``said``: the conversation's content
    words (derived from ``spoken`` when None, for a suggestion question only: stemming every turn costs seconds)."""
    if relative_time_only(answer):
        return f"the gold {answer!r} is a relative time with no date: it depends on when it was said"
    if said is None and spoken is not None and category == 3 and _SUGGESTION.search(question):  # only it reads them
        said = {t for texts in spoken.values() for x in texts for t in content_tokens(x)}
    matched = deglue(answer, bigrams)
    return (glued_gold(answer, prediction, category, threshold, bigrams)
            or date_contradiction(answer, turns, question) or duration_contradiction(answer, turns)
            or speaker_contradiction(question, turns, speakers, matched, spoken)
            or (unfounded_suggestion(matched, question, category, turns, said) if said is not None else None))
