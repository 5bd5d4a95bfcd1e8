"""Reading a judge's reply, strictly: one rule per reply format, each raising ValueError when the reply
cannot be read, so an unreadable verdict becomes a ``judge_error`` (never a score, never cached).

A JSON label where the prompt asks for one, else one word-bounded CORRECT or WRONG; a negated or hedged verdict
("NOT CORRECT", "partially correct"), both words, neither, or an unknown label is unreadable. LongMemEval's
judge answers yes or no and nothing else (`parse_yes_no`), or, under the official script's rule
(`official_yes`), counts any reply containing "yes". Each scoring profile picks its rule
(`ScoringProfile.judge_score`).
"""

from __future__ import annotations

import json
import re
from typing import Any

_VERDICT = re.compile(r"\b(CORRECT|WRONG|INCORRECT)\b")
_WORD = re.compile(r"[A-Z']+")
#: Words that, among the three before a verdict word, negate or hedge it ("NOT CORRECT", "PARTLY CORRECT").
_QUALIFIERS = frozenset("""NOT NO NEVER NOR NEITHER HARDLY BARELY PARTIALLY PARTLY MOSTLY SOMEWHAT LARGELY NEARLY
ALMOST MAYBE POSSIBLY PROBABLY ARGUABLY HALF SEMI""".split())
VERDICTS = {"CORRECT": 1.0, "WRONG": 0.0, "INCORRECT": 0.0}


def verdict_word(text: str) -> float:
    """1.0 / 0.0 for a reply that gives one plain verdict word, CORRECT or WRONG (INCORRECT), word-bounded.

    Raises ValueError when it gives neither, both, or a verdict negated or hedged by one of the three words
    before it ("The generated answer is NOT CORRECT.", "isn't correct", "partially correct")."""
    up = (text or "").upper().replace("\u2019", "'")
    found = set()
    for m in _VERDICT.finditer(up):
        before = _WORD.findall(up[:m.start()])[-3:]
        if any(w in _QUALIFIERS or w.endswith("N'T") for w in before):
            raise ValueError(f"judge reply {text[:80]!r} negates or hedges its verdict "
                             f"({' '.join([*before, m.group(1)])!r}); expected one plain CORRECT or WRONG")
        found.add(VERDICTS[m.group(1)])
    if len(found) != 1:
        raise ValueError(f"judge reply {text[:80]!r} is not one verdict (CORRECT or WRONG)")
    return found.pop()


def json_object(text: str, what: str) -> dict[str, Any]:
    """The JSON object a judge reply carries (code fences and a sentence around it allowed); ValueError if none."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        raise ValueError(f"{what} judge reply has no JSON object: {text[:120]!r}")
    try:
        obj = json.loads(text[start:end + 1])
    except json.JSONDecodeError as e:
        raise ValueError(f"{what} judge reply's JSON does not parse ({e.msg}): {text[:120]!r}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{what} judge reply's JSON is not an object: {text[:120]!r}")
    return obj


def verdict_label(obj: dict[str, Any], what: str) -> float:
    """The ``label`` of a JSON verdict: exactly CORRECT or WRONG (any case); anything else is ValueError."""
    label = obj.get("label")
    v = label.strip().upper() if isinstance(label, str) else None
    if v not in ("CORRECT", "WRONG"):
        raise ValueError(f"{what} judge reply's label is {label!r}; expected \"CORRECT\" or \"WRONG\"")
    return VERDICTS[v]


_YES_NO = re.compile(r"[\s\"'`*.!]*(yes|no)[\s\"'`*.!]*", re.IGNORECASE)


def parse_yes_no(text: str) -> bool:
    """A LongMemEval judge verdict read strictly: the reply is ``yes`` or ``no`` (any case, with quotes,
    stars or a full stop around it) and nothing else; anything else is a ValueError, so an unreadable
    reply is a judge error, never a verdict. (The official script counts any reply containing "yes".)"""
    m = _YES_NO.fullmatch(text or "")
    if m is None:
        raise ValueError(f"judge reply {str(text)[:80]!r} is not one verdict (yes or no)")
    return m.group(1).lower() == "yes"


def official_yes(text: str) -> bool:
    """LongMemEval's official verdict rule (``src/evaluation/evaluate_qa.py``): the reply, stripped and lowercased,
    contains ``yes`` anywhere ("Yes.", "yes, because", "eyes", even "no, not yes"); every other reply is a no. Never
    unreadable. (An empty reply never gets here: memlab's client makes it a failed call, not a no.)"""
    return "yes" in str(text).strip().lower()
