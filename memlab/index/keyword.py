"""Keyword scorers over one corpus: TF-IDF cosine (scikit-learn) and BM25 (Okapi), both sparse.

Both analyse text with `memlab.index.text.analyze` (stemmed content words) and score a query
against every document by one sparse product, so a query costs microseconds at LoCoMo size.
A learned sparse scorer, ``splade`` (`memlab.index.keyword_splade`), shares the posting-list product.

A scorer's settings are its constructor's arguments (`memlab.params`; ``index.keyword.params``); an index names
a scorer with settings by one spec string, ``bm25(k1=1.5)`` (`memlab.params.spec_text`), which
`make_keyword_scorer` reads back.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Annotated

import numpy as np
import scipy.sparse as sp

from memlab.index.text import analyze
from memlab.params import Component, Range, check_params, parse_spec
from memlab.registry import Registry

#: Keyword scorers by name (``index.keyword``).
KEYWORD_SCORERS: Registry[KeywordScorer] = Registry("keyword scorer")


def _count_matrix(docs: list[str]) -> tuple[sp.csr_matrix, dict[str, int]]:
    vocab: dict[str, int] = {}
    rows, cols, vals = [], [], []
    for i, d in enumerate(docs):
        counts: dict[int, int] = {}
        for t in analyze(d):
            j = vocab.setdefault(t, len(vocab))
            counts[j] = counts.get(j, 0) + 1
        rows.extend([i] * len(counts))
        cols.extend(counts.keys())
        vals.extend(counts.values())
    m = sp.csr_matrix((np.asarray(vals, dtype=np.float32), (rows, cols)), shape=(len(docs), max(1, len(vocab))))
    return m, vocab


class KeywordScorer(Component, ABC):
    name: str
    matrix_: sp.csc_matrix
    #: True for a scorer whose constructor takes ``cache_path`` (a model-encoded scorer keeps its vectors there)
    uses_cache: bool = False

    def _accumulate(self, js: np.ndarray, w: np.ndarray) -> np.ndarray:
        """scores = matrix[:, js] @ w, walking the CSC posting lists (no scipy slicing overhead)."""
        m = self.matrix_
        out = np.zeros(self.n_docs, dtype=np.float32)
        for j, wj in zip(js.tolist(), w.tolist()):
            a, b = m.indptr[j], m.indptr[j + 1]
            out[m.indices[a:b]] += m.data[a:b] * wj
        return out

    @abstractmethod
    def fit(self, docs: list[str]) -> KeywordScorer: ...

    def encode_queries(self, queries: list[str], cached: bool = True) -> None:
        """Encode queries ahead of search where that costs a model pass (``cached=False``: redo it, to time
        it); word-count scorers have nothing to do."""
        return None

    def encode_ahead(self, texts: list[str]) -> None:
        """Encode texts this scorer will be fit on (`memlab.index.HybridIndex.encode_ahead`: every key's, in one
        batched pass) where that costs a model pass; word-count scorers have nothing to do."""
        return None

    @abstractmethod
    def _query_weights(self, js: np.ndarray, tf: np.ndarray) -> np.ndarray:
        """Weights of the query's known terms ``js`` (with counts ``tf``)."""

    def score(self, query: str) -> np.ndarray:
        """One score per document (0 where no query term occurs); read-only, since the last query's scores are
        kept and given again to the next identical call (an answer's search and the trace's deeper search ask
        for the same question one after the other); a refit (a new matrix) is never served old scores."""
        last = self.__dict__.get("_last_scores")
        if last is not None and last[0] == query and last[1] is self.matrix_:
            return last[2]
        js, tf = self._query_counts(query)
        out = (np.zeros(self.n_docs, dtype=np.float32) if len(js) == 0
               else self._accumulate(js, self._query_weights(js, tf)))
        out.flags.writeable = False
        self._last_scores = (query, self.matrix_, out)
        return out

    def _query_counts(self, query: str) -> tuple[np.ndarray, np.ndarray]:
        counts: dict[int, int] = {}
        for t in analyze(query):
            j = self.vocab_.get(t)
            if j is not None:
                counts[j] = counts.get(j, 0) + 1
        return (np.fromiter(counts.keys(), dtype=np.int64, count=len(counts)),
                np.fromiter(counts.values(), dtype=np.float32, count=len(counts)))


@KEYWORD_SCORERS.register("tfidf")
class TfidfScorer(KeywordScorer):
    """Cosine between sublinear TF-IDF vectors (smooth idf, as scikit-learn's TfidfVectorizer)."""

    name = "tfidf"

    def fit(self, docs: list[str]) -> TfidfScorer:
        counts, self.vocab_ = _count_matrix(docs)
        n = counts.shape[0]
        df = np.bincount(counts.indices, minlength=counts.shape[1]).astype(np.float32)
        self.idf_ = (np.log((1 + n) / (1 + df)) + 1).astype(np.float32)
        m = counts.copy()
        m.data = 1.0 + np.log(m.data)
        m = m.multiply(self.idf_[None, :]).tocsr()
        norms = np.sqrt(np.asarray(m.multiply(m).sum(axis=1)).ravel())
        norms[norms == 0] = 1.0
        self.matrix_ = sp.diags(1.0 / norms).dot(m).tocsc().astype(np.float32)
        self.n_docs = n
        return self

    def _query_weights(self, js: np.ndarray, tf: np.ndarray) -> np.ndarray:
        w = (1.0 + np.log(tf)) * self.idf_[js]
        return w / np.linalg.norm(w)


@KEYWORD_SCORERS.register("bm25")
class BM25Scorer(KeywordScorer):
    """Okapi BM25 with idf = ln(1 + (N - df + 0.5) / (df + 0.5)) (the Lucene form, never negative)."""

    name = "bm25"

    def __init__(self, k1: Annotated[float, Range(0)] = 1.2, b: Annotated[float, Range(0, 1)] = 0.75):
        self.k1 = k1
        self.b = b

    def fit(self, docs: list[str]) -> BM25Scorer:
        counts, self.vocab_ = _count_matrix(docs)
        n = counts.shape[0]
        df = np.bincount(counts.indices, minlength=counts.shape[1]).astype(np.float32)
        self.idf_ = np.log(1.0 + (n - df + 0.5) / (df + 0.5)).astype(np.float32)
        dl = np.asarray(counts.sum(axis=1)).ravel()
        avgdl = float(dl.mean()) if n else 1.0
        m = counts.tocoo()
        denom = m.data + self.k1 * (1 - self.b + self.b * dl[m.row] / max(avgdl, 1e-9))
        w = m.data * (self.k1 + 1) / denom
        self.matrix_ = sp.csr_matrix((w.astype(np.float32), (m.row, m.col)), shape=counts.shape).tocsc()
        self.n_docs = n
        return self

    def _query_weights(self, js: np.ndarray, tf: np.ndarray) -> np.ndarray:
        return self.idf_[js] * tf


def make_keyword_scorer(spec: str, cache_path: str | None = None) -> KeywordScorer:
    """A scorer by its spec, a name or ``name(k=<json>,...)`` with settings (`memlab.params.parse_spec`), checked
    against its declared parameters; ``cache_path`` reaches only the scorers that keep encoded vectors
    (`uses_cache`)."""
    name, params = parse_spec(spec)
    cls = KEYWORD_SCORERS.get(name)
    params = check_params(cls, params, f"keyword scorer {name!r}")
    return cls(cache_path=cache_path, **params) if cls.uses_cache and cache_path else cls(**params)


from memlab.index import keyword_splade  # noqa: E402,F401  (registers splade)
