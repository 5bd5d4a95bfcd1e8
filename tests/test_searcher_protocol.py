"""A second `Searcher` (tests/example_components/brute_force_searcher.py), written against the protocol only,
works in a run, in its traces and in the retrieval benchmark; a run takes a judge or an embedder object too."""

from __future__ import annotations

import json

import memlab.trace
from memlab.answer import Judge
from memlab.eval.retrieval import Arm, run_arms
from memlab.index import TfidfLSAEmbedder
from memlab.llm import Usage
from memlab.run import run_experiment
from memlab.run.config import ExperimentConfig
from tests.example_components.brute_force_searcher import BruteForceSearcher


def syn_cfg(path, **over) -> ExperimentConfig:
    cfg = ExperimentConfig.from_dict({"name": "bf", "dataset": {"path": str(path)},
                                      "extraction": {"name": "turns"}, "store": {"backend": "memory"}})
    return cfg.with_overrides(over) if over else cfg


class ExactJudge(Judge):
    """1 when the prediction is the gold answer, else 0 (no model)."""

    def judge(self, question, prediction):
        return float(prediction.strip().lower() == str(question.answer).strip().lower()), Usage(), False


def test_run_traces_and_judge_with_a_protocol_only_searcher(synthetic_path, tmp_path):
    searcher = BruteForceSearcher()
    run = run_experiment(syn_cfg(synthetic_path), results=tmp_path, progress=False, searcher=searcher,
                         judge=ExactJudge())
    assert run.info["status"] == "complete"
    assert searcher.searches > 0  # the arm searched through it, not through a HybridIndex
    comps = run.info["components"]
    assert comps["searcher"] == "brute-force-cosine" and comps["custom"]["searcher"] is True
    assert comps["custom"]["judge"] is True and comps["judge"].endswith("ExactJudge")
    assert run.predictions["j"].notna().all()  # our judge scored every question (the config names no judge model)
    rows = [json.loads(x) for x in open(run.run_dir / "traces" / "retrieval.jsonl")]
    hits = [h for r in rows for q in r["queries"] for h in q["hits"]]
    assert hits and all(h["keyword_rank"] is None and h["dense_rank"] == h["rank"] for h in hits)
    assert any(r["evidence_memories"] for r in rows)  # the evidence memories, read through Searcher.entries
    tr = memlab.trace.load(run.run_dir)
    qid = run.predictions["qid"].iloc[0]
    text = tr.show(qid)
    assert qid in text and "retrieval" in text.lower()


def test_run_takes_an_embedder_object(synthetic_path, tmp_path):
    class Tagged(TfidfLSAEmbedder):
        pass

    run = run_experiment(syn_cfg(synthetic_path), results=tmp_path, progress=False, embedder=Tagged())
    label = run.info["components"]["embedder"]  # the class, then its settings
    assert run.info["status"] == "complete" and label.split("(")[0].endswith("Tagged")
    same = run_experiment(syn_cfg(synthetic_path), results=tmp_path, progress=False)
    assert list(run.predictions["prediction"]) == list(same.predictions["prediction"])  # the same fit, objects or names


def test_retrieval_benchmark_takes_a_searcher(synthetic_path):
    arms = {"brute": Arm(memory="turns", searcher=BruteForceSearcher), "hybrid": Arm(memory="turns")}
    per_q = run_arms(arms, str(synthetic_path), ks=(1, 5))
    brute = per_q[per_q["mode"] == "brute"]
    assert len(brute) == len(per_q[per_q["mode"] == "hybrid"]) > 0
    assert brute["recall@5"].notna().any() and brute["encode_ms"].isna().all()  # nothing it encodes ahead
