"""Fast on a shared machine: light start-up, one ``run.threads`` setting, queries encoded ahead, peak RSS."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from memlab.index import open_service
from memlab.index.embedders import Embedder, l2_normalize
from memlab.index.hybrid import HybridIndex
from memlab.memory.entry import UserKey
from memlab.memory.search_types import SearchOptions
from memlab.run import ConfigError, ExperimentConfig, run_experiment

ROOT = Path(__file__).resolve().parents[1]
#: Libraries that take seconds to import: never loaded by ``import memlab`` or the CLI's parser.
HEAVY = ("nltk", "litellm", "pandas", "sklearn", "faiss", "torch", "transformers", "scipy", "numpy", "ray")


def _python(code: str, **env: str) -> str:
    full = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "KMP_BLOCKTIME", "OMP_NUM_THREADS")}
    full.update(PYTHONPATH=str(ROOT), **env)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_import_memlab_and_cli_help_load_no_heavy_library():
    code = ("import sys, contextlib, io\nimport memlab, memlab.cli\nmemlab.cli.build_parser()\n"
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
            "    memlab.cli.main(['--help'])\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    assert _python(code) == "[]"


def test_data_info_prints_the_statistics_without_pandas(synthetic_path):
    code = ("import sys, contextlib, io\nimport memlab.cli\nout = io.StringIO()\n"
            "with contextlib.redirect_stdout(out):\n"
            f"    assert memlab.cli.main(['data', 'info', {str(synthetic_path)!r}]) == 0\n"
            "assert 'mean_evidence' in out.getvalue(), out.getvalue()\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    assert _python(code) == "[]"



def test_the_public_api_loads_neither_scipy_stats_nor_the_index_libraries():
    """``import memlab.run`` (what ``from memlab import run_experiment`` does) and the statistics module leave
    scipy.stats (~0.5 s), scikit-learn, nltk and litellm to the stage that uses them."""
    code = ("import sys\nimport memlab.run, memlab.eval.stats\n"
            "print(sorted(m for m in ('scipy.stats', 'sklearn', 'nltk', 'litellm') if m in sys.modules))")
    assert _python(code) == "[]"

def test_idle_openmp_threads_sleep_unless_the_user_said_otherwise():
    code = "import os, memlab; print(os.environ['OMP_WAIT_POLICY'], os.environ['KMP_BLOCKTIME'])"
    assert _python(code) == "PASSIVE 0"
    assert _python(code, OMP_WAIT_POLICY="ACTIVE") == "ACTIVE 0"


def test_set_threads_sizes_blas_openmp_faiss_and_torch_from_one_number():
    code = ("import json, numpy, faiss, threadpoolctl\nfrom memlab.threads import set_threads\n"
            "torch = None\ntry:\n    import torch\nexcept ImportError:\n    pass\n"
            "out = set_threads(1)\n"
            "pools = {p['internal_api']: p['num_threads'] for p in threadpoolctl.threadpool_info()}\n"
            "print(json.dumps({'out': out, 'pools': pools, 'faiss': faiss.omp_get_max_threads(),\n"
            "                  'torch': torch.get_num_threads() if torch else 1}))")
    got = json.loads(_python(code))
    assert got["out"]["threads"] == 1 and got["out"]["omp_wait_policy"] == "PASSIVE"
    assert got["pools"] and set(got["pools"].values()) == {1}, got["pools"]
    assert got["faiss"] == 1 and got["torch"] == 1


def test_run_threads_is_validated_and_defaults_to_available_cores():
    from memlab.threads import available_cores, resolve_threads

    assert ExperimentConfig().run.threads is None and resolve_threads(None) == available_cores() >= 1
    assert ExperimentConfig.from_dict({"run": {"threads": 2}}).run.threads == 2
    for bad in (0, -1, "4", 1.5, True):
        with pytest.raises(ConfigError, match="run.threads"):
            ExperimentConfig.from_dict({"run": {"threads": bad}}).validate()


class CountingEmbedder(Embedder):
    """A pretrained-style embedder (no fit) that records every call: hashed bag of words, 64-d."""

    def __init__(self):
        self._params = {}
        self.calls: list[int] = []

    def embed(self, texts):
        self.calls.append(len(texts))
        out = np.zeros((len(texts), 64), dtype=np.float32)
        for i, t in enumerate(texts):
            for w in t.lower().split():
                out[i, sum(map(ord, w)) % 64] += 1.0
        return l2_normalize(out)

    @property
    def embedder_id(self):
        return "counting"


def _service(emb):
    svc = open_service("memory", embedder=emb, keyword="bm25")
    key = UserKey("app", "u")
    for text in ("Caroline went to the LGBTQ support group", "Melanie painted a sunrise by the lake",
                 "Caroline is researching adoption agencies", "Melanie ran a charity race for mental health"):
        svc.add(key, text)
    return svc, key


def test_prepare_queries_encodes_every_question_in_one_pass_and_search_uses_it():
    questions = ["What did Caroline research?", "What did Melanie paint?", "When did Melanie run a race?"]
    plain, key = _service(CountingEmbedder())
    expected = [[h.id for h in plain.search(key, SearchOptions(query=q, max_results=3)).hits] for q in questions]
    emb = CountingEmbedder()
    svc, key = _service(emb)
    assert isinstance(svc.searcher, HybridIndex)
    assert svc.searcher.prepare_queries(key, questions + questions[:1], lambda: svc.list(key)) == 3
    before = list(emb.calls)
    assert before[-1] == 3  # one batched pass over the distinct questions
    got = [[h.id for h in svc.search(key, SearchOptions(query=q, max_results=3)).hits] for q in questions]
    assert emb.calls == before  # no per-question model pass while answering
    assert got == expected
    svc.search(key, SearchOptions(query="something else", max_results=3))
    assert emb.calls == before + [1]  # a query not prepared is embedded on the spot


def test_answering_encodes_the_questions_ahead(locomo_path, tmp_path):
    from memlab.data import load_locomo
    from memlab.extract.pipeline import conversation_key
    from memlab.run.answering import prepare_queries

    conv = load_locomo(locomo_path)["conv-26"]
    emb = CountingEmbedder()
    svc = open_service("memory", embedder=emb)
    key = conversation_key(conv)
    for t in conv.turns[:40]:
        svc.add(key, t.text)
    todo = [(conv, q) for q in conv.questions[:25]]
    assert prepare_queries(svc, todo, progress=False) == len({q.question for _, q in todo})
    assert emb.calls[-1] == len({q.question for _, q in todo})


def test_every_keys_memories_are_encoded_in_one_pass_before_any_key_builds():
    """Model passes key by key, between each key's structures, fragmented the heap (retrieval-best's peak):
    `build_indexes` encodes every key's memories first, in one pass, and each key then builds from it."""
    from memlab.run.extraction import build_indexes

    emb = CountingEmbedder()
    svc = open_service("memory", embedder=emb, keyword="bm25")
    texts = {UserKey("app", "a"): ["Caroline went to the LGBTQ support group", "Caroline paints", "same words"],
             UserKey("app", "b"): ["Melanie ran a charity race", "same words"]}
    for key, ts in texts.items():
        for t in ts:
            svc.add(key, t)
    rows = {key: svc.list(key) for key in texts}
    emb.calls.clear()
    assert all(svc.searcher.needs_build(k) for k in texts)
    assert build_indexes(svc, rows, threads=1) == 1
    assert emb.calls == [4]  # one pass over the distinct texts of both keys, none per key
    ref = HybridIndex(embedder=CountingEmbedder(), keyword="bm25")  # key by key, as before
    for key in texts:
        st = svc.searcher.ensure_built(key, lambda k=key: rows[k])
        assert not svc.searcher.needs_build(key)
        assert np.array_equal(st.matrix, ref.ensure_built(key, lambda k=key: rows[k]).matrix)
    assert emb.calls == [4]
    assert svc.searcher.encode_ahead(rows) == 0  # built keys: nothing to encode
    fitted = HybridIndex(embedder="tfidf-lsa", keyword="bm25")  # a corpus-fitted embedder fits per key
    assert fitted.encode_ahead(rows) == 0

    class Short(CountingEmbedder):  # one vector too few: an error, never a key indexed without a row
        def embed(self, texts):
            return super().embed(texts)[:-1]

    with pytest.raises(RuntimeError, match="asked for 4 vectors, got 3"):
        HybridIndex(embedder=Short(), keyword="bm25").encode_ahead(rows)
    with pytest.raises(RuntimeError, match="asked for 3 vectors, got 2"):
        key = UserKey("app", "a")
        HybridIndex(embedder=Short(), keyword="bm25").ensure_built(key, lambda: rows[key])


def test_splade_documents_encoded_ahead_are_not_encoded_again_when_a_key_builds(monkeypatch):
    from memlab.index import keyword_splade as ks

    ok, why = ks.available()
    if not ok:
        pytest.skip(why)
    ks.clear_cache()
    passes: list[int] = []
    real = ks.encode_uncached
    monkeypatch.setattr(ks, "encode_uncached", lambda texts, dtype="float32": passes.append(len(texts)) or
                        real(texts, dtype))
    idx = HybridIndex(embedder=CountingEmbedder(), keyword="bm25", sparse="splade")
    svc = open_service("memory", embedder=CountingEmbedder(), keyword="bm25")
    key = UserKey("app", "s")
    for t in ("Caroline went to the LGBTQ support group", "Melanie ran a charity race for mental health"):
        svc.add(key, t)
    rows = {key: svc.list(key)}
    assert idx.encode_ahead(rows) == 2 and passes == [2]
    st = idx.ensure_built(key, lambda: rows[key])
    assert passes == [2] and st.sparse.n_docs == 2


def test_run_json_records_threads_and_peak_rss_per_stage(locomo_path, tmp_path):
    cfg = ExperimentConfig.from_dict({"name": "t", "dataset": {"path": str(locomo_path), "conversations": ["conv-26"],
                                                               "question_limit": 5},
                                      "extraction": {"name": "turns"}, "run": {"threads": 1}})
    run = run_experiment(cfg, results=tmp_path, progress=False)
    info = json.loads((run.run_dir / "run.json").read_text())
    assert info["threads"]["threads"] == 1
    peak = info["peak_rss_mb"]
    assert list(peak) == ["extraction", "indexing", "answering", "scoring"]
    assert all(v > 10 for v in peak.values()) and sorted(peak.values()) == list(peak.values())
    assert info["sessions"][-1]["peak_rss_mb"] == peak


def test_splade_passes_never_hold_more_than_the_token_budget_and_match_one_by_one(monkeypatch):
    from memlab.index import keyword_splade as ks

    ok, why = ks.available()
    if not ok:
        pytest.skip(why)
    tok, model = ks.load_model()
    shapes: list[tuple[int, int]] = []
    real = ks.pooled_weights

    def spy(model, input_ids, attention_mask, scratch=None):
        shapes.append(tuple(input_ids.shape))
        return real(model, input_ids, attention_mask, scratch)

    monkeypatch.setattr(ks, "pooled_weights", spy)
    texts = [f"Caroline: I went to support group number {i} and talked about " + "adoption " * (i % 9)
             for i in range(300)]
    batched = ks.encode_batches(texts, tok, model)
    assert len(shapes) > 1 and max(b * n for b, n in shapes) <= ks.TOKENS_PER_BATCH <= 1024
    for i in (0, 7, 299):
        ids, w = ks.encode_batches([texts[i]], tok, model)[0]
        assert np.array_equal(ids, batched[i][0]) and np.allclose(w, batched[i][1], atol=1e-5)


def test_fitted_embedder_queries_skip_the_disk_cache(tmp_path):
    import sqlite3

    from memlab.index.embedders import CachedEmbedder, TfidfLSAEmbedder

    docs = ["Caroline went to the support group", "Melanie painted a sunrise", "Caroline researched adoption",
            "Melanie ran a charity race"]
    emb = CachedEmbedder(TfidfLSAEmbedder(n_components=2), tmp_path / "emb.sqlite").fit(docs)
    emb.embed(docs)
    rows = sqlite3.connect(tmp_path / "emb.sqlite").execute("SELECT COUNT(*) FROM emb").fetchone()[0]
    got = emb.embed_query(["what did Caroline research?"])
    assert np.array_equal(got, emb.embedder.embed_query(["what did Caroline research?"]))
    assert sqlite3.connect(tmp_path / "emb.sqlite").execute("SELECT COUNT(*) FROM emb").fetchone()[0] == rows
    assert emb.misses == len(docs)  # the query neither missed nor was written: no commit per question
