"""Reciprocal Rank Fusion and the dedupe rule (DESIGN: Search options)."""

from __future__ import annotations

from collections.abc import Sequence

from memlab.index.text import jaccard, word_set


def rrf(rank_lists: Sequence[Sequence[int]], k: int = 60) -> dict[int, float]:
    """score(d) = sum over the lists containing d of 1 / (k + rank), rank starting at 1."""
    scores: dict[int, float] = {}
    for lst in rank_lists:
        for r, doc in enumerate(lst, start=1):
            scores[doc] = scores.get(doc, 0.0) + 1.0 / (k + r)
    return scores


def dedupe(texts_in_rank_order: Sequence[str], threshold: float = 0.80, limit: int | None = None
           ) -> tuple[list[int], list[tuple[int, int, float]]]:
    """Keep a text unless its word set has Jaccard >= ``threshold`` with a higher-ranked kept one.

    Returns (kept positions, [(dropped position, kept position, jaccard)]); stops once ``limit`` are kept.
    """
    kept: list[int] = []
    sets: list[frozenset[str]] = []
    dropped: list[tuple[int, int, float]] = []
    for i, t in enumerate(texts_in_rank_order):
        if limit is not None and len(kept) >= limit:
            break
        ws = word_set(t)
        dup = None
        for j, ks in zip(kept, sets):
            jac = jaccard(ws, ks)
            if jac >= threshold:
                dup = (i, j, jac)
                break
        if dup is None:
            kept.append(i)
            sets.append(ws)
        else:
            dropped.append(dup)
    return kept, dropped
