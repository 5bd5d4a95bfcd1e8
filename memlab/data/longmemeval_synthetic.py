"""Synthetic LongMemEval-format files (no copy of the data is shipped or reachable here): for tests, the demo
and the scale benchmark."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from memlab.data.longmemeval import ASSISTANT, QUESTION_TYPES, USER

#: The published shapes, approximately: S about 50 sessions (~115 k tokens) per question, M about 500.
SYNTHETIC_SHAPES: dict[str, dict[str, int]] = {"S": {"sessions": 50, "turns": 10, "words": 170},
                                                "M": {"sessions": 500, "turns": 10, "words": 125}}
_WORDS = ("garden trip recipe guitar budget marathon python novel coffee museum ticket flight dentist piano "
          "yoga laptop camera painting soccer birthday wedding hotel salary apartment puppy bicycle jacket "
          "concert library vaccine kayak pottery tennis cousin manager invoice sunset island market").split()


_KEY_WORDS = "amber crimson silver velvet golden hidden quiet rapid".split()
_KEY_NOUNS = "falcon harbor lantern meadow orchard compass glacier canyon".split()


def synthetic_item(i: int, sessions: int, turns: int, words: int, rng: Any) -> dict[str, Any]:
    """Question ``i`` of a synthetic LongMemEval-format file (no copy of the data is shipped or reachable):
    filler sessions of random words plus one short evidence turn (``has_answer``) naming a code word;
    types cycle through every published type, every 17th question is an abstention one (no evidence)."""
    qtype = QUESTION_TYPES[i % len(QUESTION_TYPES)]
    abstain = i % 17 == 0
    key = f"{rng.choice(_KEY_WORDS)} {rng.choice(_KEY_NOUNS)} {i}"
    ans_s = rng.randrange(sessions)
    haystack, dates, ids = [], [], []
    for s in range(sessions):
        msgs: list[dict[str, Any]] = []
        for t in range(turns):
            text = " ".join(rng.choice(_WORDS) for _ in range(words))
            msg: dict[str, Any] = {"role": USER if t % 2 == 0 else ASSISTANT, "content": text}
            if s == ans_s and t == 0 and not abstain:
                msg = {"role": USER, "content": f"My code word is {key}.", "has_answer": True}
            msgs.append(msg)
        haystack.append(msgs)
        day = 1 + s // 24
        dates.append(f"2023/{1 + day // 28:02d}/{1 + day % 28:02d} (Mon) {s % 24:02d}:00")
        ids.append(f"q{i}_s{s}")
    return {"question_id": f"q{i}" + ("_abs" if abstain else ""), "question_type": qtype,
            "question": "What is my code word?", "answer": key if not abstain else "You never said a code word.",
            "question_date": "2024/12/31 (Tue) 12:00", "haystack_session_ids": ids, "haystack_dates": dates,
            "haystack_sessions": haystack, "answer_session_ids": [] if abstain else [ids[ans_s]]}


def write_synthetic(path: str | Path, questions: int, sessions: int, turns: int = 10, words: int = 125,
                    seed: int = 0) -> int:
    """Stream ``questions`` synthetic items (`synthetic_item`) into ``path`` as one JSON list, never the whole
    list in memory; returns the file's size in bytes."""
    import random

    rng = random.Random(seed)
    p = Path(path)
    with open(p, "w", encoding="utf-8") as f:
        f.write("[")
        for i in range(questions):
            f.write(("," if i else "") + json.dumps(synthetic_item(i, sessions, turns, words, rng)))
        f.write("]")
    return p.stat().st_size
