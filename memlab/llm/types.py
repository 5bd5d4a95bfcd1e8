"""Value types of a model call: usage, call counters, tool calls, a completion; request hashing and the
endpoint as a cache key sees it."""

from __future__ import annotations

import hashlib
import json
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    estimated: bool = False

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.prompt_tokens + other.prompt_tokens, self.completion_tokens + other.completion_tokens,
                     self.cached_tokens + other.cached_tokens, self.estimated or other.estimated)


@dataclass
class CallStats:
    """What a piece of model work cost so far: kept when a later round fails (``ModelError.partial``)."""

    usage: Usage = field(default_factory=Usage)
    calls: int = 0
    """HTTP requests made (failed attempts and forced re-asks included)."""
    cached_calls: int = 0
    latency_s: float = 0.0
    malformed_tool_calls: int = 0
    truncated: int = 0
    """Replies cut off at ``max_tokens`` (``finish_reason: length``)."""

    def __add__(self, other: CallStats) -> CallStats:
        return CallStats(self.usage + other.usage, self.calls + other.calls, self.cached_calls + other.cached_calls,
                         self.latency_s + other.latency_s, self.malformed_tool_calls + other.malformed_tool_calls,
                         self.truncated + other.truncated)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self.usage), "calls": self.calls, "cached_calls": self.cached_calls,
                "latency_s": self.latency_s, "malformed_tool_calls": self.malformed_tool_calls,
                "truncated": self.truncated}


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str
    """Raw JSON text as the model sent it (parsing, and rejecting bad JSON, is the caller's job)."""


@dataclass
class Completion:
    text: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    latency_s: float = 0.0
    from_cache: bool = False
    request_hash: str = ""
    attempts: int = 1
    calls: int = 1
    """HTTP requests this completion took (retries and a forced tool re-ask included); 0 from the cache."""
    malformed_tool_calls: int = 0
    """Tool calls the model wrote as text (recovered by parsing or by a forced re-ask)."""
    finish_reason: str = ""
    """Why the model stopped (``stop``, ``tool_calls``; ``length``: cut off at ``max_tokens``)."""

    def to_json(self) -> dict[str, Any]:
        return {"text": self.text, "tool_calls": [asdict(t) for t in self.tool_calls], "usage": asdict(self.usage),
                "malformed_tool_calls": self.malformed_tool_calls, "finish_reason": self.finish_reason}

    @classmethod
    def from_json(cls, d: dict[str, Any], request_hash: str) -> Completion:
        return cls(text=d["text"], tool_calls=[ToolCall(**t) for t in d["tool_calls"]], usage=Usage(**d["usage"]),
                   from_cache=True, request_hash=request_hash, calls=0,
                   malformed_tool_calls=int(d.get("malformed_tool_calls", 0)),
                   finish_reason=str(d.get("finish_reason", "")))

    def stats(self) -> CallStats:
        return CallStats(usage=self.usage, calls=self.calls, cached_calls=1 if self.from_cache else 0,
                         latency_s=self.latency_s, malformed_tool_calls=self.malformed_tool_calls)


def request_hash(payload: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode("utf-8")).hexdigest()


def normalise_endpoint(api_base: str | None) -> str | None:
    """The endpoint as a cache key sees it: scheme and host lower-cased, no trailing slash (None: the
    provider's own API, chosen by the model name)."""
    if not api_base:
        return None
    parts = urllib.parse.urlsplit(api_base.strip())
    return urllib.parse.urlunsplit((parts.scheme.lower(), parts.netloc.lower(), parts.path.rstrip("/"),
                                    parts.query, ""))
