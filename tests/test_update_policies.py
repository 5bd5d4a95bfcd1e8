"""Update policies (merge-similar / preserve-history / append-only): the store after a scripted sequence."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

import pytest

from memlab.extract import (
    AutoMemoryWorker,
    ChatSession,
    ExtractionResult,
    Extractor,
    LLMExtractor,
    MemoryOp,
    Message,
    ObservationsExtractor,
    ReconcileConfig,
    TurnsAndLLM,
    TurnsExtractor,
)
from memlab.extract.extractors import TurnsAndObservations
from memlab.index import open_service
from memlab.memory import SearchOptions, UserKey
from memlab.memory.entry import content_id
from memlab.memory.sqlite import SQLiteMemoryService
from memlab.run import ConfigError, ExperimentConfig
from memlab.run.extraction import extraction_cache_key

K = UserKey("app", "alice")
T0 = datetime(2023, 5, 8, 13, 0)
DAY2 = T0 + timedelta(days=30)


def cid(text):
    return content_id(K, text, "fact", None)


class Steps(Extractor):
    """Job i returns the i-th list of ops."""

    name = "steps"
    reads_old_memories = True

    def __init__(self, steps):
        self.steps = list(steps)
        self.seen_old = []

    def extract(self, request):
        self.seen_old.append([e.text for e in request.old_memories])
        return ExtractionResult(ops=self.steps.pop(0))


PARIS, BERLIN, TEA = "Alice lives in Paris", "Alice lives in Berlin", "Alice likes green tea"
SEQUENCE = [
    [MemoryOp("add", PARIS, source_ids=("D1:1",)), MemoryOp("add", TEA, source_ids=("D1:2",))],
    [MemoryOp("update", BERLIN, memory_id=cid(PARIS), source_ids=("D2:1",)),
     MemoryOp("delete", memory_id=cid(TEA), source_ids=("D2:2",))],
    [MemoryOp("update", "Alice lives in Rome", memory_id=cid(PARIS), source_ids=("D3:1",))],
]


def run_sequence(policy, service=None):
    svc = service or open_service("memory")
    ex = Steps(SEQUENCE)
    w = AutoMemoryWorker(svc, ex, policy=policy)
    chat = ChatSession(id="s", key=K)
    for day, (i, text) in enumerate([(1, "I live in Paris"), (2, "I moved to Berlin"), (3, "Now Rome")]):
        chat.messages.append(Message("user", text, T0 + timedelta(days=30 * day), id=f"D{i}:1", speaker="Alice"))
        w.run_job(chat)
    return svc, w, ex


def state(svc):
    return {e.text: (e.source_ids, e.superseded_by, e.superseded_at) for e in svc.list(K)}


def test_merge_similar_overwrites_in_place_and_deletes():
    svc, w, _ = run_sequence("merge-similar")
    assert state(svc) == {"Alice lives in Rome": (("D1:1", "D2:1", "D3:1"), None, None)}
    assert svc.list(K)[0].id == cid(PARIS)  # the id is stable, the old wording is gone
    assert [a.result for r in w.results for a in r.applied] == ["added", "added", "updated", "deleted", "updated"]


def test_preserve_history_keeps_superseded_versions_with_time_and_successor():
    svc, w, ex = run_sequence("preserve-history")
    st = state(svc)
    rome = cid("Alice lives in Rome")
    assert st[PARIS] == (("D1:1",), cid(BERLIN), DAY2)  # superseded at the job's (conversation) time
    assert st[BERLIN] == (("D1:1", "D2:1"), rome, DAY2 + timedelta(days=30))
    assert st["Alice lives in Rome"] == (("D1:1", "D2:1", "D3:1"), None, None)
    assert TEA not in st  # a delete still deletes
    # the third update named the Paris id: it followed the chain to the current version (Berlin)
    assert [a.result for a in w.results[2].applied] == ["superseded"]
    assert w.counters.memories_superseded == 2
    # answering sees the history by default; the worker's own lookups see only current memories
    every = svc.search(K, SearchOptions(query="where does Alice live", max_results=10, dedupe=False))
    assert {h.entry.text for h in every.hits} == {PARIS, BERLIN, "Alice lives in Rome"}
    current = svc.search(K, SearchOptions(query="where does Alice live", max_results=10, dedupe=False,
                                          include_superseded=False))
    assert [h.entry.text for h in current.hits] == ["Alice lives in Rome"]
    assert PARIS not in ex.seen_old[2] and BERLIN in ex.seen_old[2]
    log = [r.result for r in svc.op_log(K) if r.op == "update"]
    assert log == ["superseded", "superseded"]


def test_append_only_changes_and_removes_nothing():
    svc, w, _ = run_sequence("append-only")
    st = state(svc)
    assert st == {PARIS: (("D1:1",), None, None), TEA: (("D1:2",), None, None),
                  BERLIN: (("D2:1",), None, None), "Alice lives in Rome": (("D3:1",), None, None)}
    results = [a.result for r in w.results for a in r.applied]
    assert results == ["added", "added", "update->add (append-only)", "refused (append-only)",
                       "update->add (append-only)"]
    assert w.counters.ops_refused_by_policy == 1


def test_reconcile_rewritten_update_follows_the_policy():
    """An add that reconcile turns into an update: overwritten, superseded, or kept as an add."""
    first, similar = "Alice adopted a dog named Rex", "Alice adopted a puppy named Rex in May"
    jaccard_only = ReconcileConfig(skip_score=1.0, update_score=1.0)  # Jaccard 0.5: the update tier
    out = {}
    for policy in ("merge-similar", "preserve-history", "append-only"):
        svc = open_service("memory")
        steps = Steps([[MemoryOp("add", first, source_ids=("D1:1",))],
                       [MemoryOp("add", similar, source_ids=("D2:1",))]])
        w = AutoMemoryWorker(svc, steps, policy=policy, reconcile_config=jaccard_only)
        chat = ChatSession(id="s", key=K)
        for i in (1, 2):
            chat.messages.append(Message("user", f"turn {i}", T0 + timedelta(days=i), id=f"D{i}:1"))
            w.run_job(chat)
        tiers = [a.decision.tier for a in w.results[1].applied]
        out[policy] = (sorted((e.text, e.superseded) for e in svc.list(K)), tiers,
                       [a.result for a in w.results[1].applied])
    assert out["merge-similar"] == ([(similar, False)], ["update"], ["updated"])
    assert out["preserve-history"] == ([(first, True), (similar, False)], ["update"], ["superseded"])
    assert out["append-only"] == ([(first, False), (similar, False)], ["disabled"], ["added"])


def test_superseded_fields_survive_sqlite(tmp_path):
    db = tmp_path / "m.db"
    svc = SQLiteMemoryService(db)
    svc, _, _ = run_sequence("preserve-history", service=svc)
    before = state(svc)
    svc.close()
    again = SQLiteMemoryService(db)
    assert state(again) == before and before[PARIS][1] == cid(BERLIN)
    again.close()
    with pytest.raises(Exception, match="schema version"):  # a store of another schema is refused, named
        import sqlite3

        con = sqlite3.connect(db)
        con.execute("UPDATE meta SET value='2' WHERE key='schema_version'")
        con.commit()
        con.close()
        SQLiteMemoryService(db)


def test_policy_is_validated_and_part_of_the_extraction_cache_key():
    with pytest.raises(ValueError, match="update policy"):
        AutoMemoryWorker(open_service("memory"), None, policy="overwrite")
    with pytest.raises(ConfigError, match="extraction.policy = 'overwrite'; allowed: merge-similar"):
        ExperimentConfig.from_dict({"extraction": {"policy": "overwrite"}})
    cfg = ExperimentConfig()
    keys = {p: extraction_cache_key(replace(cfg, extraction=replace(cfg.extraction, policy=p)), "sha", "obs")
            for p in ("merge-similar", "preserve-history", "append-only")}
    assert len(set(keys.values())) == 3  # without the extractor object: counted as configured
    assert extraction_cache_key(cfg, "sha", "obs") == keys["merge-similar"]


POLICY_NAMES = ("merge-similar", "preserve-history", "append-only")


def _key(extractor, policy, **reconcile):
    cfg = ExperimentConfig()
    ex = replace(cfg.extraction, policy=policy, reconcile=replace(cfg.extraction.reconcile, **reconcile))
    return extraction_cache_key(replace(cfg, extraction=ex), "sha", extractor.cache_id(), extractor)


def test_the_policy_counts_in_the_extraction_key_only_where_it_can_change_the_store():
    """An add-only extractor whose adds reconcile cannot rewrite into updates writes the same store under every
    policy (and append-only switches reconcile off, whatever its thresholds); an extractor that may propose
    updates or deletes, or reconcile that may rewrite adds, keeps the policy in the key."""
    obs, turns = ObservationsExtractor(), TurnsExtractor()
    llm = LLMExtractor(model="openai/scripted")
    off = {_key(obs, p, enabled=False) for p in POLICY_NAMES}
    off |= {_key(obs, "append-only", enabled=True, skip_score=s, update_jaccard=j) for s, j in ((.9, .4), (.8, .3))}
    assert len(off) == 1
    assert len({_key(obs, p) for p in POLICY_NAMES} | off) == 3  # reconcile on: merge, preserve, (append = off)
    assert len({_key(obs, p, updates_enabled=False) for p in POLICY_NAMES[:2]}) == 1  # reconcile only skips
    assert len({_key(turns, p, skip_score=s) for p in POLICY_NAMES for s in (.9, .8)}) == 1  # turns: no reconcile
    assert len({_key(llm, p, enabled=False) for p in POLICY_NAMES}) == 3  # the model may update and delete
    assert len({_key(TurnsAndLLM(llm), p, enabled=False) for p in POLICY_NAMES}) == 3
    assert _key(TurnsAndObservations(), "append-only") == _key(TurnsAndObservations(), "merge-similar")


def _policy_run(path, root, policy, srv=None, **over):
    from memlab.run import run_experiment

    cfg = ExperimentConfig.from_dict({"name": "policy", "dataset": {"path": str(path), "conversations": ["syn-1"]},
                                      "extraction": {"name": "observations", "policy": policy}})
    if srv is not None:
        over.update({"extraction.name": "llm", "extraction.model": "openai/scripted",
                     "models.api_base": srv.api_base, "models.max_retries": 0})
    run = run_experiment(cfg.with_overrides(over), results=root, progress=False)
    return run.info["extraction"], (run.run_dir / "traces" / "memories.jsonl").read_text()


def test_a_policy_sweep_of_an_add_only_extractor_extracts_once(synthetic_path, tmp_path):
    """Before: each policy re-extracted the same store (notebook 05's reconcile-off column, three times)."""
    first, mems = _policy_run(synthetic_path, tmp_path, "merge-similar", **{"extraction.reconcile.enabled": False})
    assert first["from_cache"] is False and first["jobs_run"] > 0
    for policy, over in (("preserve-history", {"extraction.reconcile.enabled": False}),
                         ("append-only", {"extraction.reconcile.skip_score": 0.5})):  # append-only: reconcile off
        info, again = _policy_run(synthetic_path, tmp_path, policy, **over)
        assert (info["from_cache"], info["jobs_run"], info["cache_key"]) == (True, 0, first["cache_key"]), policy
        assert again == mems
    # reconcile on may rewrite an add into an update, which the policy then applies its own way: extracted anew
    on = [_policy_run(synthetic_path, tmp_path, p)[0] for p in ("merge-similar", "preserve-history")]
    assert [i["from_cache"] for i in on] == [False, False] and on[0]["cache_key"] != on[1]["cache_key"]


def test_a_policy_that_changes_what_the_extractor_reads_misses_the_cache(synthetic_path, tmp_path):
    """A model extractor may propose updates and deletes, and reads the old memories the policy left: each
    policy extracts on its own (the model is asked again when the response cache does not hold the request)."""
    from memlab.testing import ScriptedServer
    from tests.scripted_model import responder

    with ScriptedServer(responder=responder) as srv:
        off = {"extraction.reconcile.enabled": False}
        a, _ = _policy_run(synthetic_path, tmp_path, "merge-similar", srv, **off)
        b, _ = _policy_run(synthetic_path, tmp_path, "preserve-history", srv, **off)
        c, _ = _policy_run(synthetic_path, tmp_path, "merge-similar", srv, **off)
    assert a["jobs_run"] > 0 and a["model_calls"] > 0
    assert b["from_cache"] is False and b["jobs_run"] == a["jobs_run"] and b["cache_key"] != a["cache_key"]
    assert c["from_cache"] is True and c["cache_key"] == a["cache_key"]
