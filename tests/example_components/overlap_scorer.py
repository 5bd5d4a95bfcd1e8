"""An example keyword scorer in one file, with a setting: how many query words a memory shares, counting
only words of at least ``min_chars`` characters.

Importing this module registers it as ``index.keyword: example-overlap``; ``index.keyword_params:
{min_chars: 4}`` sets its one setting.
"""

from __future__ import annotations

from typing import Annotated

import numpy as np
import scipy.sparse as sp

from memlab.index.keyword import KEYWORD_SCORERS, KeywordScorer
from memlab.index.text import analyze
from memlab.params import Range


@KEYWORD_SCORERS.register("example-overlap")
class OverlapScorer(KeywordScorer):
    name = "example-overlap"

    def __init__(self, min_chars: Annotated[int, Range(1, 40)] = 1):
        self.min_chars = min_chars

    def _words(self, text: str) -> set[str]:
        return {w for w in analyze(text) if len(w) >= self.min_chars}

    def fit(self, docs: list[str]) -> OverlapScorer:
        self.vocab_: dict[str, int] = {}
        rows, cols = [], []
        for i, doc in enumerate(docs):
            for w in self._words(doc):
                rows.append(i)
                cols.append(self.vocab_.setdefault(w, len(self.vocab_)))
        self.n_docs = len(docs)
        data = np.ones(len(rows), dtype=np.float32)
        self.matrix_ = sp.csr_matrix((data, (rows, cols)), shape=(len(docs), max(1, len(self.vocab_)))).tocsc()
        return self

    def _query_counts(self, query: str) -> tuple[np.ndarray, np.ndarray]:
        js = sorted(self.vocab_[w] for w in self._words(query) if w in self.vocab_)
        return np.asarray(js, dtype=np.int64), np.ones(len(js), dtype=np.float32)

    def _query_weights(self, js: np.ndarray, tf: np.ndarray) -> np.ndarray:
        return tf
