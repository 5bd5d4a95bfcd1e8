"""Fault injection, caches: every cached artefact is checked on use; a zero-byte, truncated,
bit-flipped or unreadable file is reported by path and rebuilt (or re-fetched), never used (issue 10)."""

from __future__ import annotations

import json
import os
import pickle
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from memlab import cache_integrity
from memlab.cache_integrity import CacheCorruptError
from memlab.data import load_locomo
from memlab.extract.pipeline import conversation_key, extract_dataset
from memlab.index import make_embedder, open_service
from memlab.llm import ModelClient
from memlab.memory import SQLiteMemoryService, UserKey
from memlab.testing import Reply, ScriptedServer

A = UserKey("app", "alice")


def flip_bytes(path: Path, needle: bytes) -> None:
    """Flip one bit inside the first occurrence of ``needle`` (a deterministic 'bit rot')."""
    raw = bytearray(path.read_bytes())
    i = raw.index(needle)
    raw[i + 1] ^= 0x01
    path.write_bytes(bytes(raw))


def events_since(mark: int) -> list[cache_integrity.IntegrityEvent]:
    return cache_integrity.since(mark)


def extracted_store(synthetic_path: Path, db: Path):
    data = load_locomo(synthetic_path)
    svc = open_service("sqlite", path=db, on_corrupt="rebuild")
    table, _ = extract_dataset(svc, data, "turns")
    counts = {c.sample_id: svc.count(conversation_key(c)) for c in data}
    trace = svc.extraction_trace()
    svc.close()
    return data, table, counts, trace


# ------------------------------------------------------------------------------ extraction store
@pytest.mark.parametrize("fault", ["zero-bytes", "truncated", "garbage", "row-bit-flip", "state-bit-flip"])
def test_corrupt_extraction_store_is_reported_rebuilt_and_reextracted(synthetic_path, tmp_path, caplog, fault):
    db = tmp_path / "store.db"
    data, table, counts, trace = extracted_store(synthetic_path, db)
    assert counts == {"syn-1": 5, "syn-2": 2} and table.jobs_run.sum() > 0 and trace
    if fault == "zero-bytes":
        db.write_bytes(b"")
    elif fault == "truncated":
        db.write_bytes(db.read_bytes()[:5000])
    elif fault == "garbage":
        db.write_bytes(os.urandom(8192))
    elif fault == "row-bit-flip":
        flip_bytes(db, b"pottery class")
    else:
        flip_bytes(db, b"memory:last_extract_at")
    mark = cache_integrity.mark()
    svc = open_service("sqlite", path=db, on_corrupt="rebuild")
    evs = events_since(mark)
    assert len(evs) == 1 and evs[0].path == str(db) and evs[0].artefact == "memory-store"
    assert evs[0].moved_to and Path(evs[0].moved_to).is_file()  # the bad file is kept for inspection
    assert str(db) in caplog.text  # a logger warning names the path
    again, _ = extract_dataset(svc, data, "turns")  # no cursor survives: everything is extracted again
    assert again.jobs_run.sum() == table.jobs_run.sum()
    assert {c.sample_id: svc.count(conversation_key(c)) for c in data} == counts
    assert len(svc.extraction_trace()) == len(trace)
    svc.close()


@pytest.mark.parametrize("fault", ["zero-bytes", "row-bit-flip"])
def test_a_durable_store_that_fails_its_check_is_an_error_naming_the_file(tmp_path, fault):
    db = tmp_path / "memories.db"
    s = SQLiteMemoryService(db)
    s.add(A, "Alice likes pottery class on Sundays")
    s.close()
    if fault == "zero-bytes":
        db.write_bytes(b"")
    else:
        flip_bytes(db, b"pottery class")
    with pytest.raises(CacheCorruptError, match=f"{db}.*integrity check") as e:
        SQLiteMemoryService(db)
    assert ("0 bytes" if fault == "zero-bytes" else "checksum") in str(e.value)
    assert db.is_file()  # a durable store is never moved or replaced behind the user's back


# ------------------------------------------------------------------------------ saved index
def _index_fixture(tmp_path: Path):
    db = tmp_path / "store.db"
    s = open_service("sqlite", path=db)
    for t in ("Alice moved to Sweden for work", "Alice likes pottery", "Bob adopted a dog named Rex",
              "Bob hiked Mount Tam with Rex", "Carol plays the violin"):
        s.add(A, t)
    before = [(h.id, round(h.score, 6)) for h in s.search(A, "Where did Alice move?")]
    s.close()
    idx = tmp_path / "store.db.index"
    assert idx.is_file()
    return db, idx, before


@pytest.mark.parametrize("fault", ["zero-bytes", "truncated", "bit-flip", "64KiB-flipped"])
def test_corrupt_index_is_reported_and_rebuilt_not_used(tmp_path, fault):
    db, idx, before = _index_fixture(tmp_path)
    raw = bytearray(idx.read_bytes())
    if fault == "zero-bytes":
        raw = bytearray()
    elif fault == "truncated":
        raw = raw[: len(raw) // 2]
    elif fault == "bit-flip":
        raw[len(raw) // 2] ^= 0x10
    else:
        raw = raw + bytearray(70_000)  # make room, then invert 64 KiB in the middle of the members
        start = 200
        raw[start:start + 65536] = bytes(b ^ 0xFF for b in raw[start:start + 65536])
    idx.write_bytes(bytes(raw))
    mark = cache_integrity.mark()
    s = open_service("sqlite", path=db)
    evs = events_since(mark)
    assert [(e.artefact, e.path) for e in evs] == [("index", str(idx))]
    assert s.searcher.builds == 0
    assert [(h.id, round(h.score, 6)) for h in s.search(A, "Where did Alice move?")] == before
    assert s.searcher.builds == 1  # rebuilt from the store, not loaded
    s.close()


def test_index_file_is_never_unpickled(tmp_path):
    db, idx, _ = _index_fixture(tmp_path)
    marker = tmp_path / "executed"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    idx.write_bytes(pickle.dumps({"version": 3, "config": {}, "keys": Payload()}))
    mark = cache_integrity.mark()
    s = open_service("sqlite", path=db)
    assert not marker.exists()  # loading a saved index runs no code from the file
    assert [e.artefact for e in events_since(mark)] == ["index"]
    assert s.search(A, "pottery").hits[0].entry.text == "Alice likes pottery"
    s.close()
    with np.load(idx, allow_pickle=False) as z:  # what is written back is plain arrays + a JSON manifest
        manifest = json.loads(z["manifest"].tobytes())
    assert manifest["format"] == "memlab-index" and manifest["version"] >= 4 and manifest["sha256"]
    assert str(tmp_path) not in json.dumps(manifest)  # no paths stored in the index


# ------------------------------------------------------------------------------ embedding cache
def test_zeroed_cached_embeddings_are_detected_and_recomputed(tmp_path):
    cache = tmp_path / "emb.sqlite"
    texts = ["Alice likes pottery", "Bob adopted a dog", "Carol plays the violin", "Dan runs marathons"]
    e1 = make_embedder("tfidf-lsa", cache_path=cache).fit(texts)
    want = e1.embed(texts)
    e1.close()
    con = sqlite3.connect(cache)
    con.execute("UPDATE emb SET v = zeroblob(length(v))")
    con.commit()
    con.close()
    e2 = make_embedder("tfidf-lsa", cache_path=cache).fit(texts)
    mark = cache_integrity.mark()
    got = e2.embed(texts)
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert np.linalg.norm(got, axis=1).min() > 0.99
    evs = events_since(mark)
    assert len(evs) == len(texts) and {e.path for e in evs} == {str(cache)}
    assert e2.misses == len(texts) and e2.hits == 0
    e3 = make_embedder("tfidf-lsa", cache_path=cache).fit(texts)  # the recomputed rows were stored again
    np.testing.assert_allclose(e3.embed(texts), want, atol=1e-6)
    assert e3.hits == len(texts)


@pytest.mark.parametrize("fault", ["zero-bytes", "garbage"])
def test_unreadable_embedding_cache_is_rebuilt(tmp_path, fault):
    cache = tmp_path / "emb.sqlite"
    cache.write_bytes(b"" if fault == "zero-bytes" else b"\x00garbage" * 1000)
    texts = ["Alice likes pottery", "Bob adopted a dog", "Carol plays the violin"]
    mark = cache_integrity.mark()
    e = make_embedder("tfidf-lsa", cache_path=cache).fit(texts)
    v = e.embed(texts)
    assert v.shape[0] == 3 and e.misses == 3
    assert [(x.artefact, x.path) for x in events_since(mark)] == [("embedding-cache", str(cache))]


# ------------------------------------------------------------------------------ response cache
def test_a_corrupt_cached_response_is_refetched_never_used(tmp_path):
    cache = tmp_path / "responses.sqlite"
    msgs = [{"role": "user", "content": "What is Bob's dog called?"}]
    with ScriptedServer([Reply(text="Rex")], default=Reply(text="Rex again")) as srv:
        c1 = ModelClient("openai/scripted", api_base=srv.api_base, api_key="x", cache_path=cache)
        assert c1.complete(msgs).text == "Rex"
        con = sqlite3.connect(cache)
        con.execute("UPDATE responses SET body = replace(body, 'Rex', 'Max')")  # bit rot in one entry
        con.commit()
        con.close()
        c2 = ModelClient("openai/scripted", api_base=srv.api_base, api_key="x", cache_path=cache)
        mark = cache_integrity.mark()
        got = c2.complete(msgs)
        assert got.text == "Rex again" and not got.from_cache and c2.calls == 1 and len(srv.requests) == 2
        assert [(e.artefact, e.path) for e in events_since(mark)] == [("response-cache", str(cache))]
        c3 = ModelClient("openai/scripted", api_base=srv.api_base, api_key="x", cache_path=cache)
        assert c3.complete(msgs).text == "Rex again" and c3.cache_hits == 1  # the re-fetched reply is cached


@pytest.mark.parametrize("fault", ["zero-bytes", "truncated"])
def test_unreadable_response_cache_is_rebuilt(tmp_path, fault):
    cache = tmp_path / "responses.sqlite"
    with ScriptedServer(default=Reply(text="ok")) as srv:
        c1 = ModelClient("openai/scripted", api_base=srv.api_base, api_key="x", cache_path=cache)
        c1.complete([{"role": "user", "content": "q"}])
        c1.cache.close()
        for side in ("-wal", "-shm"):
            Path(str(cache) + side).unlink(missing_ok=True)
        cache.write_bytes(b"" if fault == "zero-bytes" else cache.read_bytes()[:1000])
        mark = cache_integrity.mark()
        c2 = ModelClient("openai/scripted", api_base=srv.api_base, api_key="x", cache_path=cache)
        assert c2.complete([{"role": "user", "content": "q"}]).text == "ok" and c2.calls == 1
        assert [(e.artefact, e.path) for e in events_since(mark)] == [("response-cache", str(cache))]


# ------------------------------------------------------------------------------ end to end
def test_run_with_a_zero_byte_cached_store_reextracts_and_says_so_in_run_json(synthetic_path, tmp_path):
    from memlab.run import ExperimentConfig, run_experiment

    cfg = ExperimentConfig.from_dict({"name": "t", "dataset": {"path": str(synthetic_path)},
                                      "extraction": {"name": "turns"}})
    first = run_experiment(cfg, results=tmp_path, progress=False)
    stores = list((tmp_path / ".cache" / "extract").glob("*/store.db"))
    assert len(stores) == 1 and first.info["extraction"]["memories"] == 7
    stores[0].write_bytes(b"")
    second = run_experiment(cfg, results=tmp_path, progress=False)
    info = json.loads((second.run_dir / "run.json").read_text())
    assert info["extraction"]["memories"] == 7 and info["extraction"]["from_cache"] is False
    assert [(e["artefact"], e["path"]) for e in info["cache_integrity"]] == [("memory-store", str(stores[0]))]
    assert second.summary.loc["overall 1-5", "f1"] == first.summary.loc["overall 1-5", "f1"]
    assert len((second.run_dir / "traces" / "extraction.jsonl").read_text().splitlines()) == 7


def test_caches_live_under_the_results_root_whatever_the_working_directory(tmp_path, monkeypatch):
    from memlab.rundir import results_root

    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (tmp_path / "notebooks").mkdir()
    monkeypatch.delenv("MEMLAB_RESULTS", raising=False)
    monkeypatch.chdir(tmp_path / "notebooks")
    assert results_root() == tmp_path.resolve() / "results"
    monkeypatch.setenv("MEMLAB_RESULTS", "elsewhere")
    assert results_root() == (tmp_path / "notebooks" / "elsewhere").resolve() and results_root().is_absolute()
    # a run's root, as both executors place it: a resumed run's parent, else the results given, else the default
    assert results_root("mine", resume=tmp_path / "r" / "offline-20261203-000000") == (tmp_path / "r").resolve()
    assert results_root("mine") == (tmp_path / "notebooks" / "mine").resolve()
    assert results_root(None) == results_root()


# ------------------------------------------------------------------------------ first open, concurrently
@pytest.mark.parametrize("artefact", ["response-cache", "embedding-cache"])
def test_a_new_cache_opened_by_many_at_once_is_never_set_aside(tmp_path, artefact):
    """Threads (or Ray tasks) opening one new cache file at once: none may read another's half-made schema
    as an 'older memlab' file and move aside the file the others already write to (rows were lost so)."""
    import threading

    from memlab.index import CachedEmbedder, TfidfLSAEmbedder
    from memlab.llm.cache import ResponseCache

    def open_cache(path: Path):  # each cache's public way in: constructing a ResponseCache, CachedEmbedder.open()
        return ResponseCache(path) if artefact == "response-cache" else CachedEmbedder(TfidfLSAEmbedder(), path).open()

    for trial in range(20):
        path = tmp_path / f"{trial}.sqlite"
        mark = cache_integrity.mark()
        gate = threading.Barrier(8)
        conns: list = []

        def opener(path: Path = path, gate: threading.Barrier = gate, conns: list = conns) -> None:
            gate.wait()
            conns.append(open_cache(path))

        threads = [threading.Thread(target=opener) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert events_since(mark) == [], f"trial {trial}: a fresh file was set aside"
        assert not list(tmp_path.glob(f"{trial}.sqlite.corrupt-*"))
        for c in conns:
            c.close()
    cache = ResponseCache(tmp_path / "r.sqlite")
    cache.put("h1", "m", {"text": "x"})
    assert sqlite3.connect(tmp_path / "r.sqlite").execute("SELECT count(*) FROM responses").fetchone() == (1,)


def test_a_cache_from_an_older_memlab_is_still_set_aside(tmp_path):
    from memlab.llm import ResponseCache

    path = tmp_path / "responses.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE responses (h TEXT PRIMARY KEY, model TEXT, body TEXT)")  # no meta, no checksums
    con.commit()
    con.close()
    mark = cache_integrity.mark()
    ResponseCache(path)
    (ev,) = events_since(mark)
    assert ev.artefact == "response-cache" and "older memlab" in ev.problem
    assert len(list(tmp_path.glob("responses.sqlite.corrupt-*"))) == 1


# ------------------------------------------------------------------------------ issue 20: keyed by what answered
def _judging(verdict: str):
    """The scripted model of the runner tests, judging every answer with ``verdict``."""
    from tests.scripted_model import responder

    def respond(body: dict) -> Reply:
        if "grade answers" in body["messages"][0]["content"]:
            return Reply(text=verdict)
        return responder(body)
    return respond


def test_two_runs_differing_only_in_api_base_each_reach_their_own_server(synthetic_path, tmp_path):
    """Before: the second run was answered entirely from the first server's cached replies (0 requests), its
    extraction served from the first server's cached memories, and run.json credited the second server."""
    from tests.test_faults_run import model

    over = {"extraction.name": "llm", "extraction.model": "openai/scripted", "judge.model": "openai/scripted"}
    with ScriptedServer(responder=_judging("CORRECT")) as a, ScriptedServer(responder=_judging("CORRECT")) as b:
        first = run_experiment_quiet(model(synthetic_path, a, **over), tmp_path)
        second = run_experiment_quiet(model(synthetic_path, b, **over), tmp_path)
        kinds = {("extract" if "add_memory" in json.dumps(r.get("tools", [])) else
                  "judge" if "grade answers" in r["messages"][0]["content"] else "answer") for r in b.requests}
        assert kinds == {"extract", "answer", "judge"}  # every role asked the second server
        assert second.info["extraction"]["from_cache"] is False
        assert second.info["extraction"]["cache_key"] != first.info["extraction"]["cache_key"]
        n = len(b.requests)
        again = run_experiment_quiet(model(synthetic_path, b, **over), tmp_path)  # same server: all cached
        assert len(b.requests) == n and again.info["extraction"]["from_cache"] is True


def run_experiment_quiet(cfg, results):
    from memlab.run import run_experiment

    return run_experiment(cfg, results=results, progress=False)


def test_a_run_judged_not_correct_scores_no_j_and_asks_the_judge_again(synthetic_path, tmp_path):
    """Before: "The generated answer is NOT CORRECT." scored J = 1.0 on every question, and a garbage verdict
    was cached, so a fresh run made 0 judge calls. The run's judge is the registered one (JUDGES["llm"])."""
    from memlab.answer import JUDGES
    from memlab.run.clients import Clients
    from memlab.run.components import build_judge
    from memlab.run.rescore import rescore
    from tests.test_faults_run import model

    verdict = ["The generated answer is NOT CORRECT."]
    with ScriptedServer(responder=lambda body: _judging(verdict[0])(body)) as srv:
        cfg = model(synthetic_path, srv, **{"judge.model": "openai/scripted"})
        run = run_experiment_quiet(cfg, tmp_path)
        p = run.predictions
        assert p.judge_error.notna().all() and p.j.isna().all() and p.error.isna().all()
        assert p.judge_error.str.contains("negates or hedges").all()
        judged = sum("grade answers" in r["messages"][0]["content"] for r in srv.requests)
        run_experiment_quiet(cfg, tmp_path)  # a fresh run: the verdicts were not cached
        assert sum("grade answers" in r["messages"][0]["content"] for r in srv.requests) == 2 * judged == 14
        assert type(build_judge(cfg, Clients(cfg, tmp_path / "r.sqlite"))) is JUDGES.get("llm")
        verdict[0] = "CORRECT"  # rescore --allow-model-calls asks again too (nothing unreadable was cached)
        res = rescore(run.run_dir, allow_model_calls=True, write=False)
        assert res.info["judge"]["model_calls"] == 7 and res.scores["j"].eq(1.0).all()


def test_extractors_with_other_settings_never_share_cached_memories(synthetic_path, tmp_path):
    """Before: a user's extractor without an explicit ``name`` was keyed "extractor" whatever its settings."""
    from memlab.extract import ExtractionRequest, ExtractionResult, Extractor, MemoryOp
    from memlab.run import ExperimentConfig, run_experiment

    class Prefixed(Extractor):
        reconciles = False
        reads_old_memories = False

        def __init__(self, prefix: str = "said"):
            self.prefix = prefix

        def extract(self, request: ExtractionRequest) -> ExtractionResult:
            return ExtractionResult(ops=[MemoryOp(action="add", text=f"{m.speaker} {self.prefix}: {m.text}",
                                                  kind="fact", source_ids=(m.id,)) for m in request.delta])

    assert Prefixed("said").cache_id() != Prefixed("wrote").cache_id()
    assert "Prefixed" in Prefixed().cache_id() and not Prefixed().cache_id().startswith("extractor")
    cfg = ExperimentConfig.from_dict({"name": "t", "dataset": {"path": str(synthetic_path)}})
    runs = [run_experiment(cfg, results=tmp_path, progress=False, extractor=Prefixed(p)) for p in ("said", "wrote")]
    assert runs[0].info["extraction"]["cache_key"] != runs[1].info["extraction"]["cache_key"]
    assert runs[1].info["extraction"]["from_cache"] is False
    texts = [(r.run_dir / "traces" / "memories.jsonl").read_text() for r in runs]
    assert " said: " in texts[0] and " wrote: " in texts[1] and " said: " not in texts[1]


def test_malformed_extraction_arguments_are_counted_in_run_json_and_the_cli_line(synthetic_path, tmp_path, capsys):
    """Before: invalid JSON arguments in some sessions were dropped silently: run "complete", the CLI said
    "malformed 0" and the replies were cached."""
    from memlab.cli import main
    from tests.scripted_model import responder
    from tests.test_faults_run import model

    def respond(body: dict) -> Reply:
        if "add_memory" not in json.dumps(body.get("tools", [])):
            return responder(body)
        reask = any(m["role"] == "tool" for m in body["messages"])
        calls = responder({**body, "messages": body["messages"][:2]}).tool_calls
        if reask:  # shown the error: the broken call comes back well-formed
            return Reply(tool_calls=calls[-1:])
        return Reply(tool_calls=[*calls[:-1], {"name": "add_memory", "arguments": '{"memory": "half'}])

    with ScriptedServer(responder=respond) as srv:
        cfg = tmp_path / "c.yaml"
        cfg.write_text(model(synthetic_path, srv, **{"extraction.name": "llm",
                                                     "extraction.model": "openai/scripted"}).to_yaml())
        assert main(["run", str(cfg), "--results", str(tmp_path / "r")]) == 0
        jobs = sum(1 for r in srv.requests if "add_memory" in json.dumps(r.get("tools", []))
                   and not any(m["role"] == "tool" for m in r["messages"]))
        (run_json,) = (tmp_path / "r").glob("*/run.json")
        info = json.loads(run_json.read_text())
        assert jobs > 1 and info["extraction"]["malformed_tool_calls"] == jobs
        assert info["extraction"]["memories"] == 7 and info["status"] == "complete"
        assert f"malformed {jobs})" in capsys.readouterr().out
        trace = [json.loads(x) for x in (run_json.parent / "traces" / "extraction.jsonl").read_text().splitlines()]
        assert [r["malformed_tool_calls"] for r in trace if "malformed_tool_calls" in r] == [1] * jobs  # per job


def test_an_echoed_key_is_redacted_from_every_stored_error(synthetic_path, tmp_path, monkeypatch):
    """Before: a server echoing the Authorization header in its error body got the key stored verbatim in
    predictions, traces and run.json."""
    from tests.test_faults_run import model

    secret = "sk-h20a-this-is-the-secret-key"
    monkeypatch.setenv("H20A_TEST_KEY", secret)
    with ScriptedServer(default=Reply(status=500, text="upstream failed", echo_auth=True)) as srv:
        run = run_experiment_quiet(model(synthetic_path, srv, **{"models.api_key_env": "H20A_TEST_KEY"}), tmp_path)
    errors = run.predictions.error
    assert errors.notna().all() and errors.str.contains("Authorization: Bearer [redacted]", regex=False).all()
    stored = [p for p in run.run_dir.rglob("*") if p.is_file()]
    assert any(p.name == "run.json" for p in stored) and any(p.suffix == ".parquet" for p in stored)
    leaked = [str(p) for p in stored if secret.encode() in p.read_bytes()]
    assert leaked == [] and len(srv.requests) > 0
