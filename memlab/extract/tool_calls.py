"""The model extractor's side of the conversation: the four memory tools it is offered, parsing its tool calls
into typed ops (a malformed one raises with the reason), and rendering the delta and the old memories into its
prompt. `memlab.extract.extractors.LLMExtractor` makes the call; these rules have no state.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from memlab.extract.messages import Message
from memlab.extract.ops import MemoryOp
from memlab.llm import ToolCall, tools_as_schema
from memlab.memory.entry import KINDS, MemoryEntry

#: The memory tools' arguments. The length bounds are part of the declaration: an endpoint that holds replies to
#: the schema (``structured_output: json_schema``) then cannot loop inside one string until ``max_tokens``.
_MEMORY_FIELDS: dict[str, Any] = {
    "memory": {"type": "string", "maxLength": 300, "description": "The memory: one self-contained sentence."},
    "kind": {"type": "string", "enum": list(KINDS), "description": "fact (stable) or episode (happened at a time)."},
    "topics": {"type": "array", "maxItems": 3, "items": {"type": "string", "maxLength": 40},
               "description": "1-3 short topic keywords."},
    "event_time": {"type": "string", "maxLength": 20,
                   "description": "Absolute date of the event: YYYY-MM-DD, YYYY-MM or YYYY."},
    "participants": {"type": "array", "maxItems": 5, "items": {"type": "string", "maxLength": 40},
                     "description": "People involved."},
    "location": {"type": "string", "maxLength": 80, "description": "Where it happened, if stated."},
    "source_ids": {"type": "array", "maxItems": 10, "items": {"type": "string", "maxLength": 16},
                   "description": "Ids of the source messages."},
}


def extraction_tools() -> list[dict[str, Any]]:
    """The four tools in OpenAI function-calling form (JSON-schema arguments)."""
    mid = {"memory_id": {"type": "string", "maxLength": 64, "description": "Id of an existing memory."}}
    return [
        {"type": "function", "function": {"name": "add_memory", "description": "Store a new memory.",
                                          "parameters": {"type": "object", "properties": dict(_MEMORY_FIELDS),
                                                         "required": ["memory"]}}},
        {"type": "function", "function": {"name": "update_memory", "description": "Rewrite an existing memory.",
                                          "parameters": {"type": "object", "properties": {**mid, **_MEMORY_FIELDS},
                                                         "required": ["memory_id", "memory"]}}},
        {"type": "function", "function": {"name": "delete_memory", "description": "Delete a memory now false.",
                                          "parameters": {"type": "object", "properties": mid,
                                                         "required": ["memory_id"]}}},
        {"type": "function", "function": {"name": "clear_memories",
                                          "description": "Forget everything (only on an explicit request).",
                                          "parameters": {"type": "object", "properties": {}}}},
    ]


#: At most this many operations in one JSON extraction reply: a small model that repeats itself stops here
#: (its reply then ends by itself) instead of at max_tokens.
MAX_JSON_OPS = 20


def extraction_schema() -> dict[str, Any]:
    """The extraction reply as one JSON object: ``{"operations": [<one of the four tools' calls>, ...]}``."""
    return {"type": "object", "required": ["operations"], "properties": {"operations": {
        "type": "array", "maxItems": MAX_JSON_OPS, "items": tools_as_schema(extraction_tools(), "tool")}}}


_DATE_FORMATS = ("%Y-%m-%d", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M", "%Y-%m", "%Y",
                 "%d %B %Y", "%d %B, %Y", "%B %d, %Y")


def parse_event_time(value: Any) -> datetime | None:
    """An absolute date from the model; raises ValueError naming the value when it is not one."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ValueError(f"event_time: expected an absolute date string, got {value!r}")
    v = value.strip()
    for fmt in _DATE_FORMATS:
        try:
            return datetime.strptime(v, fmt)
        except ValueError:
            continue
    raise ValueError(f"event_time: {value!r} is not an absolute date (expected YYYY-MM-DD, YYYY-MM or YYYY)")


def _str_list(args: dict[str, Any], name: str) -> tuple[str, ...]:
    v = args.get(name) or []
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise ValueError(f"{name}: expected a list of strings, got {v!r}")
    return tuple(x for x in v if x.strip())


class UnreadableArguments(ValueError):
    """A tool call whose arguments are not a JSON object: the call itself is malformed (re-asked once)."""


def tool_arguments(name: str, raw_args: str) -> dict[str, Any]:
    """A tool call's arguments as a dict; raises `UnreadableArguments` naming the tool and the JSON error."""
    try:
        args = json.loads(raw_args) if raw_args.strip() else {}
    except json.JSONDecodeError as e:
        raise UnreadableArguments(f"{name}: arguments are not valid JSON ({e.msg} at char {e.pos})") from None
    if not isinstance(args, dict):
        raise UnreadableArguments(f"{name}: arguments must be a JSON object, got {type(args).__name__}")
    return args


def unreadable(calls: Sequence[ToolCall]) -> dict[int, str]:
    """Position in ``calls`` -> why that call's arguments cannot be read, for each malformed call of a reply."""
    out = {}
    for i, tc in enumerate(calls):
        try:
            tool_arguments(tc.name, tc.arguments)
        except UnreadableArguments as e:
            out[i] = str(e)
    return out


def parse_tool_call(name: str, raw_args: str, delta_ids: Sequence[str]) -> MemoryOp:
    """One tool call -> one op; raises ValueError with the reason when it is malformed
    (`UnreadableArguments` when its arguments are not a JSON object)."""
    args = tool_arguments(name, raw_args)
    if name == "clear_memories":
        return MemoryOp(action="clear", source_ids=tuple(delta_ids))
    if name == "delete_memory":
        mid = args.get("memory_id")
        if not isinstance(mid, str) or not mid.strip():
            raise ValueError("delete_memory: missing memory_id")
        return MemoryOp(action="delete", memory_id=mid.strip(), source_ids=tuple(delta_ids))
    if name not in ("add_memory", "update_memory"):
        raise ValueError(f"unknown tool {name!r}")
    text = args.get("memory")
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{name}: missing memory text")
    kind = args.get("kind") or "fact"
    if kind not in KINDS:
        raise ValueError(f"{name}: kind must be one of {KINDS}, got {kind!r}")
    mid = None
    if name == "update_memory":
        mid = args.get("memory_id")
        if not isinstance(mid, str) or not mid.strip():
            raise ValueError("update_memory: missing memory_id")
        mid = mid.strip()
    cited = [s for s in _str_list(args, "source_ids") if s in set(delta_ids)]
    loc = args.get("location")
    return MemoryOp(
        action="add" if name == "add_memory" else "update", text=text.strip(), kind=kind,
        topics=_str_list(args, "topics"), event_time=parse_event_time(args.get("event_time")),
        participants=_str_list(args, "participants"),
        location=loc.strip() if isinstance(loc, str) and loc.strip() else None,
        memory_id=mid, source_ids=tuple(cited) if cited else tuple(delta_ids),
    )


_FIRST_PERSON = re.compile(r"(?<![\w'])(I|I'm|I've|I'd|I'll|[Mm]y|[Mm]e|[Mm]yself|[Mm]ine)(?![\w'])")


def first_person(text: str, names: Sequence[str] = ()) -> str | None:
    """The first-person word of a memory written as the speaker ("I went to ..."), else None.

    Flagged when the memory starts with it, or uses it (outside quotes) without naming any of
    ``names``: "I" in a store shared by two speakers says nothing about who. "Caroline said: I ..."
    names its person and passes.
    """
    unquoted = re.sub(r'"[^"]*"|“[^”]*”', " ", text)
    m = _FIRST_PERSON.search(unquoted)
    if m is None:
        return None
    if not unquoted[:m.start()].strip() or not any(n and n.lower() in text.lower() for n in names):
        return m.group(1)
    return None


def speakers_of(delta: Sequence[Message]) -> list[str]:
    return list(dict.fromkeys(m.speaker or m.role for m in delta))


def render_messages(delta: Sequence[Message]) -> str:
    return "\n".join(f"[{m.id or i}] ({m.timestamp:%Y-%m-%d}) {m.speaker or m.role}: {m.text}"
                     for i, m in enumerate(delta))


def render_old_memories(memories: Sequence[MemoryEntry]) -> str:
    """The old memories as the extractor sees them: with ids, so it can update or delete one."""
    if not memories:
        return "(none yet)"
    out = []
    for e in memories:
        when = f" ({e.event_time:%Y-%m-%d})" if e.event_time else ""
        out.append(f"- [{e.id}] ({e.kind}){when} {e.text}")
    return "\n".join(out)
