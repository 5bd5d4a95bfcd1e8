"""Tool calls a model wrote as text instead of structured calls, parsed back; and tool calls as one JSON object
under a schema, for endpoints that constrain replies to a JSON schema instead of offering tool calls."""

from __future__ import annotations

import json
import re
from typing import Any

from memlab.llm.types import ToolCall

# ------------------------------------------------------------------------ tool calls written as text
_FUNCTIONS_PREFIX = re.compile(r"^\s*(?:functions\.|<\|?tool_call\|?>\s*)?([A-Za-z_][\w-]*)\s*[:(]?\s*(.*)$", re.S)
_TOOL_CALL_TAG = re.compile(r"<tool_call>\s*(\{.*?\})\s*(?:</tool_call>|$)", re.S)


def tool_call_text(text: str, tool_names: list[str] | tuple[str, ...]) -> tuple[str | None, list[ToolCall] | None]:
    """Recognise a tool call the model wrote as plain text instead of a ``tool_calls`` entry.

    Returns ``(name, calls)``: ``(None, None)`` when the text is not a tool call; ``(name, calls)``
    when it parses unambiguously (``functions.memory_search: {"query": ...}``, a Hermes
    ``<tool_call>{...}</tool_call>`` block, or a bare ``{"name": ..., "arguments": {...}}`` object);
    ``(name, None)`` when it names a tool but its arguments are missing or unreadable (malformed).
    """
    s = (text or "").strip()
    if not s or not tool_names:
        return None, None
    names = set(tool_names)
    blobs = _TOOL_CALL_TAG.findall(s) or ([s] if s.startswith("{") else [])
    if blobs:
        calls = []
        for i, b in enumerate(blobs):
            try:
                obj = json.loads(b)
            except json.JSONDecodeError:
                obj = None
            if not isinstance(obj, dict) or obj.get("name") not in names:
                return (None, None) if not _TOOL_CALL_TAG.search(s) else (_first_name(s, names), None)
            args = obj.get("arguments", obj.get("parameters", {}))
            if not isinstance(args, (dict, str)):
                return str(obj["name"]), None
            calls.append(ToolCall(id=f"text_call_{i}", name=str(obj["name"]),
                                  arguments=args if isinstance(args, str) else json.dumps(args)))
        return calls[0].name, calls
    m = _FUNCTIONS_PREFIX.match(s)
    if not m or m.group(1) not in names:
        return None, None
    if not s.startswith("functions.") and not re.match(rf"^{re.escape(m.group(1))}\s*[:(]", s):
        return None, None  # a plain answer that happens to start with a tool's name
    name, rest = m.group(1), m.group(2).strip().rstrip(")").strip()
    if not rest:
        return name, None
    try:
        args = json.loads(rest)
    except json.JSONDecodeError:
        return name, None
    if not isinstance(args, dict):
        return name, None
    return name, [ToolCall(id="text_call_0", name=name, arguments=json.dumps(args))]


def _first_name(s: str, names: set[str]) -> str | None:
    hits = [n for n in names if n in s]
    return hits[0] if len(hits) == 1 else None


def tools_as_schema(tools: list[dict[str, Any]], key: str, extra: list[dict[str, Any]] = ()) -> dict[str, Any]:
    """One JSON object per call of ``tools`` (and the ``extra`` variants): each tool's own argument schema with
    ``key`` naming the tool, required as the tool requires. For endpoints that constrain a reply to a JSON
    schema instead of offering tool calls (``structured_output: json_schema``); `calls_from_json` reads it back."""
    variants = []
    for t in tools:
        fn = t["function"]
        params = fn.get("parameters") or {}
        variants.append({"type": "object",
                         "properties": {key: {"type": "string", "const": fn["name"]}, **params.get("properties", {})},
                         "required": [key, *params.get("required", [])]})
    return {"anyOf": [*variants, *extra]} if len(variants) + len(extra) > 1 else (variants or list(extra))[0]


def calls_from_json(text: str, key: str, field: str | None = None) -> list[ToolCall]:
    """The calls of a reply written to `tools_as_schema` (under ``field`` when the reply wraps a list), as
    `ToolCall`s the tool-call path parses; raises ValueError naming what is not there."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"the reply is not JSON ({e.msg} at char {e.pos}): {text[:120]!r}") from None
    items = obj.get(field) if field is not None and isinstance(obj, dict) else [obj]
    if not isinstance(items, list):
        raise ValueError(f"the reply has no {field!r} list: {text[:120]!r}")
    calls = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get(key), str):
            raise ValueError(f"item {i} of the reply names no {key!r}: {json.dumps(item)[:120]}")
        args = {k: v for k, v in item.items() if k != key}
        calls.append(ToolCall(id=f"json_{i}", name=item[key], arguments=json.dumps(args)))
    return calls


def explicit_content(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every assistant message carries a ``content`` string: some servers' chat templates (llama.cpp)
    fail with HTTP 500 on a tool-call message whose ``content`` is missing or null."""
    out = []
    for m in messages:
        if m.get("role") == "assistant" and m.get("content") is None:
            m = {**m, "content": ""}
        out.append(m)
    return out
