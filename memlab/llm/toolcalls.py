"""Tool calls a model wrote as text instead of structured calls, parsed back."""

from __future__ import annotations

import json
import re

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
