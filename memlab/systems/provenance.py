"""Provenance for black boxes: which turns a memory came from, when the system does not say.

Each stored memory is aligned to the turns of the session(s) it was ingested from by two signals: lexical
(the share of the memory's stemmed words found in the turn) and dense (cosine of TF-IDF vectors fitted on those
turns, or of a given embedder's vectors). The score is their mean; the best turn and any within ``ratio`` of it
(at most ``max_ids``) become the memory's recovered source ids, and the ``keep`` best candidates with their
scores go to the trace. Validated against memlab's own pipeline, whose provenance is known
(``benchmarks/provenance_recovery.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memlab.index.text import analyze
from memlab.systems.base import Message


def _terms(text: str) -> list[str]:
    """Stemmed content words (stop words would make every turn look alike)."""
    return list(analyze(text))


@dataclass(frozen=True)
class Alignment:
    """Recovered source ids and the top candidates ``(turn_id, score, lexical, dense)``."""

    source_ids: tuple[str, ...]
    candidates: tuple[tuple[str, float, float, float], ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {"source_ids": list(self.source_ids),
                "candidates": [{"turn_id": t, "score": round(s, 4), "lexical": round(lx, 4), "dense": round(d, 4)}
                               for t, s, lx, d in self.candidates]}


class ProvenanceAligner:
    """``align(texts, turns)``: one `Alignment` per memory text against the turns it may have come from."""

    def __init__(self, max_ids: int = 2, keep: int = 3, ratio: float = 0.8, min_score: float = 0.05,
                 embed: Callable[[list[str]], np.ndarray] | None = None):
        self.max_ids = max_ids
        self.keep = keep
        self.ratio = ratio
        self.min_score = min_score
        self.embed = embed

    def _dense(self, texts: list[str], turns: list[str]) -> np.ndarray:
        if self.embed is not None:
            a, b = np.asarray(self.embed(texts), dtype=float), np.asarray(self.embed(turns), dtype=float)
        else:
            from sklearn.feature_extraction.text import TfidfVectorizer

            vec = TfidfVectorizer(analyzer=_terms, sublinear_tf=True)
            m = vec.fit_transform(turns + texts).toarray()
            b, a = m[:len(turns)], m[len(turns):]
        a = a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)
        b = b / np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-12)
        return np.clip(a @ b.T, 0.0, 1.0)

    def align(self, texts: Sequence[str], turns: Sequence[Message]) -> list[Alignment]:
        texts, turns = list(texts), list(turns)
        if not texts:
            return []
        if not turns:
            return [Alignment(()) for _ in texts]
        said = [f"{t.speaker}: {t.text}" for t in turns]  # a rewritten fact names who said it
        dense = self._dense(texts, said)
        turn_words = [frozenset(_terms(t)) for t in said]
        out = []
        for i, text in enumerate(texts):
            words = frozenset(_terms(text))
            lex = np.array([len(words & tw) / len(words) if words else 0.0 for tw in turn_words])
            score = (lex + dense[i]) / 2
            order = np.argsort(-score, kind="stable")
            cands = tuple((turns[j].turn_id, float(score[j]), float(lex[j]), float(dense[i, j]))
                          for j in order[:self.keep])
            top = float(score[order[0]])
            ids = tuple(turns[j].turn_id for j in order[:self.max_ids]
                        if top >= self.min_score and score[j] >= self.ratio * top)
            out.append(Alignment(ids, cands))
        return out
