"""Scripted 'models' for `memlab.testing.ScriptedServer`: functions of the request body that read their prompt as a
model would, deterministically, so a dry run or a test exercises every role without a real model.

- `scripted_model`: extraction (tool calls or the JSON schema): one memory per message of the session shown; a
  judge held to the verdict schema: CORRECT; a memory-tool loop: one search, then the first result; a reader:
  the first memory line of its prompt (else "Not mentioned in the conversation.");
- `dry_run_model`: the same, and a free-text judge prompt ("You grade answers ...") answered CORRECT;
- `echo`: the last user message, as it came; `fixed(text)`: always ``text``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from memlab.testing import Reply

_MSG = re.compile(r"^\[(D\d+:\d+)\] \((\d{4}-\d{2}-\d{2})\) ([^:]+): (.*)$", re.MULTILINE)
_MEM = re.compile(r"^- (?:\[[^\]]*\] )?(.+)$", re.MULTILINE)


def scripted_model(body: dict[str, Any]) -> Reply:
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


def dry_run_model(body: dict[str, Any]) -> Reply:
    content = str((body.get("messages") or [{}])[0].get("content") or "")
    if content.startswith("You grade answers"):  # a judge without the verdict schema
        return Reply(text="CORRECT", prompt_tokens=len(content) // 4, completion_tokens=2)
    return scripted_model(body)


def echo(body: dict[str, Any]) -> Reply:
    users = [m for m in body.get("messages", []) if m.get("role") == "user"]
    text = users[-1].get("content") if users else ""
    text = text if isinstance(text, str) else json.dumps(text)
    return Reply(text=text or "(empty)", prompt_tokens=max(1, len(json.dumps(body.get("messages", []))) // 4),
                 completion_tokens=max(1, len(text) // 4))


def fixed(text: str) -> Callable[[dict[str, Any]], Reply]:
    def reply(body: dict[str, Any]) -> Reply:
        return Reply(text=text, prompt_tokens=max(1, len(json.dumps(body.get("messages", []))) // 4),
                     completion_tokens=max(1, len(text) // 4))

    return reply


MODES: dict[str, Callable[[dict[str, Any]], Reply]] = {"model": dry_run_model, "echo": echo}
"""What `python -m memlab.testing serve --mode` names (``fixed`` takes ``--reply``)."""


def load_script(path: str) -> list[Reply]:
    """A script file: a JSON or YAML list of replies, each a mapping of `Reply` fields (``text``, ``tool_calls``,
    ``status``, ``retry_after``, ``delay``, ``prompt_tokens`` ...), sent in order."""
    import dataclasses
    from pathlib import Path

    import yaml

    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{p}: no such script file")
    try:
        steps = json.loads(p.read_text(encoding="utf-8")) if p.suffix.lower() == ".json" else \
            yaml.safe_load(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise ValueError(f"{p}: not valid {'JSON' if p.suffix.lower() == '.json' else 'YAML'} ({e})") from e
    if not isinstance(steps, list):
        raise ValueError(f"{p}: expected a list of replies, got {type(steps).__name__}")
    names = {f.name for f in dataclasses.fields(Reply)}
    out = []
    for i, step in enumerate(steps):
        if isinstance(step, str):  # a bare string: that text
            step = {"text": step}
        if not isinstance(step, dict):
            raise ValueError(f"{p}: reply {i}: expected a mapping of reply fields or a string, got {step!r}")
        unknown = sorted(set(step) - names)
        if unknown:
            raise ValueError(f"{p}: reply {i}: unknown field(s) {unknown}; expected some of {sorted(names)}")
        try:
            out.append(Reply(**step))
        except TypeError as e:
            raise ValueError(f"{p}: reply {i}: {e}") from e
    return out
