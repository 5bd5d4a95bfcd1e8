"""The Porter stemmer that both the keyword scorers (`memlab.index.text`) and the official LoCoMo F1
(`memlab.eval.scoring`) use: one instance, one cache, at the bottom of the package so that scoring a run does
not import the index libraries."""

from __future__ import annotations

from functools import cache, lru_cache
from typing import Any


@cache
def _porter() -> Any:
    """nltk's Porter stemmer (its default NLTK_EXTENSIONS mode), made on first use: importing nltk costs seconds
    of CPU (it imports scipy.stats and scikit-learn's classifiers), which a command that never stems should not
    pay."""
    from nltk.stem.porter import PorterStemmer

    return PorterStemmer()


@lru_cache(maxsize=500_000)
def stem(word: str) -> str:
    return _porter().stem(word)
