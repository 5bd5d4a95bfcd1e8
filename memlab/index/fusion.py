"""Score fusion (RRF and z-score), the participant boost and the dedupe rule (DESIGN: Search options).

The hybrid search ranks each retriever's list, then one `Fusion` turns the lists into one score per
memory. Two fusions are registered (``FUSIONS``, a name -> class registry filled by `register_fusion`):

- ``rrf``: Reciprocal Rank Fusion, score = sum over the lists containing d of w / (k + rank), rank from 1
  (DESIGN's rule; w = 1 for every list by default).
- ``zscore``: every list's scores standardised over the memories it ranks, (s - mean) / std, then a
  weighted sum; a memory absent from a list gets that list's lowest z. Unlike RRF it keeps *how much*
  better the top hits are, which matters when one retriever is much sharper than the other (BM25 on
  LoCoMo: ``benchmarks/retrieval_recall.py``).

List names (the keys of ``weights``): ``dense``, ``keyword`` and, with observation-aware indexing,
``note_dense`` (memories that cite a turn, scored on their own and projected onto that turn) and, when the
index has them, ``sparse`` (a second lexical scorer such as SPLADE over the keyword texts) and ``session``
(each turn scored by BM25 over its whole session).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from memlab.index.text import jaccard, word_set
from memlab.params import Component
from memlab.registry import Registry

#: The lists a hybrid search can fuse, by name (what ``fusion_weights`` may weight).
LIST_NAMES = ("dense", "keyword", "note_dense", "sparse", "session")


@dataclass(frozen=True)
class RankedList:
    """One retriever's output over ``n`` memories: row ids best first, and a score per row (NaN = absent)."""

    name: str
    rows: np.ndarray
    scores: np.ndarray


def check_weights(weights: Mapping[str, float] | None, where: str = "fusion_weights") -> dict[str, float]:
    """Validate ``{list name: weight >= 0}``; unknown names and negative or non-numeric weights are errors."""
    if weights is None:
        return {}
    if not isinstance(weights, Mapping):
        raise ValueError(f"{where}: expected a mapping of list name to weight, got {weights!r}")
    out = {}
    for name, w in weights.items():
        if name not in LIST_NAMES:
            raise ValueError(f"{where}: unknown list {name!r}; expected some of {', '.join(LIST_NAMES)}")
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not np.isfinite(w) or w < 0:
            raise ValueError(f"{where}.{name}: expected a number >= 0, got {w!r}")
        out[name] = float(w)
    return out


class Fusion(Component, ABC):
    """Constructor stores parameters; ``fuse`` returns one score per memory (-inf where no list has it)."""

    name: str

    def __init__(self, weights: Mapping[str, float] | None = None):
        self.weights = check_weights(weights)

    def weight(self, name: str) -> float:
        return self.weights.get(name, 1.0)

    @abstractmethod
    def fuse(self, lists: Sequence[RankedList], n: int) -> np.ndarray: ...


#: Fusions by name (``retrieval.fusion``): the same `memlab.registry.Registry` as every other family.
FUSIONS: Registry[Fusion] = Registry("fusion")


def register_fusion(name: str) -> Callable[[type[Fusion]], type[Fusion]]:
    """Class decorator: make a `Fusion` available by name to `make_fusion` and config validation."""

    def deco(cls: type[Fusion]) -> type[Fusion]:
        cls.name = name
        return FUSIONS.register(name)(cls)

    return deco


def rrf_scores(rank_lists: Sequence[np.ndarray], n: int, k: int = 60,
               weights: Sequence[float] | None = None) -> np.ndarray:
    """score[d] = sum over the lists containing d of w / (k + rank), rank starting at 1; -inf where absent."""
    out = np.zeros(n, dtype=np.float64)
    seen = np.zeros(n, dtype=bool)
    for i, lst in enumerate(rank_lists):
        lst = np.asarray(lst, dtype=np.int64)
        w = 1.0 if weights is None else weights[i]
        out[lst] += w / (k + np.arange(1, len(lst) + 1))
        seen[lst] = True
    out[~seen] = -np.inf
    return out


def rrf(rank_lists: Sequence[Sequence[Any]], k: int = 60) -> dict[Any, float]:
    """`rrf_scores` over arbitrary document ids: ``{doc: score}`` for every doc in some list."""
    ids: dict[Any, int] = {}
    for lst in rank_lists:
        for doc in lst:
            ids.setdefault(doc, len(ids))
    arrays = [np.fromiter((ids[d] for d in lst), dtype=np.int64, count=len(lst)) for lst in rank_lists]
    scores = rrf_scores(arrays, len(ids), k)
    return {doc: float(scores[i]) for doc, i in ids.items()}


def standardize(scores: np.ndarray) -> np.ndarray:
    """z = (s - mean) / std over the present (non-NaN) entries; absent entries get the lowest z.

    A list whose present scores are all equal (std 0) carries no ordering: every entry gets 0.
    """
    s = np.asarray(scores, dtype=np.float64)
    present = ~np.isnan(s)
    z = np.zeros(len(s), dtype=np.float64)
    if not present.any():
        return z
    vals = s[present]
    sd = vals.std()
    if sd > 0:
        z[present] = (vals - vals.mean()) / sd
        z[~present] = z[present].min()
    return z


def zscore_scores(score_lists: Sequence[np.ndarray], weights: Sequence[float] | None = None) -> np.ndarray:
    """Weighted sum of standardised lists; -inf where no list has the entry."""
    n = len(score_lists[0]) if score_lists else 0
    out = np.zeros(n, dtype=np.float64)
    seen = np.zeros(n, dtype=bool)
    for i, s in enumerate(score_lists):
        w = 1.0 if weights is None else weights[i]
        out += w * standardize(s)
        seen |= ~np.isnan(np.asarray(s, dtype=np.float64))
    out[~seen] = -np.inf
    return out


@register_fusion("rrf")
class RRFFusion(Fusion):
    """Reciprocal Rank Fusion (DESIGN's hybrid rule), optionally weighted per list."""

    def __init__(self, k: int = 60, weights: Mapping[str, float] | None = None):
        super().__init__(weights)
        if k <= 0:
            raise ValueError(f"rrf k: expected > 0, got {k}")
        self.k = k

    def fuse(self, lists: Sequence[RankedList], n: int) -> np.ndarray:
        return rrf_scores([lst.rows for lst in lists], n, self.k, [self.weight(lst.name) for lst in lists])


@register_fusion("zscore")
class ZScoreFusion(Fusion):
    """Weighted sum of per-list standardised scores (see the module docstring)."""

    def __init__(self, k: int = 60, weights: Mapping[str, float] | None = None):
        super().__init__(weights)
        self.k = k  # unused: accepted so every fusion builds from the same search options

    def fuse(self, lists: Sequence[RankedList], n: int) -> np.ndarray:
        scores = []
        for lst in lists:
            s = np.full(n, np.nan, dtype=np.float64)
            s[lst.rows] = lst.scores[lst.rows]
            scores.append(s)
        return zscore_scores(scores, [self.weight(lst.name) for lst in lists])


def make_fusion(name: str, k: int = 60, weights: Mapping[str, float] | None = None) -> Fusion:
    if name not in FUSIONS:
        raise ValueError(f"fusion: expected one of {sorted(FUSIONS)}, got {name!r}")
    cls = FUSIONS.get(name)
    return cls(k=k, weights=weights)


def participant_boost(fused: np.ndarray, named: np.ndarray, sigma: float = 1.0) -> np.ndarray:
    """Add ``sigma`` standard deviations of the fused scores to the memories of a participant the query names.

    A bounded nudge: a memory of the named person moves ahead of others only where their fused scores
    are within ``sigma`` standard deviations, so a question that names the wrong person (LoCoMo's
    adversarial category 5) still finds the strong match about the other one. (The earlier rule fused
    extra lists restricted to the named person, which doubled their weight and sank category 5.)
    The bound is only as meaningful as the fused scores: z-score fusion keeps score gaps, RRF flattens
    them into rank gaps, so under RRF one sigma can still lift a named memory over a much better match.
    """
    out = np.array(fused, dtype=np.float64, copy=True)
    cand = np.isfinite(out)
    if sigma == 0 or not (named & cand).any() or cand.sum() < 2:
        return out
    out[named & cand] += sigma * out[cand].std()
    return out


def dedupe_sets(word_sets_in_rank_order: Iterable[frozenset[str]], threshold: float = 0.80,
                limit: int | None = None) -> tuple[list[int], list[tuple[int, int, float]]]:
    """Keep an item unless its word set has Jaccard >= ``threshold`` with a higher-ranked kept one.

    Returns (kept positions, [(dropped position, kept position, jaccard)]); stops once ``limit`` are kept.
    Jaccard >= t needs t <= |a|/|b| <= 1/t, so most pairs skip the set algebra.
    """
    if not 0 < threshold <= 1:
        raise ValueError(f"dedupe threshold: expected 0 < t <= 1, got {threshold}")
    kept: list[int] = []
    sets: list[frozenset[str]] = []
    dropped: list[tuple[int, int, float]] = []
    for i, ws in enumerate(word_sets_in_rank_order):
        if limit is not None and len(kept) >= limit:
            break
        lw = len(ws)
        dup = None
        for j, ks in zip(kept, sets):
            if threshold * len(ks) <= lw <= len(ks) / threshold and (jac := jaccard(ws, ks)) >= threshold:
                dup = (i, j, jac)
                break
        if dup is None:
            kept.append(i)
            sets.append(ws)
        else:
            dropped.append(dup)
    return kept, dropped


def dedupe(texts_in_rank_order: Sequence[str], threshold: float = 0.80, limit: int | None = None
           ) -> tuple[list[int], list[tuple[int, int, float]]]:
    """`dedupe_sets` over texts (their `word_set`)."""
    return dedupe_sets([word_set(t) for t in texts_in_rank_order], threshold, limit)
