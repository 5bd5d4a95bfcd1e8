from __future__ import annotations

import os
from datetime import datetime

import numpy as np
import pytest

from memlab.index import (
    BM25Scorer,
    CachedEmbedder,
    DenseIndex,
    HybridIndex,
    MiniLMEmbedder,
    TfidfLSAEmbedder,
    TfidfScorer,
    make_embedder,
    open_service,
    rrf,
)
from memlab.index.fusion import dedupe
from memlab.memory import InMemoryMemoryService, SearchOptions, UserKey

K = UserKey("app", "u")
CORPUS = [
    "Caroline went to an LGBTQ support group on Sunday",
    "Melanie painted a lake sunrise last year",
    "Caroline is researching adoption agencies",
    "Melanie ran a charity race for mental health",
    "Caroline and Melanie talked about pottery classes",
    "Melanie took her kids camping at the beach",
    "Caroline gave a speech at a school event",
    "The weather was rainy and cold all week",
]


def test_rrf_formula_and_order():
    scores = rrf([[10, 20, 30], [30, 10]], k=60)
    assert scores[10] == pytest.approx(1 / 61 + 1 / 62)
    assert scores[30] == pytest.approx(1 / 63 + 1 / 61)
    assert scores[20] == pytest.approx(1 / 62)
    assert sorted(scores, key=scores.get, reverse=True) == [10, 30, 20]
    small_k = rrf([[1, 2], [2, 1]], k=1)
    assert small_k[1] == small_k[2] == pytest.approx(1 / 2 + 1 / 3)


def test_dedupe_keeps_higher_ranked():
    kept, dropped = dedupe(["a b c d e", "a b c d e f", "x y z", "A B C D E!"], 0.8)
    assert kept == [0, 2]
    assert [(d[0], d[1]) for d in dropped] == [(1, 0), (3, 0)]
    assert dropped[0][2] == pytest.approx(5 / 6)
    kept, _ = dedupe(["a b c d", "a b c e"], 0.8)  # Jaccard 3/5 < 0.8: both kept
    assert kept == [0, 1]


class FixedEmbedder(MiniLMEmbedder):
    """Hand-built vectors: lets a test pin the dense ranks exactly."""

    def __init__(self, table: dict[str, list[float]]):
        self._params = {"table": table}
        self.table = table

    def embed(self, texts):
        v = np.asarray([self.table.get(t, [0.0, 0.0, 1.0]) for t in texts], dtype=np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    @property
    def embedder_id(self):
        return "fixed"


def test_hybrid_rrf_ranks_on_hand_built_case():
    table = {"alpha beta": [1, 0, 0], "gamma": [0.9, 0.1, 0], "delta beta beta": [0, 1, 0],
             "q beta": [1, 0, 0]}
    svc = InMemoryMemoryService(HybridIndex(embedder=FixedEmbedder(table), keyword="tfidf"))
    for t in ("alpha beta", "gamma", "delta beta beta"):
        svc.add(K, t)
    res = svc.search(K, SearchOptions(query="q beta", dedupe=False))
    by = {h.entry.text: h for h in res.hits}
    # dense: alpha beta (1), gamma (2), delta (3); keyword "beta": delta beta beta (1), alpha beta (2)
    assert by["alpha beta"].dense_rank == 1 and by["gamma"].dense_rank == 2 and by["delta beta beta"].dense_rank == 3
    assert by["delta beta beta"].keyword_rank == 1 and by["alpha beta"].keyword_rank == 2
    assert by["gamma"].keyword_rank is None
    assert by["alpha beta"].fused_score == pytest.approx(1 / 61 + 1 / 62)
    assert by["delta beta beta"].fused_score == pytest.approx(1 / 63 + 1 / 61)
    assert by["gamma"].fused_score == pytest.approx(1 / 62)
    assert [h.entry.text for h in res.hits] == ["alpha beta", "delta beta beta", "gamma"]
    assert [h.fused_rank for h in res.hits] == [1, 2, 3]
    dense_only = svc.search(K, SearchOptions(query="q beta", hybrid=False, dedupe=False))
    assert [h.entry.text for h in dense_only.hits] == ["alpha beta", "gamma", "delta beta beta"]
    assert dense_only.hits[0].fused_score is None and dense_only.hits[0].keyword_rank is None
    kw_only = svc.search(K, SearchOptions(query="q beta", keyword_only=True, dedupe=False))
    assert [h.entry.text for h in kw_only.hits] == ["delta beta beta", "alpha beta"]
    thr = svc.search(K, SearchOptions(query="q beta", hybrid=False, similarity_threshold=0.5))
    assert [h.entry.text for h in thr.hits] == ["alpha beta", "gamma"]


@pytest.fixture
def svc():
    s = open_service("memory")
    for i, t in enumerate(CORPUS):
        kind = "fact" if "researching" in t else "episode"
        s.add(K, t, kind=kind, event_time=datetime(2023, 1 + i, 1), source_ids=[f"D{i + 1}:1"])
    return s


def test_kind_fallback_merges_after_kind_hits(svc):
    res = svc.search(K, SearchOptions(query="Caroline adoption", kind="fact", max_results=4))
    assert res.hits[0].entry.kind == "fact" and res.hits[0].via == "primary"
    assert len(res.hits) == 4
    assert all(h.via == "kind-fallback" for h in res.hits[1:])
    assert res.fallback_added == [h.id for h in res.hits[1:]]
    assert len({h.id for h in res.hits}) == 4
    no_fb = svc.search(K, SearchOptions(query="Caroline adoption", kind="fact", kind_fallback=False))
    assert [h.entry.kind for h in no_fb.hits] == ["fact"]
    many = svc.search(K, SearchOptions(query="Caroline", kind="episode", max_results=5))
    assert all(h.via == "primary" and h.entry.kind == "episode" for h in many.hits)  # >= 3 hits: no fallback


def test_time_window_and_event_order(svc):
    res = svc.search(K, SearchOptions(query="Caroline Melanie", after=datetime(2023, 3, 1),
                                      before=datetime(2023, 6, 1), max_results=10))
    assert res.hits and all(datetime(2023, 3, 1) <= h.entry.event_time <= datetime(2023, 6, 1) for h in res.hits)
    ordered = svc.search(K, SearchOptions(query="Caroline Melanie", order_by_event_time=True, max_results=10))
    times = [h.entry.event_time for h in ordered.hits]
    assert times == sorted(times) and [h.rank for h in ordered.hits] == list(range(1, len(times) + 1))


def test_dedupe_in_search_reports_drops():
    s = open_service("memory")
    s.add(K, "Melanie painted a lake sunrise last year")
    s.add(K, "Melanie painted a lake sunrise last year!!")  # same word set, different content id
    s.add(K, "Caroline likes hiking")
    res = s.search(K, SearchOptions(query="Melanie painted sunrise", max_results=3))
    texts = [h.entry.text for h in res.hits]
    assert sum(t.startswith("Melanie painted") for t in texts) == 1
    assert len(res.dropped_by_dedupe) == 1 and res.dropped_by_dedupe[0][2] == pytest.approx(1.0)
    res2 = s.search(K, SearchOptions(query="Melanie painted sunrise", max_results=3, dedupe=False))
    assert sum(h.entry.text.startswith("Melanie painted") for h in res2.hits) == 2


def test_index_follows_updates_deletes_clear(svc):
    top = svc.search(K, "charity race").hits[0]
    assert "charity race" in top.entry.text
    svc.update(K, top.id, "Melanie baked bread for the neighbours")
    hits = svc.search(K, "charity race").hits
    assert all("charity race" not in h.entry.text for h in hits)
    assert svc.search(K, "baked bread neighbours").hits[0].id == top.id  # re-embedded under the same id
    svc.delete(K, top.id)
    assert top.id not in {h.id for h in svc.search(K, SearchOptions(query="baked bread", max_results=20)).hits}
    svc.clear(K)
    assert svc.search(K, "Caroline").hits == []
    svc.add(K, "A fresh start")
    assert [h.entry.text for h in svc.search(K, "fresh start").hits] == ["A fresh start"]


def test_participant_boost_prefers_named_speaker():
    s = open_service("memory")
    s.add(K, "I love painting sunsets", participants=["Melanie"])
    s.add(K, "I love painting landscapes too", participants=["Caroline"])
    for i in range(5):
        s.add(K, f"filler line number {i} about nothing", participants=["Caroline"])
    res = s.search(K, SearchOptions(query="What does Melanie love painting?", participant_boost=True))
    assert res.hits[0].entry.participants == ("Melanie",)


def test_tfidf_lsa_fast_path_matches_sklearn():
    from sklearn.decomposition import TruncatedSVD
    from sklearn.feature_extraction.text import TfidfVectorizer

    emb = TfidfLSAEmbedder(n_components=4).fit(CORPUS)
    vec = TfidfVectorizer(analyzer=emb.terms, sublinear_tf=True).fit(CORPUS)
    X = vec.transform(["Caroline support group", "Melanie race"])
    assert np.allclose(emb.tfidf(["Caroline support group", "Melanie race"]).toarray(), X.toarray(), atol=1e-6)
    svd = TruncatedSVD(n_components=4, random_state=0, n_iter=5).fit(vec.transform(CORPUS))
    ref = X @ svd.components_.T
    ref = ref / np.linalg.norm(ref, axis=1, keepdims=True)
    got = emb.embed(["Caroline support group", "Melanie race"])
    assert got.dtype == np.float32 and got.shape == (2, 4)
    assert np.allclose(np.abs((got * ref).sum(axis=1)), 1.0, atol=1e-4)
    assert np.allclose(emb.embed(["Melanie race"]), got[1:], atol=1e-6)  # single-query path agrees
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_bm25_matches_rank_bm25_order():
    from rank_bm25 import BM25Okapi

    from memlab.index.text import analyze

    ours = BM25Scorer().fit(CORPUS).score("Caroline support group adoption")
    ref = BM25Okapi([list(analyze(t)) for t in CORPUS], k1=1.2, b=0.75).get_scores(
        list(analyze("Caroline support group adoption")))
    top_ours = np.argsort(-ours)[:2].tolist()
    top_ref = np.argsort(-ref)[:2].tolist()
    assert top_ours == top_ref
    t = TfidfScorer().fit(CORPUS).score("sunrise lake")
    assert int(np.argmax(t)) == 1 and t[0] == 0


def test_dense_index_factories():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2000, 16)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    flat = DenseIndex("Flat").build(x)
    hnsw = DenseIndex("HNSW32", ef_search=256).build(x)
    ivf = DenseIndex("IVF16,Flat", nprobe=16).build(x)
    _, fi = flat.search(x[:20], 5)
    _, hi = hnsw.search(x[:20], 5)
    _, ii = ivf.search(x[:20], 5)
    assert (fi[:, 0] == np.arange(20)).all()
    assert np.mean([len(set(a) & set(b)) / 5 for a, b in zip(fi, hi)]) > 0.9
    assert (ii == fi).all()  # all lists probed: exact
    assert DenseIndex("IVF256,Flat").build(x[:100]).effective_factory_ == "Flat"  # too small to train
    with pytest.raises(ValueError, match="FAISS factory"):
        DenseIndex("NotAnIndex").build(x)


def test_embedder_factory_and_cache(tmp_path):
    with pytest.raises(ValueError, match="tfidf-lsa"):
        make_embedder("word2vec")
    inner = TfidfLSAEmbedder(n_components=3).fit(CORPUS)
    cached = CachedEmbedder(inner, tmp_path / "emb.sqlite")
    a = cached.embed(CORPUS[:3])
    assert cached.misses == 3 and cached.hits == 0
    b = cached.embed(CORPUS[:3] + CORPUS[:1])
    assert cached.misses == 3 and cached.hits == 4
    assert np.allclose(a, b[:3])
    again = CachedEmbedder(TfidfLSAEmbedder(n_components=3).fit(CORPUS), tmp_path / "emb.sqlite")
    again.embed(CORPUS[:3])
    assert again.misses == 0  # same embedder id (same fit) -> served from disk
    other = CachedEmbedder(TfidfLSAEmbedder(n_components=3).fit(CORPUS[:5]), tmp_path / "emb.sqlite")
    other.embed(CORPUS[:3])
    assert other.misses == 3  # another corpus fit is another embedding function


def test_litellm_embedder_over_http():
    from memlab.index import LiteLLMEmbedder
    from memlab.testing import ScriptedServer

    with ScriptedServer() as srv:
        emb = LiteLLMEmbedder("openai/text-embedding-3-small", api_base=srv.api_base, api_key="x", batch_size=2)
        v = emb.embed(["a", "b", "c"])
        assert v.shape == (3, 16) and np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
        assert np.allclose(v[0], srv.embed_vector("a"), atol=1e-5)
        assert [len(r["input"]) for r in srv.embed_requests] == [2, 1]  # batched


def test_minilm_embedder():
    ok, why = MiniLMEmbedder.available()
    if not ok:
        pytest.skip(why)
    emb = make_embedder("minilm")
    v = emb.embed(["Caroline went to a support group", "Caroline attended an LGBTQ meeting", "stock prices"])
    assert v.shape == (3, 384) and v.dtype == np.float32
    assert float(v[0] @ v[1]) > float(v[0] @ v[2])
    # a pass encodes its texts longest first, over steps of several batches: each row must come back in place
    texts = [("Caroline " + "went to a support group and talked " * (i % 7)) + str(i) for i in range(40)]
    whole = MiniLMEmbedder(batch_size=2).embed(texts)
    alone = np.vstack([emb.embed([t]) for t in texts[:6]])
    assert whole.shape == (40, 384) and np.allclose(whole[:6], alone, atol=1e-5)


def test_minilm_in_bfloat16_is_its_own_embedder_close_to_float32(tmp_path, monkeypatch):
    """bfloat16 is a declared setting: its id (and so every cache key) differs from float32's, and its vectors
    stay close to float32's; a format it does not know is refused by name."""
    from memlab.params import ParamError

    ok, why = MiniLMEmbedder.available()
    if not ok:
        pytest.skip(why)
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    monkeypatch.delenv("LRU_CACHE_CAPACITY", raising=False)
    texts = ["Caroline went to a support group yesterday", "Melanie painted a sunset by the lake"]
    f32, b16 = make_embedder("minilm"), make_embedder("minilm", dtype="bfloat16")
    assert f32.embedder_id == "minilm(all-MiniLM-L6-v2)"  # the id (and caches) made before the setting
    assert b16.embedder_id == "minilm(all-MiniLM-L6-v2,bfloat16)"
    a, b = f32.embed(texts), b16.embed(texts)
    assert b.dtype == np.float32 and not np.array_equal(a, b)
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "16"  # bf16 kernels per shape: a bounded cache
    assert os.environ["LRU_CACHE_CAPACITY"] == "16"  # and torch's ideep computations per shape
    assert (a * b).sum(axis=1).min() > 0.999
    cached = make_embedder("minilm", cache_path=str(tmp_path / "e.sqlite"), dtype="bfloat16")
    assert cached.embedder_id == b16.embedder_id and np.allclose(cached.embed(texts), b, atol=1e-6)
    with pytest.raises(ParamError, match="float16"):
        make_embedder("minilm", dtype="float16")


def test_feedback_moves_the_dense_query_toward_top_hits():
    table = {"A": [1, 0, 0], "B": [0.61, 0.79, 0], "C": [0.6, -0.8, 0], "q": [1, 0, 0]}
    svc = InMemoryMemoryService(HybridIndex(embedder=FixedEmbedder(table)))
    for t in ("A", "B", "C"):
        svc.add(K, t)
    plain = {h.entry.text: h.dense_score for h in svc.search(K, SearchOptions(query="q", hybrid=False)).hits}
    fb = {h.entry.text: h.dense_score for h in svc.search(K, SearchOptions(query="q", hybrid=False,
                                                                           feedback=2)).hits}
    assert plain["C"] == pytest.approx(0.6, abs=1e-5)
    # Rocchio: q' = norm(q + 0.5 * mean(A, B)) leans toward B and away from C
    b = np.array([0.61, 0.79, 0]) / np.linalg.norm([0.61, 0.79, 0])  # the embedder normalises rows
    q2 = np.array([1, 0, 0]) + 0.5 * (np.array([1, 0, 0]) + b) / 2
    q2 /= np.linalg.norm(q2)
    assert fb["C"] == pytest.approx(float(q2 @ np.array([0.6, -0.8, 0])), abs=1e-4) and fb["C"] < 0.55
    assert fb["B"] > plain["B"]


def test_text_score_is_the_bounded_tfidf_cosine_with_any_keyword_scorer():
    for kw in ("bm25", "tfidf"):
        s = open_service("memory", keyword=kw)
        for t in CORPUS:
            s.add(K, t)
        hits = s.search(K, SearchOptions(query="Caroline support group", max_results=8)).hits
        assert all(h.text_score is not None and 0.0 <= h.text_score <= 1.0 + 1e-6 for h in hits)
        best = max(hits, key=lambda h: h.text_score)
        assert best.entry.text == CORPUS[0]
        assert s.searcher.reconcile_signal == "tfidf"


def test_tfidf_lsa_fits_on_one_blas_thread_and_restores_the_pools(monkeypatch):
    """The fit's BLAS limit (one thread for the SVD, every BLAS library numpy, scipy and scikit-learn load) holds
    with the one shared controller, and the pools are as before once it returns."""
    import threadpoolctl

    from memlab.index.embedders import TfidfLSAEmbedder

    def blas() -> dict[str, int]:
        return {p["filepath"]: p["num_threads"] for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"}

    emb = TfidfLSAEmbedder(n_components=4)
    emb.fit(["warm the libraries up", "a second text"])
    from sklearn.decomposition import TruncatedSVD

    before, inside = blas(), []
    real = TruncatedSVD.fit  # the fit's SVD: what the one-thread limit is for
    monkeypatch.setattr(TruncatedSVD, "fit", lambda self, *a, **k: (inside.append(blas()), real(self, *a, **k))[1])
    for _ in range(2):
        emb.fit(["alice went to the park", "bob cooked dinner", "alice and bob went hiking"])
    assert len(inside) == 2 and all(set(d) == set(before) and set(d.values()) == {1} for d in inside)
    assert any("scipy" in path for path in before)  # scipy's BLAS (the SVD's LU and QR) is among them
    assert blas() == before
