"""Reconcile before write: each proposed add is compared with at most 3 stored candidates.

Two independent signals per candidate: the backend's relevance score and the token Jaccard of the
two texts (`memlab.index.text.word_set`). Tiers, thresholds being experiment parameters:

- *skip*   when score >= 0.90 or Jaccard >= 0.70 (the memory is already there: drop the add);
- *update* when score >= 0.60 or Jaccard >= 0.40 (rewrite the add as an update of that candidate);
- *keep*   otherwise (the add stands).

The best candidate is chosen by tier first, then score, then Jaccard (then id, for determinism).
A failed reconcile search keeps the proposed op (never drop data on uncertainty); an add that would
become an update while updates are disabled stays an add.

Which score: scores live on different scales per signal, so the index names the one reconcile
reads (``HybridIndex.reconcile_signal``), and `reconcile_score` takes it:

- ``dense``: the dense cosine in [-1, 1], for pretrained embedders (minilm, ``litellm:<model>``);
- ``tfidf``: the TF-IDF cosine in [0, 1] (``SearchHit.text_score``, computed whatever the keyword
  scorer, BM25 included), for the corpus-fitted tfidf-lsa embedder, whose cosines on a small
  per-user corpus run high (few SVD dimensions: unrelated memories of one person score above
  0.6: with the observations extractor the dense score rewrote or skipped 58-93 % of a
  conversation's adds (conv-49, conv-26), the TF-IDF cosine 1-13 %);
- ``jaccard``: no score (0), Jaccard decides alone (an ablation).

BM25 scores are unbounded and never compared with these thresholds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from memlab.extract.ops import MemoryOp
from memlab.index.text import jaccard, word_set
from memlab.memory.entry import MemoryEntry
from memlab.memory.search_types import SearchHit

log = logging.getLogger(__name__)
#: How reconcile treated one op (`Decision.tier`).
Tier = Literal["skip", "update", "keep", "search-failed", "not-an-add", "disabled", "verbatim"]

TIERS = {"skip": 2, "update": 1, "keep": 0}


@dataclass(frozen=True)
class ReconcileConfig:
    enabled: bool = True
    skip_score: float = 0.90
    skip_jaccard: float = 0.70
    update_score: float = 0.60
    update_jaccard: float = 0.40
    candidates: int = 3
    updates_enabled: bool = True

    def __post_init__(self) -> None:
        for name in ("skip_score", "skip_jaccard", "update_score", "update_jaccard"):
            v = getattr(self, name)
            if not -1.0 <= v <= 1.0:
                raise ValueError(f"ReconcileConfig.{name}: expected a value in [-1, 1], got {v}")
        if self.candidates < 1:
            raise ValueError(f"ReconcileConfig.candidates: expected >= 1, got {self.candidates}")


@dataclass(frozen=True)
class Decision:
    """What reconcile did to one op, with the evidence (for the extractor trace layer)."""

    tier: Tier
    op: MemoryOp | None  # the op to apply (None when skipped)
    candidate_id: str | None = None
    score: float | None = None
    jaccard: float | None = None
    rewritten: bool = False
    proposed: MemoryOp | None = None
    """The op as the extractor proposed it (kept for the trace, also when skipped or rewritten)."""
    error: str | None = None
    """Why the candidate search failed (tier ``search-failed``: the op is kept unreconciled)."""

    def to_dict(self) -> dict:
        return {"tier": self.tier, "candidate_id": self.candidate_id, "score": self.score, "jaccard": self.jaccard,
                "rewritten": self.rewritten, "op": None if self.op is None else self.op.to_dict(),
                "proposed": None if self.proposed is None else self.proposed.to_dict(), "error": self.error}


SIGNALS = ("dense", "tfidf", "jaccard")


def reconcile_score(hit: SearchHit, signal: str = "dense") -> float:
    """The backend relevance score reconcile compares with its thresholds (see module doc)."""
    if signal not in SIGNALS:
        raise ValueError(f"reconcile signal: expected one of {SIGNALS}, got {signal!r}")
    if signal == "dense":
        return float(hit.dense_score) if hit.dense_score is not None else 0.0
    if signal == "tfidf":
        return float(hit.text_score) if hit.text_score is not None else 0.0
    return 0.0


def tier_of(score: float, jac: float, cfg: ReconcileConfig) -> str:
    if score >= cfg.skip_score or jac >= cfg.skip_jaccard:
        return "skip"
    if score >= cfg.update_score or jac >= cfg.update_jaccard:
        return "update"
    return "keep"


def decide(op: MemoryOp, candidates: Sequence[tuple[MemoryEntry, float]], cfg: ReconcileConfig) -> Decision:
    """Pure policy: one proposed op against (entry, score) candidates."""
    return replace(_decide(op, candidates, cfg), proposed=op)


def _decide(op: MemoryOp, candidates: Sequence[tuple[MemoryEntry, float]], cfg: ReconcileConfig) -> Decision:
    if op.action != "add":
        return Decision("not-an-add", op)
    if not cfg.enabled:
        return Decision("disabled", op)
    ws = word_set(op.text)
    best: tuple[int, float, float, str] | None = None
    best_entry: MemoryEntry | None = None
    for entry, score in list(candidates)[: cfg.candidates]:
        jac = jaccard(ws, word_set(entry.text))
        t = TIERS[tier_of(score, jac, cfg)]
        cand = (t, score, jac, entry.id)
        # tier, then score, then Jaccard; the smaller id wins a full tie (deterministic)
        if best is None or (cand[0], cand[1], cand[2]) > (best[0], best[1], best[2]) or (
            (cand[0], cand[1], cand[2]) == (best[0], best[1], best[2]) and cand[3] < best[3]
        ):
            best, best_entry = cand, entry
    if best is None or best_entry is None:
        return Decision("keep", op)
    tier = {2: "skip", 1: "update", 0: "keep"}[best[0]]
    common = {"candidate_id": best_entry.id, "score": best[1], "jaccard": best[2]}
    if tier == "skip":
        return Decision("skip", None, rewritten=True, **common)
    if tier == "update":
        if not cfg.updates_enabled:
            return Decision("update", op, **common)  # update disabled: keep the add
        new = op.with_changes(action="update", memory_id=best_entry.id,
                              note=f"reconcile: add->update (score {best[1]:.3f}, jaccard {best[2]:.3f})")
        return Decision("update", new, rewritten=True, **common)
    return Decision("keep", op, **common)


def reconcile(ops: Sequence[MemoryOp], search: Callable[[str, int], Sequence[SearchHit]],
              cfg: ReconcileConfig, signal: str = "dense") -> list[Decision]:
    """Reconcile every op; ``search(text, n)`` returns the backend's hits for a proposed text."""
    out = []
    for op in ops:
        if op.action != "add" or not cfg.enabled:
            out.append(decide(op, [], cfg))
            continue
        try:
            hits = search(op.text, cfg.candidates)
        except Exception as e:  # never drop data on uncertainty: keep the add, record why
            log.warning("reconcile search failed, op kept unreconciled: %s: %s", type(e).__name__, e)
            out.append(Decision("search-failed", op, proposed=op, error=f"{type(e).__name__}: {e}"))
            continue
        out.append(decide(op, [(h.entry, reconcile_score(h, signal)) for h in hits], cfg))
    return out
