"""LLMExtractor through real litellm over HTTP against the scripted server on 127.0.0.1."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from datetime import datetime, timedelta

import pytest

from memlab.extract import (
    AutoMemoryWorker,
    ChatSession,
    LLMExtractor,
    Message,
    ReconcileConfig,
    TurnsAndLLM,
    extraction_tools,
    load_prompt,
    parse_tool_call,
    render,
)
from memlab.index import open_service
from memlab.llm import ModelCallError, ModelClient
from memlab.memory import SearchOptions, UserKey
from memlab.testing import Reply, ScriptedServer

K = UserKey("app", "alice")
T0 = datetime(2023, 5, 8, 13, 0)


def session(*texts):
    return ChatSession("s", K, [Message("user" if i % 2 == 0 else "assistant", t, T0 + timedelta(seconds=i),
                                        f"D1:{i + 1}", speaker="Alice" if i % 2 == 0 else "Bob")
                                for i, t in enumerate(texts)])


def extractor(srv, **kw):
    return LLMExtractor("openai/scripted-extractor", api_base=srv.api_base, api_key="x", backoff=0.01, **kw)


ADD_TEA = {"name": "add_memory", "arguments": {"memory": "Alice went to a tea tasting in Kyoto", "kind": "episode",
                                               "event_time": "2023-05-07", "participants": ["Alice"],
                                               "location": "Kyoto", "topics": ["tea", "travel"],
                                               "source_ids": ["D1:1"]}}


def test_tool_calls_become_typed_ops_and_prompt_carries_memories():
    svc = open_service("memory")
    old = svc.add(K, "Alice likes green tea")
    with ScriptedServer([Reply(tool_calls=[
        ADD_TEA,
        {"name": "update_memory", "arguments": {"memory_id": old.id, "memory": "Alice loves matcha"}},
        {"name": "add_memory", "arguments": "{not json"},                                # invalid JSON
        {"name": "remember_forever", "arguments": {"memory": "x"}},                      # unknown tool
        {"name": "delete_memory", "arguments": {}},                                      # missing id
        {"name": "add_memory", "arguments": {"memory": "x", "event_time": "last spring"}},  # bad date
    ], prompt_tokens=420, completion_tokens=60, cached_tokens=128),
        Reply(text="Nothing more to add.", prompt_tokens=500, completion_tokens=5)]) as srv:  # the re-ask
        w = AutoMemoryWorker(svc, extractor(srv, prompt="structured"), reconcile_config=ReconcileConfig(enabled=False))
        s = session("I went to a tea tasting in Kyoto yesterday!", "Sounds lovely.")
        r = w.run_job(s)
        body = srv.requests[0]
    assert r.status == "ran" and s.cursor == s.messages[-1].timestamp
    assert len(r.dropped) == 4
    assert any("not valid JSON" in d for d in r.dropped) and any("unknown tool" in d for d in r.dropped)
    assert any("missing memory_id" in d for d in r.dropped) and any("last spring" in d for d in r.dropped)
    tea = r.proposed[0]
    assert (tea.kind, tea.event_time, tea.location, tea.participants) == ("episode", datetime(2023, 5, 7), "Kyoto",
                                                                         ("Alice",))
    assert tea.source_ids == ("D1:1",)  # cited id kept
    assert r.proposed[1].source_ids == ("D1:1", "D1:2")  # none cited: the whole delta
    assert {e.text for e in svc.list(K)} == {"Alice went to a tea tasting in Kyoto", "Alice loves matcha"}
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.cached_tokens) == (920, 65, 128)
    prompt = body["messages"][0]["content"]
    assert "Alice likes green tea" in prompt and old.id in prompt  # old memories rendered
    assert "[D1:1] (2023-05-08) Alice: I went to a tea tasting" in prompt  # delta rendered with ids
    assert {t["function"]["name"] for t in body["tools"]} == {"add_memory", "update_memory", "delete_memory",
                                                             "clear_memories"}
    assert w.counters.ops_dropped_malformed == 4 and w.counters.model_calls == 2  # invalid JSON: re-asked once
    assert w.counters.malformed_tool_calls == 1 and r.malformed_tool_calls == 1
    shown = [m["content"] for m in srv.requests[1]["messages"] if m["role"] == "tool"]
    assert len(shown) == 6 and sum("not valid JSON" in c for c in shown) == 1


@pytest.mark.parametrize("fault", [Reply(status=429), Reply(status=500), Reply(malformed=True)])
def test_transient_faults_are_retried(fault):
    with ScriptedServer([fault, Reply(tool_calls=[ADD_TEA])]) as srv:
        svc = open_service("memory")
        r = AutoMemoryWorker(svc, extractor(srv)).run_job(session("tea in Kyoto"))
        assert r.status == "ran" and svc.count(K) == 1 and len(srv.requests) == 2


def test_retries_exhausted_fail_the_job_cursor_unchanged():
    with ScriptedServer([Reply(status=500)] * 3) as srv:
        s = session("tea in Kyoto")
        r = AutoMemoryWorker(open_service("memory"), extractor(srv, max_retries=2)).run_job(s)
        assert r.status == "failed" and "after 3 attempt" in r.reason and s.cursor is None
        assert len(srv.requests) == 3


def test_hang_past_timeout_fails_the_job():
    with ScriptedServer([Reply(hang=3.0, tool_calls=[ADD_TEA])]) as srv:
        s = session("tea in Kyoto")
        w = AutoMemoryWorker(open_service("memory"), extractor(srv, timeout=0.5, max_retries=0))
        r = w.run_job(s)
        assert r.status == "failed" and s.cursor is None and w.counters.jobs_failed == 1
        w.close()


def test_plain_text_reply_means_no_ops():
    with ScriptedServer([Reply(text="Nothing worth remembering.")]) as srv:
        svc = open_service("memory")
        s = session("ok")
        r = AutoMemoryWorker(svc, extractor(srv)).run_job(s)
        assert r.status == "ran" and r.proposed == [] and s.cursor is not None and svc.count(K) == 0


def test_usage_estimated_when_provider_gives_none():
    with ScriptedServer([Reply(text="hello there", prompt_tokens=None)]) as srv:
        c = ModelClient("openai/scripted", api_base=srv.api_base, api_key="x")
        comp = c.complete([{"role": "user", "content": "count these words please"}])
        assert comp.usage.estimated and comp.usage.prompt_tokens > 0 and comp.usage.completion_tokens > 0


def test_response_cache_makes_rerun_free(tmp_path):
    with ScriptedServer([Reply(text="first")], default=Reply(text="second")) as srv:
        c = ModelClient("openai/scripted", api_base=srv.api_base, api_key="x", cache_path=tmp_path / "c.sqlite")
        a = c.complete([{"role": "user", "content": "q"}])
        c2 = ModelClient("openai/scripted", api_base=srv.api_base, api_key="x", cache_path=tmp_path / "c.sqlite")
        b = c2.complete([{"role": "user", "content": "q"}])
        d = c2.complete([{"role": "user", "content": "another"}])
        assert (a.text, b.text, d.text) == ("first", "first", "second")
        assert b.from_cache and c2.cache_hits == 1 and c2.calls == 1 and len(srv.requests) == 2


def test_bad_request_is_not_retried():
    with ScriptedServer([Reply(status=400, text="bad")]) as srv:
        c = ModelClient("openai/scripted", api_base=srv.api_base, api_key="x", backoff=0.01)
        with pytest.raises(ModelCallError, match="1 attempt"):
            c.complete([{"role": "user", "content": "q"}])


def test_parse_tool_call_rules():
    op = parse_tool_call("add_memory", json.dumps({"memory": "x", "source_ids": ["D9:9"]}), ["D1:1"])
    assert op.source_ids == ("D1:1",) and op.kind == "fact"  # uncited/unknown ids -> the delta's
    assert parse_tool_call("clear_memories", "{}", ["D1:1"]).action == "clear"
    with pytest.raises(ValueError, match="kind"):
        parse_tool_call("add_memory", json.dumps({"memory": "x", "kind": "opinion"}), [])
    assert parse_tool_call("add_memory", json.dumps({"memory": "x", "event_time": "2023-05"}), []).event_time == \
        datetime(2023, 5, 1)
    names = [t["function"]["name"] for t in extraction_tools()]
    assert names == ["add_memory", "update_memory", "delete_memory", "clear_memories"]


def test_prompts_by_name_or_path(tmp_path):
    assert "{{old_memories}}" in load_prompt("extract", "basic")
    assert "event_time" in load_prompt("extract", "structured")
    p = tmp_path / "mine.md"
    p.write_text("Only: {{messages}} / {{old_memories}}")
    with ScriptedServer([Reply(text="")]) as srv:
        AutoMemoryWorker(open_service("memory"), extractor(srv, prompt=str(p))).run_job(session("hi there"))
        assert srv.requests[0]["messages"][0]["content"].startswith("Only: [D1:1]")
    with pytest.raises(FileNotFoundError, match="available"):
        load_prompt("extract", "nonexistent")
    with pytest.raises(KeyError, match="nope"):
        render("{{nope}}", messages="x")


def test_litellm_import_and_call_never_leave_loopback():
    """In a fresh interpreter, any non-loopback connect or DNS lookup is recorded and refused."""
    code = textwrap.dedent("""
        import socket, sys
        attempts = []
        real_connect = socket.socket.connect
        real_gai = socket.getaddrinfo
        def guard_connect(self, addr):
            host = addr[0] if isinstance(addr, tuple) else str(addr)
            if host not in ("127.0.0.1", "::1", "localhost"):
                attempts.append(("connect", host))
                raise OSError("network unreachable (test guard)")
            return real_connect(self, addr)
        def guard_gai(host, *a, **k):
            if host not in ("127.0.0.1", "::1", "localhost", None):
                attempts.append(("dns", host))
                raise socket.gaierror("network unreachable (test guard)")
            return real_gai(host, *a, **k)
        socket.socket.connect = guard_connect
        socket.getaddrinfo = guard_gai
        from memlab.llm import ModelClient
        from memlab.testing import ScriptedServer, Reply
        with ScriptedServer([Reply(text="pong")]) as srv:
            c = ModelClient("openai/scripted", api_base=srv.api_base, api_key="x")
            assert c.complete([{"role": "user", "content": "ping"}]).text == "pong"
        print("ATTEMPTS", attempts)
        sys.exit(1 if attempts else 0)
    """)
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("LITELLM_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]


MATCHA = {"name": "add_memory", "arguments": {"memory": "Alice attended a matcha ceremony in Kyoto", "kind": "episode",
                                              "participants": ["Alice"], "source_ids": ["D1:1"]}}


@pytest.mark.parametrize("keeps_turns", [True, False])
def test_turns_plus_llm_keeps_turns_verbatim_and_reconciles_against_its_own_memories(keeps_turns, monkeypatch):
    monkeypatch.setattr(TurnsAndLLM, "keeps_turns", keeps_turns)  # False: what the worker did before the rule
    svc = open_service("memory", keyword="bm25", append_citing=True)
    svc.add(K, "Alice likes green tea", participants=["Alice"], source_ids=["D0:2"])  # an earlier extracted memory
    # an earlier verbatim turn that says nearly what the model is about to extract
    svc.add(K, "Alice: Alice attended a matcha ceremony in Kyoto", participants=["Alice"], source_ids=["D0:1"])
    with ScriptedServer([Reply(tool_calls=[MATCHA])]) as srv:
        w = AutoMemoryWorker(svc, TurnsAndLLM(extractor(srv)), reconcile_config=ReconcileConfig())
        r = w.run_job(session("I went to a tea tasting in Kyoto yesterday!", "Sounds lovely."))
        prompt = srv.requests[0]["messages"][0]["content"]
    assert r.status == "ran"
    tiers = [a.decision.tier for a in r.applied]
    texts = {e.text for e in svc.list(K)}
    assert tiers[:2] == ["verbatim", "verbatim"]  # the job's own turns, written as they are
    assert {"Alice: I went to a tea tasting in Kyoto yesterday!", "Bob: Sounds lovely."} <= texts
    assert "Alice likes green tea" in prompt
    if not keeps_turns:  # the model saw the turn and reconcile took the memory for that turn's duplicate
        assert "Alice: Alice attended a matcha ceremony" in prompt and tiers[2] == "skip"
        return
    assert "Alice: Alice attended a matcha ceremony" not in prompt  # the model reads its own memories only
    assert tiers[2] == "keep" and "Alice attended a matcha ceremony in Kyoto" in texts
    # observation-aware indexing with the extracted memory: its words find the turn it cites, which has none of them
    hits = svc.search(K, SearchOptions(query="matcha ceremony", keyword_only=True, unit="turn")).hits
    assert "Alice: I went to a tea tasting in Kyoto yesterday!" in [h.entry.text for h in hits]


def test_turns_plus_llm_fallback_lookup_still_hides_the_turns(monkeypatch):
    svc = open_service("memory", keyword="bm25")
    svc.add(K, "Alice likes green tea", participants=["Alice"], source_ids=["D0:2"])
    svc.add(K, "Alice: I like tea", participants=["Alice"], source_ids=["D0:1"])

    def broken(*a, **kw):
        raise RuntimeError("index unavailable")

    monkeypatch.setattr(svc, "search", broken)  # the old-memory search fails: the worker reads recent memories
    with ScriptedServer([Reply(tool_calls=[MATCHA])]) as srv:
        w = AutoMemoryWorker(svc, TurnsAndLLM(extractor(srv)), reconcile_config=ReconcileConfig(enabled=False))
        r = w.run_job(session("I went to a tea tasting in Kyoto yesterday!", "Sounds lovely."))
        prompt = srv.requests[0]["messages"][0]["content"]
    assert r.status == "ran"
    assert "Alice likes green tea" in prompt and "Alice: I like tea" not in prompt


def test_turns_plus_llm_failed_call_fails_the_job_and_writes_no_turn():
    svc = open_service("memory", keyword="bm25")
    with ScriptedServer([Reply(status=400, text="bad request")]) as srv:
        w = AutoMemoryWorker(svc, TurnsAndLLM(extractor(srv)), reconcile_config=ReconcileConfig())
        s = session("I went to a tea tasting in Kyoto yesterday!", "Sounds lovely.")
        r = w.run_job(s)
    assert r.status == "failed" and "extractor failed" in r.reason
    assert svc.list(K) == [] and s.cursor is None  # nothing half-written; the rerun extracts the job again
