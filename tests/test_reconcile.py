"""Table-driven: every branch of reconcile (tiers, tie-breaks, failure, disabled updates)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from memlab.extract.ops import MemoryOp
from memlab.extract.reconcile import ReconcileConfig, decide, reconcile, reconcile_score
from memlab.memory import MemoryEntry, SearchHit, UserKey

K = UserKey("a", "u")
NOW = datetime(2024, 1, 1, tzinfo=timezone.utc)


def entry(i: str, text: str) -> MemoryEntry:
    return MemoryEntry(id=i, key=K, text=text, created_at=NOW, updated_at=NOW)


ADD = MemoryOp(action="add", text="alice likes green tea in the morning")
UNRELATED = "bob repairs old motorbikes"  # Jaccard with ADD = 0
HALF = "alice likes green tea at night"  # Jaccard 4/9 = 0.444 (update tier by Jaccard)
SAME_WORDS = "in the morning alice likes green tea"  # Jaccard 1.0 (skip tier by Jaccard)


@pytest.mark.parametrize(
    "candidates, cfg, tier, action, cand",
    [
        ([], ReconcileConfig(), "keep", "add", None),
        ([("e1", UNRELATED, 0.10)], ReconcileConfig(), "keep", "add", "e1"),
        ([("e1", UNRELATED, 0.95)], ReconcileConfig(), "skip", None, "e1"),          # skip by score
        ([("e1", UNRELATED, 0.90)], ReconcileConfig(), "skip", None, "e1"),          # >= is inclusive
        ([("e1", SAME_WORDS, 0.0)], ReconcileConfig(), "skip", None, "e1"),          # skip by Jaccard
        ([("e1", UNRELATED, 0.60)], ReconcileConfig(), "update", "update", "e1"),    # update by score
        ([("e1", UNRELATED, 0.599)], ReconcileConfig(), "keep", "add", "e1"),
        ([("e1", HALF, 0.0)], ReconcileConfig(), "update", "update", "e1"),          # update by Jaccard
        ([("e1", HALF, 0.0)], ReconcileConfig(updates_enabled=False), "update", "add", "e1"),  # stays an add
        ([("e1", HALF, 0.0)], ReconcileConfig(update_jaccard=0.5), "keep", "add", "e1"),  # thresholds are params
        # tier first: a skip candidate wins over a higher-scored update candidate
        ([("e1", UNRELATED, 0.80), ("e2", SAME_WORDS, 0.10)], ReconcileConfig(), "skip", None, "e2"),
        # same tier: higher score wins
        ([("e1", HALF, 0.61), ("e2", UNRELATED, 0.70)], ReconcileConfig(), "update", "update", "e2"),
        # same tier and score: higher Jaccard wins
        ([("e1", UNRELATED, 0.70), ("e2", HALF, 0.70)], ReconcileConfig(), "update", "update", "e2"),
        # full tie: smaller id wins (deterministic)
        ([("e9", UNRELATED, 0.70), ("e3", UNRELATED, 0.70)], ReconcileConfig(), "update", "update", "e3"),
        # at most `candidates` are looked at
        ([("e1", UNRELATED, 0.1), ("e2", UNRELATED, 0.1), ("e3", UNRELATED, 0.1), ("e4", SAME_WORDS, 1.0)],
         ReconcileConfig(), "keep", "add", "e1"),
        ([("e1", SAME_WORDS, 1.0)], ReconcileConfig(enabled=False), "disabled", "add", None),
    ],
)
def test_decide_table(candidates, cfg, tier, action, cand):
    d = decide(ADD, [(entry(i, t), s) for i, t, s in candidates], cfg)
    assert d.tier == tier
    assert (d.op.action if d.op else None) == action
    assert d.candidate_id == cand
    if action == "update":
        assert d.op.memory_id == cand and d.rewritten and "reconcile: add->update" in d.op.note
    if tier == "skip":
        assert d.op is None and d.rewritten
    assert d.proposed == ADD  # the trace always keeps what the extractor proposed


def test_non_add_ops_pass_through():
    up = MemoryOp(action="update", text="x", memory_id="e1")
    assert decide(up, [(entry("e1", "x"), 1.0)], ReconcileConfig()).op == up


def test_search_failure_keeps_the_op_and_records_why(caplog):
    def boom(text, n):
        raise RuntimeError("index down")

    ds = reconcile([ADD, MemoryOp(action="delete", memory_id="e1")], boom, ReconcileConfig())
    assert [d.tier for d in ds] == ["search-failed", "not-an-add"]
    assert ds[0].op == ADD
    assert ds[0].error == "RuntimeError: index down" and ds[0].to_dict()["error"] == ds[0].error
    assert ds[1].error is None
    assert any("index down" in r.getMessage() for r in caplog.records if r.name == "memlab.extract.reconcile")


def test_reconcile_score_signals():
    e = entry("e1", "x")
    h = SearchHit(entry=e, score=0.03, rank=1, dense_score=0.8, keyword_score=7.5, keyword_rank=1, text_score=0.4)
    assert reconcile_score(h, "dense") == 0.8
    assert reconcile_score(h, "tfidf") == 0.4  # never the (BM25) keyword score
    assert reconcile_score(h, "jaccard") == 0.0
    with pytest.raises(ValueError, match="signal"):
        reconcile_score(h, "bm25")
    calls = []

    def search(text, n):
        calls.append((text, n))
        return [h]

    ds = reconcile([ADD], search, ReconcileConfig(), signal="tfidf")
    assert calls == [(ADD.text, 3)] and ds[0].score == 0.4 and ds[0].tier == "keep"


def test_config_validation():
    with pytest.raises(ValueError, match="skip_score"):
        ReconcileConfig(skip_score=1.5)
    with pytest.raises(ValueError, match="candidates"):
        ReconcileConfig(candidates=0)
