"""`memlab.eval.retrieval.run_recall` and `memlab.studies.reconcile_sweep` on the small synthetic fixture."""

from __future__ import annotations

import math

import pytest

from memlab.data import load_locomo
from memlab.eval.retrieval import run_recall
from memlab.run import ExperimentConfig, run_experiment
from memlab.studies import reconcile_sweep


def test_run_recall_full_memory_set_finds_all_evidence_and_an_empty_one_none(synthetic_path):
    data = load_locomo(synthetic_path)
    modes, ks = ("dense", "tfidf", "bm25", "hybrid"), (1, 2, 20)
    full = run_recall(str(synthetic_path), memory="turns", modes=modes, ks=ks)
    questions = [q for c in data for q in c.questions]
    assert len(full) == len(questions) * len(modes)
    assert set(full["mode"]) == set(modes)
    with_evidence = {q.qid for q in questions if q.evidence_ids}
    has = full.qid.isin(with_evidence)
    # every turn is a memory and 20 exceeds the number of turns: a dense (or fused) search returns every
    # memory, so all evidence; keyword-only modes return only turns sharing a word with the question
    ranked_all = has & full["mode"].isin(["dense", "hybrid"])
    assert (full.loc[ranked_all, "recall@20"] == 1.0).all()
    assert full.loc[has, "recall@20"].between(0, 1).all()
    assert full.loc[~has, "recall@20"].isna().all()  # no evidence: NaN, not 0 or 1
    r = full.loc[has]
    assert (r["recall@1"] <= r["recall@2"]).all() and (r["recall@2"] <= r["recall@20"]).all()
    # syn-2 has no annotated observations: its observation memory set is empty and recalls nothing
    obs = run_recall(str(synthetic_path), memory="observations", modes=("hybrid",), ks=(20,),
                     conversations=["syn-2"])
    syn2 = {q.qid for q in data["syn-2"].questions if q.evidence_ids}
    assert len(obs) == len(data["syn-2"].questions) and syn2
    assert (obs.loc[obs.qid.isin(syn2), "recall@20"] == 0.0).all()


def test_run_recall_rejects_unknown_modes_and_memory_sets(synthetic_path):
    with pytest.raises(ValueError, match="modes: unknown \\['nope'\\]"):
        run_recall(str(synthetic_path), modes=("dense", "nope"))
    with pytest.raises(ValueError, match="memory = 'sessions'; expected one of turns, observations"):
        run_recall(str(synthetic_path), memory="sessions")


def test_reconcile_sweep_keeps_fewer_memories_as_the_skip_threshold_drops(synthetic_path, tmp_path):
    base = ExperimentConfig.from_dict({"name": "sweep",
                                       "dataset": {"path": str(synthetic_path), "conversations": ["syn-1"]},
                                       "extraction": {"name": "observations"}})
    # skip thresholds from never (1.0) to always (-1 score, 0 Jaccard); updates only for identical text
    settings = [(1.0, 1.0, 1.0, 1.0), (0.5, 0.3, 1.0, 1.0), (-1.0, 0.0, 1.0, 1.0)]
    t = reconcile_sweep(base, settings, results=tmp_path)
    assert list(t.setting) == ["off", "1.00/1.00/1.00/1.00", "0.50/0.30/1.00/1.00", "-1.00/0.00/1.00/1.00"]
    data = load_locomo(synthetic_path)
    n_obs = len(data["syn-1"].observations)
    assert (t.proposed == n_obs).all()  # the extractor proposes the same ops whatever reconcile does
    assert (t.rewritten == 0).all()
    assert (t.memories == t.proposed - t.skipped).all()
    assert t.loc[0, "skipped"] == 0 and t.loc[0, "memories"] == n_obs
    assert t.memories.is_monotonic_decreasing  # non-increasing as the skip threshold is lowered
    assert t.memories.iloc[-1] < t.memories.iloc[0] and t.skipped.iloc[-1] > 0
    assert all(0 <= x <= 1 for x in t["recall@10"]) and not any(math.isnan(x) for x in t["f1"])
    for m in ("f1", "recall@10"):  # each row with its interval
        assert (t[f"{m}_lo"] <= t[m] + 1e-12).all() and (t[m] <= t[f"{m}_hi"] + 1e-12).all()
    assert len(list(tmp_path.glob("sweep-reconcile-*"))) == len(settings) + 1  # one run folder per setting


def test_reconcile_sweep_runs_once_per_distinct_store(synthetic_path, tmp_path):
    """Before: every (policy, setting) cell ran, six runs here; cells whose memories cannot differ (the observations
    extractor only adds: reconcile off under any policy, and append-only, which switches reconcile off) now share
    one run, and their rows are what running each cell gives."""
    base = ExperimentConfig.from_dict({"name": "pol", "dataset": {"path": str(synthetic_path),
                                                                   "conversations": ["syn-1"]},
                                       "extraction": {"name": "observations"}})
    policies = ["merge-similar", "preserve-history", "append-only"]
    t = reconcile_sweep(base, [(0.5, 0.3, 0.2, 0.1)], results=tmp_path, policies=policies)
    assert list(zip(t.policy, t.setting)) == [(p, s) for p in policies for s in ("off", "0.50/0.30/0.20/0.10")]
    assert len(list(tmp_path.glob("pol-reconcile-*"))) == 3  # off (shared), merge-similar and preserve-history on
    measures = [c for c in t.columns if c not in ("policy", "setting")]
    off = t[measures].iloc[0].to_dict()
    assert all(t[measures].iloc[i].to_dict() == off for i in (2, 4, 5))
    from memlab.studies import _sweep_row, same_memories_key

    cfg = base.with_overrides({"extraction.policy": "append-only", "name": "pol-check",
                               "extraction.reconcile.skip_score": 0.5, "extraction.reconcile.skip_jaccard": 0.3,
                               "extraction.reconcile.update_score": 0.2, "extraction.reconcile.update_jaccard": 0.1})
    assert _sweep_row(run_experiment(cfg, results=tmp_path / "alone", progress=False)) == off  # as if it ran
    on = base.with_overrides({"extraction.reconcile.update_jaccard": 0.1})
    assert same_memories_key(on) != same_memories_key(on.with_overrides({"extraction.policy": "preserve-history"}))
