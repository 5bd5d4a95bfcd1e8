"""A second `Searcher` (tests/example_components/brute_force_searcher.py), written against the protocol only,
works in a run, in its traces and in the retrieval benchmark; a run takes a judge or an embedder object too."""

from __future__ import annotations

import json

import pytest

import memlab.trace
from memlab.answer import Judge
from memlab.eval.retrieval import Arm, run_arms
from memlab.index import BACKENDS, HybridIndex, TfidfLSAEmbedder, open_service
from memlab.llm import Usage
from memlab.memory import (
    EncodesAhead,
    ExportsKeys,
    ExtractionLog,
    MemoryView,
    PlansBuilds,
    PreparesQueries,
    ReleasesKeys,
    Searcher,
    TimesQueryEncoding,
    UserKey,
    extraction_log,
)
from memlab.memory.shipping import export_index, export_rows, import_index, import_rows
from memlab.run import run_experiment
from memlab.run.config import ExperimentConfig
from memlab.systems import MemorySystem
from tests.example_components.brute_force_searcher import BruteForceSearcher


def syn_cfg(path, backend: str = "memory", **over) -> ExperimentConfig:
    cfg = ExperimentConfig.from_dict({"name": "bf", "dataset": {"path": str(path)},
                                      "extraction": {"name": "turns"}, "store": {"backend": backend}})
    return cfg.with_overrides(over) if over else cfg


class ExactJudge(Judge):
    """1 when the prediction is the gold answer, else 0 (no model)."""

    def judge(self, question, prediction):
        return float(prediction.strip().lower() == str(question.answer).strip().lower()), Usage(), False


@pytest.mark.parametrize("backend", BACKENDS)
def test_run_traces_and_judge_with_a_protocol_only_searcher(synthetic_path, tmp_path, monkeypatch, backend):
    monkeypatch.setenv("MEMLAB_CACHE_DIR", str(tmp_path / "machine-cache"))
    searcher = BruteForceSearcher()
    run = run_experiment(syn_cfg(synthetic_path, backend), results=tmp_path, progress=False, searcher=searcher,
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


SEARCHERS = {"hybrid": HybridIndex, "brute-force": BruteForceSearcher}
K = UserKey("app", "alice")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("make", list(SEARCHERS.values()), ids=list(SEARCHERS))
def test_every_searcher_on_every_backend_follows_the_store(tmp_path, backend, make):
    """Each searcher memlab ships or shows, over each store backend: it is a `Searcher` (checked with isinstance,
    as `open_service` does), every write reaches its results, and a copied key ships where it can."""
    searcher = make()
    assert isinstance(searcher, Searcher)
    svc = open_service(backend, path=tmp_path / "s.db" if backend == "sqlite" else None, searcher=searcher)
    dog = svc.add(K, "Alice adopted a dog named Rex", kind="fact", source_ids=["D1:1"])
    paint = svc.add(K, "Alice paints landscapes on weekends", kind="fact", source_ids=["D1:2"])
    svc.add(K, "Alice moved to Boston", kind="fact", source_ids=["D1:3"])
    assert svc.search(K, "dog named Rex").hits[0].id == dog.id
    cat = svc.update(K, dog.id, "Alice adopted a cat named Tom").entry
    assert [h.entry.text for h in svc.search(K, "cat named Tom").hits][:1] == ["Alice adopted a cat named Tom"]
    assert all("dog" not in h.entry.text for h in svc.search(K, "dog named Rex").hits)  # the old text is gone
    assert svc.delete(K, paint.id) and paint.id not in {h.id for h in svc.search(K, "paints landscapes").hits}
    copy = open_service("memory", searcher=make())
    import_rows(copy, K, export_rows(svc, K))
    shipped = import_index(copy, K, export_index(svc, K))
    assert shipped is isinstance(searcher, ExportsKeys)  # a searcher that cannot ship its state rebuilds from rows
    assert [h.id for h in copy.search(K, "cat named Tom").hits] == [h.id for h in svc.search(K, "cat named Tom").hits]
    assert cat.id in {h.id for h in copy.search(K, "cat named Tom").hits}
    svc.clear(K)
    assert svc.search(K, "Alice").hits == [] and svc.count(K) == 0
    svc.close()


def test_an_object_that_is_not_a_searcher_is_refused_naming_what_it_lacks():
    class Half:
        def search(self, key, options, load_entries):
            return None

    with pytest.raises(TypeError, match=r"Half is not a memlab.memory.Searcher \(it lacks reconcile_signal, on_upsert"):
        open_service("memory", searcher=Half())


def test_abilities_are_protocols_checked_with_isinstance(tmp_path):
    """Each optional ability is a runtime-checkable protocol: `HybridIndex` has them all, the protocol-only searcher
    only `ReleasesKeys`; both stores are the `MemoryView` the arms read and keep an `ExtractionLog`; a memory
    system's view is a `MemoryView` without one (extracting into it is refused, naming it)."""
    abilities = (PreparesQueries, TimesQueryEncoding, EncodesAhead, PlansBuilds, ReleasesKeys, ExportsKeys)
    assert all(isinstance(HybridIndex(), a) for a in abilities)
    assert [a for a in abilities if isinstance(BruteForceSearcher(), a)] == [ReleasesKeys]

    class Echo(MemorySystem):
        def ingest(self, key, session, messages):
            return None

        def search(self, key, query, k):
            return []

    view = Echo().as_service()
    for svc in (open_service("memory"), open_service("sqlite", path=tmp_path / "s.db")):
        assert isinstance(svc, MemoryView) and isinstance(svc, ExtractionLog) and extraction_log(svc) is svc
    assert isinstance(view, MemoryView) and not isinstance(view, ExtractionLog)
    with pytest.raises(TypeError, match="SystemService keeps no extraction cursor"):
        extraction_log(view)
