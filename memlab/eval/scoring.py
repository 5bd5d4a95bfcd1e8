"""The official LoCoMo QA metric (``task_eval/evaluation.py``), plus BLEU-1, exact match and evidence recall.

Parity rules, each mirrored from the official scorer:
- normalise: drop commas, lowercase, strip ASCII punctuation, replace the words a/an/the/and by a
  space (``regex`` word boundaries, as upstream), collapse white space; Porter-stem every token;
- token F1 over the multiset of stemmed tokens, 0 when nothing is shared;
- category 1 (multi-hop): split prediction and answer on ``,``; mean over answer parts of the best
  F1 against any prediction part;
- category 2/4: plain token F1; category 3: answer cut at its first ``;`` first;
- category 5 (adversarial): 1 if the prediction contains "no information available" or
  "not mentioned" (any case), else 0; the gold answer is not used.
"""

from __future__ import annotations

import math
import string
from collections import Counter
from collections.abc import Iterable, Sequence
from functools import lru_cache

import regex

from memlab.stemming import stem

_PUNCT = str.maketrans("", "", string.punctuation)  # deleted by one C call, not a Python loop per character
_ARTICLES = regex.compile(r"\b(a|an|the|and)\b")
ABSTAIN_PHRASES = ("no information available", "not mentioned")


def normalize_answer(s: str) -> str:
    s = s.replace(",", "").lower()
    s = s.translate(_PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


@lru_cache(maxsize=200_000)
def stemmed_tokens(s: str) -> tuple[str, ...]:
    return tuple(map(stem, normalize_answer(s).split()))


def token_f1(prediction: str, ground_truth: str) -> float:
    """Upstream ``f1_score``: harmonic mean of precision and recall over stemmed token multisets."""
    p, g = stemmed_tokens(prediction), stemmed_tokens(ground_truth)
    same = sum((Counter(p) & Counter(g)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return (2 * precision * recall) / (precision + recall)


def multi_answer_f1(prediction: str, ground_truth: str) -> float:
    """Upstream ``f1``: mean over comma-separated answer parts of the best F1 over prediction parts."""
    preds = [p.strip() for p in prediction.split(",")]
    gts = [g.strip() for g in ground_truth.split(",")]
    return math.fsum(max(token_f1(p, g) for p in preds) for g in gts) / len(gts)


def is_abstention(prediction: str) -> bool:
    low = prediction.lower()
    return any(ph in low for ph in ABSTAIN_PHRASES)


def _gold(answer: str | int | float | None, category: int) -> str:
    if answer is None:
        raise ValueError(f"category {category} needs a gold answer, got None (only category 5 may omit it)")
    gold = str(answer)
    if category == 3:
        gold = gold.split(";")[0].strip()
    return gold


def score_answer(prediction: str, answer: str | int | float | None, category: int) -> float:
    """The official LoCoMo F1 of one prediction (``answer`` None is allowed for category 5)."""
    if prediction is None:
        prediction = ""
    prediction = str(prediction)
    if category == 5:
        return 1.0 if is_abstention(prediction) else 0.0
    if category in (2, 3, 4, 6, 7):  # 6, 7: LongMemEval's knowledge-update and temporal-reasoning
        return token_f1(prediction, _gold(answer, category))
    if category == 1:
        return multi_answer_f1(prediction, _gold(answer, category))
    raise ValueError(f"category must be one of 1-5 (LoCoMo) or 1-7 (LongMemEval); got {category!r}")


def exact_match(prediction: str, answer: str | int | float | None, category: int) -> float:
    """Upstream ``exact_match_score``: equal sets of normalised tokens; abstention rule for category 5."""
    if category == 5:
        return 1.0 if is_abstention(str(prediction or "")) else 0.0
    gold = _gold(answer, category)
    return float(set(normalize_answer(str(prediction or "")).split()) == set(normalize_answer(gold).split()))


def bleu1(prediction: str, answer: str | int | float | None, category: int) -> float:
    """Sentence BLEU-1 on normalised (unstemmed) tokens: clipped unigram precision x brevity penalty.

    Category 5 uses the abstention rule, like F1, since its gold answer is a trap, not a target.
    """
    if category == 5:
        return 1.0 if is_abstention(str(prediction or "")) else 0.0
    cand = normalize_answer(str(prediction or "")).split()
    ref = normalize_answer(_gold(answer, category)).split()
    if not cand or not ref:
        return 0.0
    clipped = sum((Counter(cand) & Counter(ref)).values())
    if clipped == 0:
        return 0.0
    bp = 1.0 if len(cand) > len(ref) else math.exp(1 - len(ref) / len(cand))
    return bp * clipped / len(cand)


def evidence_recall(retrieved_ids: Iterable[str], evidence: Sequence[str]) -> float:
    """Share of evidence dialog ids among the retrieved ids; session ids (``S3``) match their turns.

    NaN when the question has no evidence, so it drops out of means instead of counting as 1 or 0.
    """
    evidence = list(evidence)
    if not evidence:
        return float("nan")
    got = set(retrieved_ids)
    sessions = {r[1:] for r in got if r.startswith("S")}
    hit = sum(1 for ev in evidence if ev in got or ev.split(":")[0][1:] in sessions)
    return hit / len(evidence)
