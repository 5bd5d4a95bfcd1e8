"""What the real llama.cpp server does, next to the scripted server imitating it, scenario by scenario.

Starts llama.cpp's server with the packaged SmolLM2-135M-Instruct (`memlab.llm.serve.LocalServer`, one slot) and
`memlab.testing.ScriptedServer.imitating("llama-server")` with the same context window, sends each scenario's
requests to both over real HTTP, and prints one row per scenario: what each server answered, and what memlab
made of it (the `ModelClient` result or error class). A scenario where the two differ says so; the imitation's
quirks (`memlab.testing.QUIRKS["llama-server"]`) were set from this table.

    python benchmarks/real_vs_scripted.py            # prints a markdown table (about a minute on 2 cores)
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_OFFLINE_MODE", "true")

CTX = 1024


def post(base: str, path: str, body: dict[str, Any], timeout: float = 120) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(base + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 (127.0.0.1)
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def get(base: str, path: str) -> dict[str, Any]:
    with urllib.request.urlopen(base + path, timeout=10) as r:  # noqa: S310 (127.0.0.1)
        return json.loads(r.read())


def chat(base: str, content: str, **kw: Any) -> tuple[int, dict[str, Any]]:
    return post(base, "/chat/completions", {"model": kw.pop("model", "local"),
                                            "messages": [{"role": "user", "content": content}], **kw})


def memlab_says(base: str, content: str, **kw: Any) -> str:
    """What memlab's client makes of the request: the reply's finish, or its error class."""
    from memlab.llm import ModelClient, ModelError

    c = ModelClient(kw.pop("model", "openai/local"), api_base=base, api_key="x", timeout=kw.pop("timeout", 60),
                    max_retries=0, max_tokens=kw.pop("max_tokens", None))
    try:
        comp = c.complete([{"role": "user", "content": content}], **kw)
    except ModelError as e:
        return type(e).__name__
    return f"answer ({comp.finish_reason}, {comp.usage.completion_tokens} tokens)"


def s_models(base: str) -> str:
    d = get(base, "/models")
    entry = d["data"][0]
    return f"ids {[x['id'] for x in d['data']]}, n_ctx {entry.get('meta', {}).get('n_ctx')}"


def s_unknown_model(base: str) -> str:
    st, r = chat(base, "Say hi.", model="no-such-model", max_tokens=8)
    says = memlab_says(base, "Say hi.", model="openai/nope", max_tokens=64)
    return f"HTTP {st}, answered as {r.get('model')!r}; memlab: {says}"


def s_overflow(base: str) -> str:
    text = "hello " * (CTX * 2)
    st, r = chat(base, text, max_tokens=8)
    err = r.get("error", {})
    return f"HTTP {st} {err.get('type')}; memlab: {memlab_says(base, text, max_tokens=8)}"


def s_max_tokens(base: str) -> str:
    st, r = chat(base, "Write a long story about a dragon.", max_tokens=12)
    return (f"HTTP {st}, finish_reason {r['choices'][0]['finish_reason']}, completion_tokens "
            f"{r['usage']['completion_tokens']}; memlab: "
            f"{memlab_says(base, 'Write a long story about a dragon.', max_tokens=12)}")


def s_cached(base: str) -> str:
    text = "Remember this list: " + ", ".join(f"item {i}" for i in range(60)) + ". Which item comes first?"
    chat(base, text, max_tokens=4)
    st, r = chat(base, text, max_tokens=4)
    details = r["usage"].get("prompt_tokens_details") or {}
    return (f"second identical prompt: prompt_tokens {r['usage']['prompt_tokens']}, cached "
            f"{details.get('cached_tokens')}")


def s_concurrency(base: str) -> str:
    """Two requests at once on a one-slot server: does the second wait for the first?"""
    took: list[float] = []

    def one() -> None:
        t0 = time.monotonic()
        chat(base, "Write a long story about a dragon.", max_tokens=80, extra_body={"ignore_eos": True})
        took.append(time.monotonic() - t0)

    t0 = time.monotonic()
    one()
    alone = time.monotonic() - t0
    ts = [threading.Thread(target=one) for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    fast, slow = sorted(took[1:])
    # queued: the later reply takes its own time after the first's (about twice the first); side by side: about
    # the same (the first request alone is shown, but a loaded machine makes it a poor yardstick)
    return (f"both HTTP 200; alone {alone:.2f} s, together {fast:.2f} s and {slow:.2f} s "
            f"({'the second waits for the first' if slow > 1.6 * fast else 'computed side by side'})")


def s_timeout(base: str) -> str:
    from memlab.llm import ModelClient, ModelError

    c = ModelClient("openai/local", api_base=base, api_key="x", timeout=1.0, max_retries=0, max_tokens=900,
                    busy_wait=20)
    t0 = time.monotonic()
    try:
        c.complete([{"role": "user", "content": "Write a very long story."}], extra_body={"ignore_eos": True})
        out = "finished"
    except ModelError as e:
        out = type(e).__name__
    waited = time.monotonic() - t0
    t1 = time.monotonic()
    chat(base, "Say hi.", max_tokens=4)
    return f"memlab: {out} after {waited:.1f} s; the next request answered in {time.monotonic() - t1:.2f} s"


def s_embeddings(base: str) -> str:
    st, r = post(base, "/embeddings", {"model": "local", "input": ["hello"]})
    return f"HTTP {st} {r.get('error', {}).get('type') if st != 200 else 'vectors'}"


def s_tools(base: str) -> str:
    tools = [{"type": "function", "function": {"name": "memory_search", "parameters": {
        "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}]
    st, r = chat(base, "Search your memory for Caroline's trip.", tools=tools, tool_choice="auto", max_tokens=60)
    msg = r["choices"][0]["message"]
    return f"HTTP {st}, {'a tool call' if msg.get('tool_calls') else 'prose, no tool call'}"


def s_json_schema(base: str) -> str:
    schema = {"type": "object", "properties": {"label": {"type": "string", "enum": ["CORRECT", "WRONG"]}},
              "required": ["label"]}
    st, r = chat(base, "Is Paris the capital of France? Reply CORRECT or WRONG.", max_tokens=40,
                 response_format={"type": "json_schema", "json_schema": {"name": "v", "schema": schema}})
    text = r["choices"][0]["message"]["content"]
    try:
        ok = json.loads(text).get("label") in ("CORRECT", "WRONG")
    except (json.JSONDecodeError, AttributeError):
        ok = False
    return f"HTTP {st}, {'valid JSON under the schema' if ok else 'not the schema: ' + text[:40]!r}"


SCENARIOS: list[tuple[str, Callable[[str], str]]] = [
    ("/v1/models", s_models), ("unknown model name", s_unknown_model), ("prompt over the context window", s_overflow),
    ("reply over max_tokens", s_max_tokens), ("usage and cached prompt tokens", s_cached),
    ("two requests on one slot", s_concurrency), ("generation past the client's timeout", s_timeout),
    ("embeddings (not enabled)", s_embeddings), ("tool call, model without a tool template", s_tools),
    ("response_format json_schema", s_json_schema),
]


def scripted_responder(body: dict[str, Any]) -> Any:
    """The imitation's model: a long reply (800 tokens) unless the request is a verdict schema."""
    from memlab.testing import Reply

    fmt = body.get("response_format") or {}
    if fmt.get("type") == "json_schema":
        return Reply(text='{"label": "CORRECT"}', prompt_tokens=30, completion_tokens=8)
    if body.get("tools"):
        return Reply(text="I will search my memory for that.", prompt_tokens=40, completion_tokens=12)
    prompt = len(json.dumps(body["messages"])) // 4
    if not body.get("ignore_eos") and "long story" not in json.dumps(body["messages"]):  # a reply ending by itself
        return Reply(text="Once upon a time there was a dragon.", prompt_tokens=prompt, completion_tokens=10,
                     delay=0.05)
    return Reply(text="Once upon a time " * 200, prompt_tokens=prompt, completion_tokens=800,
                 delay=3.0 if body.get("max_tokens", 0) > 100 else 0.4)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.parse_args()
    from memlab.llm import import_litellm
    from memlab.llm.serve import LocalServer
    from memlab.testing import ScriptedServer

    import_litellm()
    rows = []
    with LocalServer(ctx=CTX, threads=2) as real, ScriptedServer.imitating(
            "llama-server", responder=scripted_responder, n_ctx=CTX,
            models=[{"id": "local", "object": "model", "meta": {"n_ctx": CTX}}]) as fake:
        for name, fn in SCENARIOS:
            got = []
            for base in (real.api_base, fake.api_base):
                try:
                    got.append(fn(base))
                except Exception as e:  # noqa: BLE001 - the table shows what happened
                    got.append(f"{type(e).__name__}: {str(e)[:80]}")
            rows.append((name, *got))
    print("| scenario | llama.cpp server (SmolLM2-135M) | scripted server imitating llama-server |")
    print("|---|---|---|")
    for name, a, b in rows:
        print(f"| {name} | {a} | {b} |")


if __name__ == "__main__":
    main()
