"""Model-free memory sets built from LoCoMo itself: every turn, or the dataset's annotated observations.

These are what the offline extractors write and what the retrieval benchmark indexes. Each item is
the keyword arguments of `MemoryService.add`, so provenance (``source_ids``) travels with the text.
"""

from __future__ import annotations

from typing import Any

from memlab.data.locomo import Conversation, Turn

TURN_STYLES = ("plain", "speaker", "speaker-context", "speaker-window")


def turn_text(turn: Turn, style: str = "speaker-context", previous: Turn | None = None,
              following: Turn | None = None) -> str:
    """The memory text of one turn in a given style (measured in ``benchmarks/retrieval_recall.py``).

    - ``plain``: what was said (a shared photo's caption included);
    - ``speaker``: ``"<speaker>: <text>"``;
    - ``speaker-context``: the same, then the previous turn it answers, in parentheses;
    - ``speaker-window``: the same, then the previous and the next turn.

    The session date is not in the text: it is the memory's ``event_time``, which the index adds
    to what it searches (`memlab.index.hybrid.index_text`).
    """
    if style not in TURN_STYLES:
        raise ValueError(f"turn style: expected one of {TURN_STYLES}, got {style!r}")
    body = turn.searchable_text
    if style == "plain":
        return body
    text = f"{turn.speaker}: {body}"
    if style in ("speaker-context", "speaker-window") and previous is not None:
        text += f" (replying to {previous.speaker}: {previous.searchable_text})"
    if style == "speaker-window" and following is not None:
        text += f" (answered by {following.speaker}: {following.searchable_text})"
    return text


def turn_memories(conv: Conversation, style: str = "speaker-context") -> list[dict[str, Any]]:
    """Every turn one episode memory at its session's date, sourced from its own dia_id only."""
    out = []
    for session in conv.sessions:
        turns = session.turns
        for i, t in enumerate(turns):
            prev = turns[i - 1] if i > 0 else None
            nxt = turns[i + 1] if i + 1 < len(turns) else None
            out.append({
                "text": turn_text(t, style, prev, nxt),
                "kind": "episode",
                "event_time": session.date_time,
                "participants": (t.speaker,),
                "source_ids": (t.dia_id,),
            })
    return out


def observation_kind(text: str) -> str:
    """Episode or fact for an annotated observation (the documented rule).

    An observation is an *episode* when it narrates something that happened at a time — it carries
    a time word (yesterday, last week, recently, on <day>, ago, ...) or a past-tense event verb
    (went, attended, visited, ...); otherwise a *fact* (a preference, trait or standing situation).
    """
    import re

    low = text.lower()
    time_words = r"\b(yesterday|today|tonight|tomorrow|last (?:week|month|year|weekend|night|summer|friday|" \
                 r"saturday|sunday|monday|tuesday|wednesday|thursday)|recently|ago|just|this (?:week|month|" \
                 r"year|weekend)|next (?:week|month|year)|on (?:monday|tuesday|wednesday|thursday|friday|" \
                 r"saturday|sunday)|in (?:19|20)\d\d)\b"
    event_verbs = r"\b(went|attended|visited|took|started|finished|joined|won|lost|bought|adopted|" \
                  r"moved|met|got|had|made|painted|ran|participated|received|organized|hosted|completed|" \
                  r"traveled|travelled|celebrated|signed|launched|opened|graduated|decided|volunteered)\b"
    return "episode" if re.search(time_words, low) or re.search(event_verbs, low) else "fact"


def observation_memories(conv: Conversation) -> list[dict[str, Any]]:
    """LoCoMo's annotated facts, one memory each at its session's date, sourced from their dia_ids."""
    out = []
    for o in conv.observations:
        when = conv.session_by_index.get(o.session_index)
        text = o.text
        kind = observation_kind(o.text)
        out.append({
            "text": text,
            "kind": kind,
            "event_time": when.date_time if when is not None else None,
            "participants": (o.speaker,),
            "source_ids": o.dia_ids,
        })
    return out
