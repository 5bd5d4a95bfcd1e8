"""Model failures are errors, never answers (issue 10, client/arm side) and real-server quirks (issue 13).

Each test drives `memlab.testing.ScriptedServer` over real HTTP on 127.0.0.1, either with a fault
(empty reply, tool loop, 429 storm, 500s, hang, endpoint down) or imitating a real server's quirks
(`QUIRKS`: tool calls as text, a 500 on a tool-call message without ``content``, no/per-token
embeddings, a ``/models`` listing with a context length, one request at a time).

Errors are checked by class name (``raises_model_error``) so that the same test, run against code
that has no such class, fails on behaviour ("did not raise") rather than on an import.
"""

from __future__ import annotations

import json
import threading
from datetime import datetime

import pytest

import memlab.llm as llm
from memlab.answer import AnswerContext
from memlab.answer.llm_arms import LongContextAnswerer, OptimizedAnswerer, OriginalAnswerer
from memlab.data import Question, load_locomo
from memlab.eval.profiles import ProfileJudge
from memlab.extract import AutoMemoryWorker, ChatSession, LLMExtractor, Message, ReconcileConfig
from memlab.index import open_service
from memlab.memory import SearchOptions, UserKey
from memlab.testing import QUIRKS, Reply, ScriptedServer, closed_port_api_base

MODEL = "openai/scripted"
KEY = UserKey("locomo", "syn-1")


def client(srv_or_base, **kw) -> llm.ModelClient:
    base = srv_or_base if isinstance(srv_or_base, str) else srv_or_base.api_base
    kw = {"timeout": 5.0, "max_retries": 1, "backoff": 0.01, **kw}
    return llm.ModelClient(MODEL, api_base=base, api_key="x", **kw)


def raises_model_error(fn, name: str):
    """Call ``fn``; it must raise an exception whose class (or a base) is called ``name``."""
    try:
        out = fn()
    except Exception as e:  # noqa: BLE001 - the class is checked by name below
        names = [c.__name__ for c in type(e).__mro__]
        assert name in names, f"expected {name}, got {type(e).__name__}: {e}"
        return e
    raise AssertionError(f"expected {name}, but the call returned {out!r}")


@pytest.fixture
def ctx(synthetic_path):
    conv = load_locomo(synthetic_path)["syn-1"]
    svc = open_service("memory")
    svc.add(KEY, "Bob adopted a dog named Rex.", kind="fact", participants=["Bob"])
    svc.add(KEY, "Alice took a pottery class.", kind="episode", event_time=datetime(2023, 5, 7),
            participants=["Alice"])
    return AnswerContext(service=svc, key=KEY, conversation=conv, search=SearchOptions(max_results=3))


def question(text="What is Bob's dog called?", category=4, answer="Rex"):
    return Question("syn-1", 0, text, answer, None, (), (), category, "single-hop")


def agent_model(body: dict) -> Reply:
    """A scripted agent: searches once with the question, then answers from the first result."""
    msgs = body["messages"]
    if not any(m["role"] == "tool" for m in msgs) and body.get("tool_choice") != "none":
        return Reply(tool_calls=[{"name": "memory_search", "arguments": {"query": msgs[1]["content"]}}],
                     prompt_tokens=300, completion_tokens=12)
    results = [json.loads(m["content"]).get("results", []) for m in msgs if m["role"] == "tool"]
    first = next((r[0]["text"] for r in results if r), "")
    return Reply(text=first, prompt_tokens=500, completion_tokens=8)


# ---------------------------------------------------------------------- empty replies are errors
def test_empty_reply_is_an_error_and_is_not_cached(tmp_path):
    cache = tmp_path / "responses.sqlite"
    msgs = [{"role": "user", "content": "hi"}]
    with ScriptedServer([Reply(text="")]) as srv:
        e = raises_model_error(lambda: client(srv, cache_path=cache).complete(msgs), "EmptyReply")
        assert e.partial.calls == 1 and e.partial.usage.prompt_tokens == 11  # the call's cost is kept
    with ScriptedServer([Reply(text="pong")]) as healthy:  # same request, healthy server: asked again
        c = client(healthy, cache_path=cache)
        assert c.complete(msgs).text == "pong" and c.calls == 1 and c.cache_hits == 0


@pytest.mark.parametrize("arm", ["long-context", "original"])
def test_empty_reply_is_never_the_abstain_phrase(ctx, arm):
    with ScriptedServer(default=Reply(text="   ")) as srv:
        cls = LongContextAnswerer if arm == "long-context" else OriginalAnswerer
        e = raises_model_error(lambda: cls(client(srv)).timed(question("What is Alice's dog?", 5, None), ctx),
                               "EmptyReply")
        assert e.partial.calls == 1 and e.partial.latency_s > 0


def test_judge_empty_or_unreadable_verdict_is_an_error_not_a_zero():
    with ScriptedServer([Reply(text=""), Reply(text="Maybe, partly."), Reply(text="WRONG.")]) as srv:
        j = ProfileJudge(client(srv))
        raises_model_error(lambda: j.judge(question(), "Rex"), "EmptyReply")
        raises_model_error(lambda: j.judge(question(), "Rex"), "BadReply")
        assert j.judge(question(), "Max")[0] == 0.0


# ---------------------------------------------------------------------------- the tool loop
def test_agent_still_calling_tools_after_last_round_is_an_error_with_every_round_counted(ctx):
    search = Reply(tool_calls=[{"name": "memory_search", "arguments": {"query": "dog"}}], prompt_tokens=100,
                   completion_tokens=5)
    with ScriptedServer(default=search) as srv:  # ignores tool_choice="none" on the last round
        e = raises_model_error(lambda: OptimizedAnswerer(client(srv), max_rounds=3).timed(question(), ctx),
                               "ToolLoopExhausted")
        assert len(srv.requests) == 3 and srv.requests[-1]["tool_choice"] == "none"
        assert e.partial.calls == 3 and e.partial.usage.prompt_tokens == 300


def test_tool_call_text_on_the_last_round_is_a_tool_loop_error(ctx):
    script = [Reply(tool_calls=[{"name": "memory_search", "arguments": {"query": "dog"}}]),
              Reply(text="functions.memory_search:")]
    with ScriptedServer(script) as srv:
        raises_model_error(lambda: OptimizedAnswerer(client(srv), max_rounds=2).timed(question(), ctx),
                           "ToolLoopExhausted")


# ------------------------------------------------------------------- 429 storm, 500s, hang, down
def test_429_retry_after_is_honoured():
    with ScriptedServer([Reply(status=429, retry_after=1, text="slow down"), Reply(text="ok")]) as srv:
        assert client(srv, backoff=0.01).complete([{"role": "user", "content": "hi"}]).text == "ok"
        chats = srv.arrivals[-2:]
        assert chats[1] - chats[0] >= 1.0  # waited the server's Retry-After, not the 0.01 s backoff


def test_429_storm_fails_after_retries_uncached(tmp_path):
    cache = tmp_path / "r.sqlite"
    with ScriptedServer(default=Reply(status=429, retry_after=0, text="rate limited")) as srv:
        e = raises_model_error(lambda: client(srv, max_retries=2, cache_path=cache).complete(
            [{"role": "user", "content": "hi"}]), "ModelCallError")
        assert len(srv.requests) == 3 and e.partial.calls == 3 and "RateLimit" in str(e)
    import sqlite3

    with sqlite3.connect(cache) as c:  # nothing failed is cached: no row at all, whatever the key would be
        assert c.execute("SELECT COUNT(*) FROM responses").fetchone() == (0,)


def test_optimized_round_two_500s_keep_round_one_usage(ctx):
    script = [Reply(tool_calls=[{"name": "memory_search", "arguments": {"query": "dog"}}], prompt_tokens=300,
                    completion_tokens=12)] + [Reply(status=500, text="boom")] * 2
    with ScriptedServer(script) as srv:
        e = raises_model_error(lambda: OptimizedAnswerer(client(srv, max_retries=1)).timed(question(), ctx),
                               "ModelCallError")
        assert e.partial.calls == 3 and e.partial.usage.prompt_tokens == 300
        assert e.partial.usage.completion_tokens == 12


def test_timed_out_request_is_not_piled_onto_a_busy_one_request_server():
    with ScriptedServer([Reply(hang=1.5, text="late"), Reply(text="ok")], serial=True) as srv:
        c = client(srv, timeout=0.5, max_retries=1)
        assert c.complete([{"role": "user", "content": "hi"}]).text == "ok"
        assert srv.busy_arrivals == 0 and srv.max_in_flight == 1  # the retry waited for the server


def test_one_request_at_a_time_per_local_endpoint():
    # a slow /models: the context-window probe of one thread overlaps the others' unless it takes the slot too
    with ScriptedServer(default=Reply(text="ok", delay=0.2), models_delay=0.1) as srv:
        a, b = client(srv), client(srv)  # two clients, one endpoint: one shared slot
        ts = [threading.Thread(target=c.complete, args=([{"role": "user", "content": f"q{i}"}],))
              for i, c in enumerate((a, b, a))]
        [t.start() for t in ts]
        [t.join() for t in ts]
        assert len(srv.requests) == 3 and srv.max_in_flight == 1


def test_endpoint_down_is_an_error_naming_the_endpoint():
    base = closed_port_api_base()
    e = raises_model_error(lambda: client(base).complete([{"role": "user", "content": "hi"}]),
                           "EndpointUnreachable")
    assert base in str(e) and e.partial.calls == 2


# ------------------------------------------------------------------------ tool calls as text
def test_agent_tool_call_as_text_is_recovered_by_a_forced_reask_never_answered(ctx):
    with ScriptedServer.imitating("llama-cpp-python", responder=agent_model) as srv:
        a = OptimizedAnswerer(client(srv)).timed(question(), ctx)
        assert not a.prediction.startswith("functions.") and "Rex" in a.prediction
        assert a.malformed_tool_calls == 1 and a.tool_calls[0]["name"] == "memory_search"
        forced = [r for r in srv.requests if isinstance(r.get("tool_choice"), dict)]
        assert forced and forced[0]["tool_choice"]["function"]["name"] == "memory_search"
        assert a.calls == 3  # the text reply, the forced re-ask, the answer


def test_tool_call_text_that_stays_malformed_is_an_error(ctx):
    with ScriptedServer.imitating("llama-cpp-python", responder=agent_model, ignore_tool_choice=True) as srv:
        e = raises_model_error(lambda: OptimizedAnswerer(client(srv)).timed(question(), ctx), "MalformedToolCall")
        assert e.partial.malformed_tool_calls == 1 and e.partial.calls == 2


def test_tool_call_text_with_arguments_is_parsed_without_a_second_call(ctx):
    script = [Reply(text='functions.memory_search: {"query": "dog"}'), Reply(text="Rex")]
    with ScriptedServer(script) as srv:
        a = OptimizedAnswerer(client(srv)).timed(question(), ctx)
        assert a.prediction == "Rex" and a.malformed_tool_calls == 1 and len(srv.requests) == 2
        assert a.queries[0].query == "dog"


def test_tool_call_text_recognition():
    names = ["memory_search", "memory_load"]
    assert llm.tool_call_text("functions.memory_search:", names) == ("memory_search", None)
    n, calls = llm.tool_call_text('<tool_call>{"name": "memory_load", "arguments": {"limit": 3}}</tool_call>', names)
    assert n == "memory_load" and json.loads(calls[0].arguments) == {"limit": 3}
    assert llm.tool_call_text("Rex, Bob's dog.", names) == (None, None)
    assert llm.tool_call_text("memory_search is what I would use", names) == (None, None)


def session(*texts):
    return ChatSession("s", KEY, [Message("user" if i % 2 == 0 else "assistant", t,
                                          datetime(2023, 5, 8, 13, 0, i), f"D1:{i + 1}",
                                          speaker="Alice" if i % 2 == 0 else "Bob") for i, t in enumerate(texts)])


def test_extraction_tool_call_as_text_is_reasked_with_add_memory_forced():
    add = {"memory": "Alice went to a pottery class on 2023-05-07", "kind": "episode", "source_ids": ["D1:1"]}
    with ScriptedServer.imitating("llama-cpp-python", default=Reply(
            tool_calls=[{"name": "add_memory", "arguments": add}])) as srv:
        svc = open_service("memory")
        ex = LLMExtractor(MODEL, client=client(srv))
        w = AutoMemoryWorker(svc, ex, reconcile_config=ReconcileConfig(enabled=False))
        r = w.run_job(session("I went to a pottery class yesterday."))
        assert r.status == "ran" and [e.text for e in svc.list(KEY)] == [add["memory"]]
        assert w.counters.malformed_tool_calls == 1 and w.counters.model_calls == 2
        assert srv.requests[1]["tool_choice"] == {"type": "function", "function": {"name": "add_memory"}}


# ------------------------------------------------------------- content key on tool-call turns
def test_tool_call_turn_carries_content_so_llama_cpp_template_does_not_500(ctx):
    with ScriptedServer.imitating("llama-cpp-python", responder=agent_model, tools_as_text=False) as srv:
        a = OptimizedAnswerer(client(srv)).timed(question(), ctx)
        assert "Rex" in a.prediction and a.calls == 2
        turn = srv.requests[1]["messages"][2]
        assert turn["role"] == "assistant" and turn["tool_calls"] and turn["content"] == ""


# ----------------------------------------------------------------------------- context window
def test_prompt_over_the_context_window_from_models_is_an_error_naming_both_sizes(ctx):
    with ScriptedServer(default=Reply(text="x"), models=[{"id": "scripted", "max_model_len": 120}]) as srv:
        e = raises_model_error(lambda: LongContextAnswerer(client(srv)).timed(question(), ctx), "PromptTooLong")
        assert "120 tokens" in str(e) and f"{srv.api_base}/models" in str(e) and not srv.requests
        n = int(str(e).split("~")[1].split()[0])
        assert n > 120


def test_each_client_asks_the_server_its_context_window_once():
    """A server restarted on the same address with another window (``memlab serve --port 8000 --ctx ...`` again, or
    a port reused) is asked again by the next run's clients; before, the process kept the first answer."""
    with ScriptedServer(default=Reply(text="x"), models=[{"id": "scripted", "max_model_len": 120}]) as srv:
        first = client(srv)
        assert first.resolved_context_window() == (120, f"{srv.api_base}/models")
        srv.models = [{"id": "scripted", "max_model_len": 50_000}]
        assert first.resolved_context_window()[0] == 120  # one probe a client
        assert client(srv).resolved_context_window()[0] == 50_000


def test_context_window_from_config_and_llama_server_meta():
    msgs = [{"role": "user", "content": "word " * 400}]
    with ScriptedServer(default=Reply(text="x")) as srv:
        raises_model_error(lambda: client(srv, context_window=100).complete(msgs), "PromptTooLong")
        assert client(srv, context_window=5000).complete(msgs).text == "x"
    assert llm.context_window_from_models({"data": QUIRKS["llama-server"]["models"]}, "openai/local") == 8192
    assert llm.context_window_from_models({"data": QUIRKS["ollama"]["models"]}, "openai/x") is None


# ------------------------------------------------------------------------------- embeddings
@pytest.mark.parametrize("mode, needle", [("error", "models.embedder.api_base"), ("per-token", "one vector per token")])
def test_chat_server_embeddings_fail_clearly(mode, needle):
    from memlab.index.embedders import LiteLLMEmbedder

    with ScriptedServer(embeddings=mode) as srv:
        emb = LiteLLMEmbedder(MODEL, api_base=srv.api_base, api_key="x", num_retries=0)
        with pytest.raises(RuntimeError, match=needle):
            emb.embed(["Alice went to a pottery class", "Bob adopted Rex"])


# ------------------------------------------------------------------- third-person extraction
@pytest.mark.parametrize("prompt", ["structured", "basic"])
def test_extraction_prompt_asks_for_third_person_naming_the_speaker(prompt):
    ex = LLMExtractor(MODEL, prompt=prompt)
    from memlab.extract import ExtractionRequest

    text = ex.build_messages(ExtractionRequest(KEY, session("I adopted a puppy.", "Nice").messages, []))[0]["content"]
    assert "Alice and Bob" in text and '"Alice adopted a puppy' in text and 'never "I adopted a puppy"' in text


def test_first_person_memories_are_dropped_third_person_kept():
    calls = [{"name": "add_memory", "arguments": {"memory": "I adopted a puppy named Rex", "source_ids": ["D1:1"]}},
             {"name": "add_memory", "arguments": {"memory": "Alice adopted a puppy named Rex",
                                                  "source_ids": ["D1:1"]}},
             {"name": "add_memory", "arguments": {"memory": "Alice said: my puppy is called Rex"}}]
    with ScriptedServer([Reply(tool_calls=calls)]) as srv:
        svc = open_service("memory")
        w = AutoMemoryWorker(svc, LLMExtractor(MODEL, client=client(srv)),
                             reconcile_config=ReconcileConfig(enabled=False))
        r = w.run_job(session("I adopted a puppy named Rex."))
        assert sorted(e.text for e in svc.list(KEY)) == ["Alice adopted a puppy named Rex",
                                                         "Alice said: my puppy is called Rex"]
        assert len(r.dropped) == 1 and "first-person" in r.dropped[0]


def test_extractor_empty_reply_fails_the_job_and_keeps_its_cost():
    with ScriptedServer([Reply(text="", prompt_tokens=900)]) as srv:
        svc = open_service("memory")
        w = AutoMemoryWorker(svc, LLMExtractor(MODEL, client=client(srv)))
        r = w.run_job(session("I adopted a puppy named Rex."))
        assert r.status == "failed" and "EmptyReply" in r.reason and r.usage.prompt_tokens == 900
        assert w.counters.model_calls == 1


def test_litellm_embedder_waits_for_the_chat_clients_slot_on_the_same_server():
    from memlab.index.embedders import LiteLLMEmbedder

    llm.import_litellm()  # imported up front, so only the slot can hold the embedding request back
    with ScriptedServer() as srv:
        chat = client(srv)  # registers the endpoint: one request at a time
        ep = llm.registered_endpoint(srv.api_base)
        assert ep is not None and ep.concurrency == chat.concurrency == 1
        emb = LiteLLMEmbedder(MODEL, api_base=srv.api_base, api_key="x", num_retries=0)
        ep.slots.acquire()  # a chat request in flight
        t = threading.Thread(target=emb.embed, args=(["Alice went to a pottery class"],))
        t.start()
        t.join(0.5)
        assert t.is_alive() and not srv.embed_requests  # queued behind the chat request
        ep.slots.release()
        t.join(30)
        assert not t.is_alive() and len(srv.embed_requests) == 1


# ------------------------------------------------------------------- issue 20: the trust edges
def test_judge_that_says_not_correct_is_a_judge_error_never_cached_and_asked_again(tmp_path):
    """Before: "NOT CORRECT" scored J = 1.0, and an unreadable verdict was cached, so no rerun asked again."""
    cache = tmp_path / "responses.sqlite"
    with ScriptedServer([Reply(text="The generated answer is NOT CORRECT."), Reply(text="Maybe, partly."),
                         Reply(text="WRONG")]) as srv:
        j = ProfileJudge(client(srv, cache_path=cache))
        e = raises_model_error(lambda: j.judge(question(), "Max"), "BadReply")
        assert "negates or hedges" in str(e) and e.partial.calls == 1
        raises_model_error(lambda: j.judge(question(), "Max"), "BadReply")  # asked again: not cached
        assert j.judge(question(), "Max")[:3:2] == (0.0, False) and len(srv.requests) == 3
        assert j.judge(question(), "Max")[:3:2] == (0.0, True) and len(srv.requests) == 3  # a readable one is


def test_a_rejected_verdict_already_in_the_cache_is_dropped_and_asked_again(tmp_path):
    """A cache written before the fix holds garbage verdicts: they are not served, the judge is asked."""
    cache = tmp_path / "responses.sqlite"
    with ScriptedServer([Reply(text="NOT CORRECT"), Reply(text="CORRECT")]) as srv:
        c = client(srv, cache_path=cache)
        msgs = ProfileJudge(c).messages("What is Bob's dog called?", "Rex", 4, "Rex")
        assert c.complete(msgs).text == "NOT CORRECT"  # cached without a check, as the old judge did
        assert ProfileJudge(client(srv, cache_path=cache)).judge(question(), "Rex")[0] == 1.0
        assert len(srv.requests) == 2


def test_the_last_round_of_an_exhausted_tool_loop_is_not_cached(ctx, tmp_path):
    """Before: the last round's tool-call reply was cached, so every rerun failed again without asking."""
    cache = tmp_path / "responses.sqlite"
    search = Reply(tool_calls=[{"name": "memory_search", "arguments": {"query": "dog"}}])
    with ScriptedServer([search, search, Reply(text="Rex")]) as srv:
        raises_model_error(lambda: OptimizedAnswerer(client(srv, cache_path=cache), max_rounds=2).timed(
            question(), ctx), "ToolLoopExhausted")
        a = OptimizedAnswerer(client(srv, cache_path=cache), max_rounds=2).timed(question(), ctx)
        assert a.prediction == "Rex" and a.cached_calls == 1 and len(srv.requests) == 3  # round 2 asked again


def test_response_cache_is_keyed_by_the_endpoint_that_answered(tmp_path):
    """Before: a second server was answered entirely from the first one's cached replies (0 requests)."""
    cache = tmp_path / "responses.sqlite"
    msgs = [{"role": "user", "content": "ping"}]
    with ScriptedServer(default=Reply(text="one")) as a, ScriptedServer(default=Reply(text="two")) as b:
        assert client(a, cache_path=cache).complete(msgs).text == "one"
        assert client(b, cache_path=cache).complete(msgs).text == "two" and len(b.requests) == 1
        assert client("HTTP" + a.api_base[4:] + "/", cache_path=cache).complete(msgs).from_cache
        assert len(a.requests) == 1  # the same endpoint however written: served from the cache
        assert not client(a, cache_path=cache, temperature=0.7).complete(msgs).from_cache  # a parameter differs


def _add(memory: str, sid: str = "D1:1") -> dict:
    return {"name": "add_memory", "arguments": {"memory": memory, "kind": "fact", "source_ids": [sid]}}


def test_extraction_calls_with_unreadable_arguments_are_reasked_with_the_error_shown(tmp_path):
    """Before: a call with invalid JSON arguments was dropped silently (counted nowhere, reply cached)."""
    broken = {"name": "add_memory", "arguments": '{"memory": "Alice likes pottery", "kind": '}
    with ScriptedServer([Reply(tool_calls=[_add("Alice adopted a puppy named Rex"), broken]),
                         Reply(tool_calls=[_add("Alice likes pottery")])]) as srv:
        svc = open_service("memory")
        w = AutoMemoryWorker(svc, LLMExtractor(MODEL, client=client(srv, cache_path=tmp_path / "r.sqlite")),
                             reconcile_config=ReconcileConfig(enabled=False))
        r = w.run_job(session("I adopted a puppy named Rex. I like pottery."))
        assert r.status == "ran" and sorted(e.text for e in svc.list(KEY)) == ["Alice adopted a puppy named Rex",
                                                                               "Alice likes pottery"]
        assert r.malformed_tool_calls == 1 and w.counters.malformed_tool_calls == 1 and w.counters.model_calls == 2
        assert r.to_dict()["malformed_tool_calls"] == 1
        shown = [m for m in srv.requests[1]["messages"] if m["role"] == "tool"]
        assert len(shown) == 2 and "not valid JSON" in shown[1]["content"] and '"ok": true' in shown[0]["content"]


def test_extraction_calls_still_malformed_after_the_reask_fail_the_job_uncached(tmp_path):
    cache = tmp_path / "r.sqlite"
    broken = Reply(tool_calls=[{"name": "add_memory", "arguments": "{not json"}])
    with ScriptedServer([broken, broken, Reply(tool_calls=[_add("Alice likes pottery")])]) as srv:
        svc = open_service("memory")
        w = AutoMemoryWorker(svc, LLMExtractor(MODEL, client=client(srv, cache_path=cache)),
                             reconcile_config=ReconcileConfig(enabled=False))
        r = w.run_job(session("I like pottery."))
        assert r.status == "failed" and "MalformedToolCall" in r.reason and svc.list(KEY) == []
        assert r.malformed_tool_calls == 2 and w.counters.model_calls == 2
        r = w.run_job(session("I like pottery."))  # the rerun: the failed re-ask is asked again, not replayed
        assert r.status == "ran" and [e.text for e in svc.list(KEY)] == ["Alice likes pottery"]
        assert len(srv.requests) == 3


def test_an_echoed_bearer_token_never_reaches_the_error_text():
    secret = "local-secret-token-4242"
    with ScriptedServer(default=Reply(status=400, text="bad request", echo_auth=True)) as srv:
        c = llm.ModelClient(MODEL, api_base=srv.api_base, api_key=secret, timeout=5.0, max_retries=0)
        e = raises_model_error(lambda: c.complete([{"role": "user", "content": "hi"}]), "ModelCallError")
        assert "Authorization" in str(e) and secret not in str(e) and "[redacted]" in str(e)
    assert llm.redact("key sk-proj-AbC123xyz789 and Bearer abc.def") == "key [redacted] and Bearer [redacted]"
    assert llm.redact('{"Authorization": "Bearer tok-123456"}') == '{"Authorization": "Bearer [redacted]"}'
    assert llm.redact("api_key=abcdefgh1234 ok") == "api_key=[redacted] ok"


def test_cached_embeddings_are_keyed_by_the_endpoint_too(tmp_path):
    """Like the response cache: a second embedding server was answered from the first one's cached vectors."""
    from memlab.index.embedders import CachedEmbedder, LiteLLMEmbedder

    with ScriptedServer() as a, ScriptedServer(embed_dim=8) as b:
        for srv in (a, b):
            emb = CachedEmbedder(LiteLLMEmbedder(MODEL, api_base=srv.api_base, api_key="x", num_retries=0),
                                 tmp_path / "emb.sqlite")
            assert emb.embed(["Bob adopted Rex"]).shape == (1, 16 if srv is a else 8)
        assert len(a.embed_requests) == 1 and len(b.embed_requests) == 1
    hosted = LiteLLMEmbedder("text-embedding-3-small")
    assert hosted.embedder_id == "litellm:text-embedding-3-small"  # a provider's own API: the id as before
