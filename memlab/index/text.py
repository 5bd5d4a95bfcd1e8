"""Text analysis shared by the keyword scorers, tfidf-lsa and the Jaccard rules."""

from __future__ import annotations

import re
from functools import lru_cache

from memlab.index.stop_words import ENGLISH_STOP_WORDS
from memlab.stemming import stem

_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")


def stop_words() -> frozenset[str]:
    """scikit-learn's English stop words (`memlab.index.stop_words`: the list without importing scikit-learn)."""
    return ENGLISH_STOP_WORDS


def words(text: str) -> list[str]:
    """Lower-cased word tokens (apostrophe suffixes folded: "Caroline's" -> "caroline")."""
    return [w.split("'")[0] for w in _WORD.findall(text.lower())]


@lru_cache(maxsize=200_000)
def analyze(text: str) -> tuple[str, ...]:
    """Stemmed content words: stop words dropped, Porter stems (the keyword scorers' vocabulary)."""
    stops = stop_words()
    return tuple(stem(w) for w in words(text) if w not in stops and w)


def word_set(text: str) -> frozenset[str]:
    """The word set of DESIGN's Jaccard rules (dedupe, reconcile): lower-cased words, no stemming."""
    return frozenset(words(text))


def jaccard(a: frozenset[str] | set[str], b: frozenset[str] | set[str]) -> float:
    if not a and not b:
        return 0.0
    return len(a & b) / len(a | b)
