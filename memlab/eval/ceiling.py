"""Answer ceiling@k and answer-bearing@k: what retrieval put in front of the reader, whatever the reader
made of it (reader-independent; read beside evidence Recall@k and context tokens).

The *context* is the reader's memories, each as one *line* the way a reader sees it: the memory's event
date (``7 May 2023``, LoCoMo's answer format) then its text (`memory_line`). Lines are tokenised by the
official rule (`memlab.eval.scoring.stemmed_tokens`: commas, punctuation and a/an/the/and dropped,
Porter-stemmed).

- A **span** is any contiguous run of tokens of one line, ``tokens[i:j]``, of any length; a span never
  crosses two memories.
- **Answer ceiling** — the best official LoCoMo F1 a prediction made of spans can score, i.e. what a
  perfect extractive reader of this context would get. Categories 2 and 4: the best span; category 3:
  the same against the gold cut at its first ``;``; category 1 (the official comma split): one span per
  gold part, joined by commas — the mean over gold parts of each part's best span, which is exactly the
  best the official multi-hop F1 allows. Exact, not sampled: trimming a token that is not (or is an
  excess copy of) a gold token from either end of a span never lowers its F1, so only spans that start
  and end on gold tokens are tried (O(m·n) per line, m gold-token positions, n tokens).
- **Answer-bearing** — every normalised, stemmed token of the gold answer (after the category-3 cut)
  occurs somewhere in the context (set inclusion over the whole context, not one line): the words of the
  answer were there to be found.

Category 5 has neither (NaN): its score is the abstention rule, not a span of the context. A gold answer
with no token left after normalisation has ceiling 0 and is not answer-bearing (no F1 above 0 exists).
Limit: both count literal words only, so an answer that must be computed from the context (a relative
date, a count) is neither bearing nor above ceiling 0 even when a reasoning reader could derive it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from memlab.data.locomo import format_day
from memlab.eval.scoring import stemmed_tokens


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


def best_span_f1(gold: Sequence[str], lines_tokens: Iterable[Sequence[str]]) -> float:
    """Highest token F1 (official multiset F1) of any contiguous span of any line against ``gold`` tokens."""
    need = Counter(gold)
    g = len(gold)
    if not g:
        return 0.0
    best = 0.0
    for toks in lines_tokens:
        starts = [i for i, t in enumerate(toks) if t in need]
        for i in starts:
            have: Counter[str] = Counter()
            same = 0
            for j in range(i, len(toks)):
                t = toks[j]
                if t in need:
                    if have[t] < need[t]:
                        same += 1
                    have[t] += 1
                    f1 = 2 * same / (j - i + 1 + g)
                    if f1 > best:
                        best = f1
                        if best == 1.0:
                            return 1.0
    return best


def answer_ceiling(answer: Any, category: int, lines: Sequence[str]) -> float:
    """The answer ceiling of one question over its context ``lines`` (see the module doc); NaN for category 5."""
    if int(category) == 5:
        return math.nan
    toks = [stemmed_tokens(s) for s in lines]
    parts = gold_parts(answer, int(category))
    return math.fsum(best_span_f1(stemmed_tokens(p), toks) for p in parts) / len(parts)


def answer_bearing(answer: Any, category: int, lines: Sequence[str]) -> float:
    """1.0 when every gold token occurs in the context ``lines``, else 0.0; NaN for category 5."""
    if int(category) == 5:
        return math.nan
    gold = set(stemmed_tokens(" ".join(gold_parts(answer, int(category)))))
    if not gold:
        return 0.0
    have = {t for s in lines for t in stemmed_tokens(s)}
    return float(gold <= have)


def bearing_lines(answer: Any, category: int, lines: Sequence[str]) -> list[int]:
    """Indices of the lines that hold at least one gold token (which memories carried the answer)."""
    gold = set(stemmed_tokens(" ".join(gold_parts(answer, int(category)))))
    return [i for i, s in enumerate(lines) if gold & set(stemmed_tokens(s))]
