"""Replies of a set form on endpoints that hold them to a JSON schema (``structured_output: json_schema``), reply
caps (``max_tokens``: a cut-off reply is an error), and the imitation of llama-server as measured against the real
one (`benchmarks/real_vs_scripted.py`). Scripted server over real HTTP; the real model: `test_real_model.py`."""

from __future__ import annotations

import json
import socket
import time
from datetime import datetime

import pytest

import memlab.llm as llm
from memlab.answer.llm_arms import OptimizedAnswerer
from memlab.eval.profiles import ProfileJudge
from memlab.extract import LLMExtractor, Message
from memlab.extract.extractors import ExtractionRequest
from memlab.testing import Reply, ScriptedServer
from tests import test_model_faults as faults
from tests.test_model_faults import KEY, MODEL, client, question

ctx = faults.ctx  # the answering context fixture those tests use (two memories of syn-1)


def delta() -> list[Message]:
    day = datetime(2023, 5, 8)
    return [Message("user", "I adopted a puppy named Max!", day, id="D1:1", speaker="Alice"),
            Message("user", "So cute. I started pottery.", day, id="D1:2", speaker="Bob")]


def request() -> ExtractionRequest:
    return ExtractionRequest(key=KEY, delta=delta(), old_memories=[])


# ------------------------------------------------------------------------------------- reply caps
def test_max_tokens_is_sent_and_a_reply_cut_there_is_an_error_never_cached(tmp_path):
    cache = tmp_path / "r.sqlite"
    with ScriptedServer(default=Reply(text="a long rambling answer " * 10, completion_tokens=40)) as srv:
        c = client(srv, max_tokens=16, cache_path=cache)
        e = pytest.raises(llm.TruncatedReply, c.complete, [{"role": "user", "content": "hi"}]).value
        assert srv.requests[-1]["max_tokens"] == 16 and "cut off at max_tokens = 16" in str(e)
        assert e.partial.truncated == 1 and e.partial.usage.completion_tokens == 16 and c.truncated == 1
        pytest.raises(llm.TruncatedReply, c.complete, [{"role": "user", "content": "hi"}])
        assert len(srv.requests) == 2  # not cached: asked again
        assert c.usage.completion_tokens == 32  # what the endpoint computed, cut replies included


# ---------------------------------------------------------------------------- JSON-schema extraction
def test_extraction_as_one_json_object_becomes_the_same_ops(tmp_path):
    ops = {"operations": [
        {"tool": "add_memory", "memory": "Alice adopted a puppy named Max.", "kind": "episode",
         "event_time": "2023-05-08", "participants": ["Alice"], "source_ids": ["D1:1"]},
        {"tool": "add_memory", "memory": "I love pottery"},  # first person: dropped with its reason
        {"tool": "clear_memories"}]}
    with ScriptedServer([Reply(text=json.dumps(ops))]) as srv:
        c = client(srv, structured_output="json_schema")
        out = LLMExtractor(MODEL, prompt="basic", client=c).extract(request())
        body = srv.requests[0]
    assert "tools" not in body and body["response_format"]["type"] == "json_schema"
    schema = body["response_format"]["json_schema"]["schema"]
    items = schema["properties"]["operations"]["items"]["anyOf"]
    assert [v["properties"]["tool"]["const"] for v in items] == ["add_memory", "update_memory", "delete_memory",
                                                                 "clear_memories"]
    assert items[0]["required"] == ["tool", "memory"] and items[0]["properties"]["memory"]["maxLength"] == 300
    assert "Reply with one JSON object" in body["messages"][0]["content"]
    assert [(o.action, o.source_ids) for o in out.ops] == [("add", ("D1:1",)), ("clear", ("D1:1", "D1:2"))]
    assert len(out.dropped) == 1 and "first-person" in out.dropped[0]
    assert out.calls == 1 and out.usage.prompt_tokens == 11


def test_a_json_extraction_reply_that_is_not_the_schema_fails_the_job_and_is_not_cached(tmp_path):
    cache = tmp_path / "r.sqlite"
    with ScriptedServer([Reply(text="Sure! Here are the memories: Alice has a puppy.")]) as srv:
        c = client(srv, structured_output="json_schema", cache_path=cache)
        with pytest.raises(llm.BadReply, match="not JSON"):
            LLMExtractor(MODEL, prompt="basic", client=c).extract(request())
    with ScriptedServer([Reply(text='{"operations": []}')]) as srv:  # the same request, asked again
        c = client(srv, structured_output="json_schema", cache_path=cache)
        assert LLMExtractor(MODEL, prompt="basic", client=c).extract(request()).ops == [] and c.calls == 1


def test_the_json_extractor_is_another_cache_entry_than_the_tool_one():
    with ScriptedServer() as srv:
        tools = LLMExtractor(MODEL, client=client(srv)).cache_id()
        schema = LLMExtractor(MODEL, client=client(srv, structured_output="json_schema")).cache_id()
    assert tools != schema and "json_schema@" in schema and "json_schema" not in tools


# ----------------------------------------------------------------------- the optimized arm, step by step
def test_optimized_arm_in_json_steps_searches_then_answers(ctx):
    steps = [Reply(text=json.dumps({"action": "memory_search", "query": "Bob dog"})),
             Reply(text=json.dumps({"action": "answer", "answer": "Rex"}))]
    with ScriptedServer(steps) as srv:
        ans = OptimizedAnswerer(client(srv, structured_output="json_schema"), max_rounds=3).timed(question(), ctx)
        first, second = srv.requests
    assert ans.prediction == "Rex" and ans.rule == "model answered in round 2" and ans.calls == 2
    assert ans.tool_calls == [{"round": 1, "name": "memory_search", "arguments": '{"query": "Bob dog"}'}]
    assert "Rex" in second["messages"][-1]["content"] and second["messages"][-1]["role"] == "user"
    assert "tools" not in first and {v["properties"]["action"]["const"] for v in
                                     first["response_format"]["json_schema"]["schema"]["anyOf"]} == \
        {"memory_search", "memory_load", "answer"}
    assert any(e.text.startswith("Bob adopted") for e in ans.context)


def test_optimized_arms_last_json_step_admits_only_the_answer(ctx):
    search = Reply(text=json.dumps({"action": "memory_search", "query": "dog"}))
    with ScriptedServer([search, Reply(text=json.dumps({"action": "answer", "answer": "Rex"}))]) as srv:
        OptimizedAnswerer(client(srv, structured_output="json_schema"), max_rounds=2).timed(question(), ctx)
        last = srv.requests[-1]["response_format"]["json_schema"]["schema"]
    assert last["properties"]["action"]["const"] == "answer" and last["required"] == ["action", "answer"]


def test_an_empty_json_answer_is_an_error_not_an_abstention(ctx):
    with ScriptedServer([Reply(text=json.dumps({"action": "answer", "answer": "  "}))]) as srv:
        with pytest.raises(llm.BadReply, match="answer is empty"):
            OptimizedAnswerer(client(srv, structured_output="json_schema")).timed(question(), ctx)


# ------------------------------------------------------------------------------------- the judge
@pytest.mark.parametrize("profile, reply, score", [
    ("locomo", '{"label": "CORRECT"}', 1.0), ("mem0", '{"reason": "same dog", "label": "WRONG"}', 0.0),
    ("trpc-agent-go", '{"correct": true, "confidence": 0.8}', 0.8)])
def test_the_judge_is_held_to_the_schema_its_profile_reads(profile, reply, score):
    with ScriptedServer([Reply(text=reply)]) as srv:
        j = ProfileJudge(client(srv, structured_output="json_schema"), profile=profile)
        v, _, _ = j.judge(question(), "Rex")
        fmt = srv.requests[0]["response_format"]
    assert v == pytest.approx(score) and fmt["json_schema"]["schema"] == j.profile.verdict_schema


def test_a_longmemeval_verdict_schema_gives_the_bare_word_its_reader_takes():
    from memlab.eval.harnesses import LongMemEvalProfile

    p = LongMemEvalProfile()
    assert p.verdict_schema["enum"] == ["yes", "no"] and p.judge_score('"yes"') == 1.0 and p.judge_score('"no"') == 0


# ------------------------------------------------------------------- the imitation of llama-server
def test_imitated_llama_server_refuses_a_prompt_over_its_context_as_the_real_one_does():
    with ScriptedServer.imitating("llama-server", default=Reply(text="hi"), n_ctx=50) as srv:
        c = client(srv)
        c.context_window = None  # no memlab pre-check: what the server itself does
        c.resolved_context_window = lambda: (None, "unknown")
        with pytest.raises(llm.ModelCallError, match="exceeds the available context size"):
            c.complete([{"role": "user", "content": "hello " * 100}])


def test_imitated_llama_server_reports_cached_prompt_tokens_and_answers_any_model_name():
    with ScriptedServer.imitating("llama-server", default=Reply(text="hi", prompt_tokens=100)) as srv:
        c = client(srv)
        msgs = [{"role": "user", "content": "a shared prefix " * 30}]
        assert c.complete(msgs).usage.cached_tokens == 0
        assert c.complete(msgs, cache_tag="again").usage.cached_tokens > 90


def test_imitated_llama_server_frees_its_slot_when_the_client_goes_away():
    """The real server cancels a request whose connection closed (measured: its one slot answers the next request
    at once); the imitation stops 'generating' too, instead of holding its serial slot for the whole delay."""
    with ScriptedServer.imitating("llama-server", script=[Reply(text="long", delay=5.0)],
                                  default=Reply(text="next")) as srv:
        host, port = "127.0.0.1", int(srv.api_base.rsplit(":", 1)[1].split("/")[0])
        body = json.dumps({"model": "local", "messages": [{"role": "user", "content": "x"}]}).encode()
        with socket.create_connection((host, port)) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            time.sleep(0.3)
        t0 = time.monotonic()
        assert client(srv).complete([{"role": "user", "content": "y"}]).text == "next"
        assert time.monotonic() - t0 < 2.5
