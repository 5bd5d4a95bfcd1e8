"""A deterministic scripted 'model' for the runner tests: it reads its prompt like a model would."""

from __future__ import annotations

import json
import re

from memlab.testing import Reply

_MSG = re.compile(r"^\[(D\d+:\d+)\] \((\d{4}-\d{2}-\d{2})\) ([^:]+): (.*)$", re.MULTILINE)
_MEM = re.compile(r"^- (?:\[[^\]]*\] )?(.+)$", re.MULTILINE)


def responder(body: dict) -> Reply:
    msgs = body["messages"]
    system = msgs[0]["content"] if msgs and msgs[0]["role"] == "system" else ""
    tools = {t["function"]["name"] for t in body.get("tools", [])}
    schema = ((body.get("response_format") or {}).get("json_schema") or {}).get("schema") or {}
    if "add_memory" in tools or "operations" in schema.get("properties", {}):  # extraction: a memory per message
        calls = [{"name": "add_memory", "arguments": {"memory": f"{spk} said: {txt}", "kind": "episode",
                                                      "event_time": day, "participants": [spk],
                                                      "source_ids": [mid]}}
                 for mid, day, spk, txt in _MSG.findall(system)]
        if schema:  # the same calls as one JSON object (structured_output: json_schema)
            ops = [{"tool": c["name"], **c["arguments"]} for c in calls]
            return Reply(text=json.dumps({"operations": ops}), prompt_tokens=len(system) // 4,
                         completion_tokens=20 * len(calls))
        return Reply(tool_calls=calls, prompt_tokens=len(system) // 4, completion_tokens=20 * len(calls))
    if "label" in schema.get("properties", {}):  # a judge held to the verdict schema
        return Reply(text='{"label": "CORRECT"}', prompt_tokens=len(json.dumps(msgs)) // 4, completion_tokens=6)
    if "memory_search" in tools:
        done = any(m["role"] == "tool" for m in msgs)
        if not done and body.get("tool_choice") != "none":
            q = msgs[-1]["content"]
            return Reply(tool_calls=[{"name": "memory_search", "arguments": {"query": q, "top_k": 3}},
                                     {"name": "memory_search", "arguments": {"query": ""}}],
                         prompt_tokens=300, completion_tokens=15, cached_tokens=100)
        results = [json.loads(m["content"]).get("results", []) for m in msgs if m["role"] == "tool"]
        first = next((r[0]["text"] for r in results if r), "Not mentioned in the conversation.")
        return Reply(text=first[:60], prompt_tokens=500, completion_tokens=8, cached_tokens=300)
    mems = _MEM.findall(system)
    if mems:
        return Reply(text=mems[0][:60], prompt_tokens=len(system) // 4, completion_tokens=6)
    return Reply(text="Not mentioned in the conversation.", prompt_tokens=len(system) // 4, completion_tokens=6)
