"""Relative time phrases resolved against a memory's date, in the forms LoCoMo answers use.

"yesterday" said on 8 May 2023 -> "7 May 2023"; "last week" -> "the week before 8 May 2023";
"last Friday" -> "the Friday before 8 May 2023"; "last year" -> "2022"; "last month" -> "April 2023";
"next month" -> "June 2023"; "3 years ago" -> "2020". No phrase: the memory's own date.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from memlab.data.locomo import format_day as fmt_day

WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_WD = {w[:3]: w for w in WEEKDAYS}
_NUM = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
        "ten": 10, "a": 1, "an": 1, "a couple of": 2, "a few": 3}
TEMPORAL_QUESTION = re.compile(
    r"^\s*(when|what (year|month|date|day|time)|which (year|month|day|date)|how long ago|in which (year|month))\b",
    re.IGNORECASE,
)


def fmt_month(d: datetime) -> str:
    return d.strftime("%B %Y")


def _shift_month(d: datetime, months: int) -> datetime:
    m = d.month - 1 + months
    return d.replace(year=d.year + m // 12, month=m % 12 + 1, day=1)


def is_temporal_question(question: str) -> bool:
    return bool(TEMPORAL_QUESTION.search(question))


def resolve(text: str, when: datetime) -> tuple[str, str | None]:
    """(answer, the phrase it came from) for a memory said at ``when``."""
    low = text.lower()
    n_ago = re.search(r"\b(\d+|one|two|three|four|five|six|seven|eight|nine|ten|a|an|a couple of|a few)\s+"
                      r"(day|week|month|year)s?\s+ago\b", low)
    if n_ago:
        n = int(n_ago.group(1)) if n_ago.group(1).isdigit() else _NUM[n_ago.group(1)]
        unit = n_ago.group(2)
        if unit == "year":
            return str(when.year - n), n_ago.group(0)
        if unit == "month":
            return fmt_month(_shift_month(when, -n)), n_ago.group(0)
        if unit == "week":
            return f"the week before {fmt_day(when)}" if n == 1 else fmt_day(when - timedelta(weeks=n)), \
                n_ago.group(0)
        return fmt_day(when - timedelta(days=n)), n_ago.group(0)
    rules: list[tuple[str, str]] = [
        (r"\b(yesterday|last night)\b", "yesterday"),
        (r"\blast (week)end\b", "weekend"),
        (r"\blast week\b", "week"),
        (r"\blast month\b", "last-month"),
        (r"\blast (mon|tue|wed|thu|fri|sat|sun)(?:day|s|sday|nesday|rs|rsday|urday)?\b", "weekday"),
        (r"\blast year\b", "last-year"),
        (r"\bnext month\b", "next-month"),
        (r"\bnext week\b", "next-week"),
        (r"\bnext year\b", "next-year"),
        (r"\btomorrow\b", "tomorrow"),
        (r"\bthis month\b", "this-month"),
        (r"\bthis year\b", "this-year"),
    ]
    for pat, kind in rules:
        m = re.search(pat, low)
        if not m:
            continue
        if kind == "yesterday":
            return fmt_day(when - timedelta(days=1)), m.group(0)
        if kind == "weekend":
            return f"the weekend before {fmt_day(when)}", m.group(0)
        if kind == "week":
            return f"the week before {fmt_day(when)}", m.group(0)
        if kind == "weekday":
            return f"the {_WD[m.group(1)].capitalize()} before {fmt_day(when)}", m.group(0)
        if kind == "last-month":
            return fmt_month(_shift_month(when, -1)), m.group(0)
        if kind == "last-year":
            return str(when.year - 1), m.group(0)
        if kind == "next-month":
            return fmt_month(_shift_month(when, 1)), m.group(0)
        if kind == "next-week":
            return f"the week after {fmt_day(when)}", m.group(0)
        if kind == "next-year":
            return str(when.year + 1), m.group(0)
        if kind == "tomorrow":
            return fmt_day(when + timedelta(days=1)), m.group(0)
        if kind == "this-month":
            return fmt_month(when), m.group(0)
        return str(when.year), m.group(0)
    return fmt_day(when), None
