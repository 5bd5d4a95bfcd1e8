"""The one door to models: every call (extract, answer, judge) goes through `ModelClient` and litellm.

- litellm is imported lazily (7-8 s) and never allowed to fetch remote config at import;
- retries with exponential backoff on rate limits, server errors, timeouts and unparsable replies,
  a bounded number of times, then the error is raised to the caller;
- an optional on-disk response cache keyed by the full request (model, messages, tools, params):
  a rerun makes zero model calls, and the client counts calls made vs served from cache;
- token usage from the provider's ``usage`` (cached prompt tokens included); where a provider
  gives none, counted with litellm's token counter and marked ``estimated``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

_OFFLINE_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # bundled model-cost map instead of a remote fetch at import
    "LITELLM_OFFLINE_MODE": "true",
}


def import_litellm() -> Any:
    for k, v in _OFFLINE_ENV.items():
        os.environ.setdefault(k, v)
    import litellm

    litellm.telemetry = False
    litellm.suppress_debug_info = True
    return litellm


def _tiktoken_offline() -> None:
    """Point tiktoken at litellm's bundled encodings (plain tiktoken would try to download them)."""
    import importlib.util

    if "TIKTOKEN_CACHE_DIR" in os.environ:
        return
    spec = importlib.util.find_spec("litellm")
    if spec and spec.submodule_search_locations:
        d = os.path.join(list(spec.submodule_search_locations)[0], "litellm_core_utils", "tokenizers")
        if os.path.isdir(d):
            os.environ["TIKTOKEN_CACHE_DIR"] = d


_ENCODER: Any = None


def count_tokens(text: str) -> int:
    """o200k tokens of a text, offline and without importing litellm (a model-free cost measure)."""
    global _ENCODER
    if _ENCODER is None:
        _tiktoken_offline()
        import tiktoken

        _ENCODER = tiktoken.get_encoding("o200k_base")
    return len(_ENCODER.encode(text, disallowed_special=()))


class ModelCallError(RuntimeError):
    """A model call failed after its retries (the message says which model and why)."""


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

    def to_json(self) -> dict[str, Any]:
        return {"text": self.text, "tool_calls": [asdict(t) for t in self.tool_calls], "usage": asdict(self.usage)}

    @classmethod
    def from_json(cls, d: dict[str, Any], request_hash: str) -> Completion:
        return cls(text=d["text"], tool_calls=[ToolCall(**t) for t in d["tool_calls"]], usage=Usage(**d["usage"]),
                   from_cache=True, request_hash=request_hash)


def request_hash(payload: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode("utf-8")).hexdigest()


class ResponseCache:
    """SQLite table of request hash -> completion JSON (thread-safe, WAL)."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = str(path)
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(self.path, check_same_thread=False)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("CREATE TABLE IF NOT EXISTS responses (h TEXT PRIMARY KEY, model TEXT, body TEXT)")
        self._lock = threading.Lock()

    def get(self, h: str) -> dict[str, Any] | None:
        with self._lock:
            r = self._conn.execute("SELECT body FROM responses WHERE h=?", (h,)).fetchone()
        return None if r is None else json.loads(r[0])

    def put(self, h: str, model: str, body: dict[str, Any]) -> None:
        with self._lock, self._conn:
            self._conn.execute("INSERT OR REPLACE INTO responses VALUES (?,?,?)", (h, model, json.dumps(body)))


_NO_RETRY = ("AuthenticationError", "BadRequestError", "NotFoundError", "PermissionDeniedError",
             "ContextWindowExceededError", "ContentPolicyViolationError", "UnsupportedParamsError")


class ModelClient:
    """A model by litellm name (``gpt-4o-mini``, ``openai/<name>`` + ``api_base`` for local servers)."""

    def __init__(
        self,
        model: str,
        api_base: str | None = None,
        api_key: str | None = None,
        timeout: float = 30.0,
        max_retries: int = 3,
        backoff: float = 0.5,
        temperature: float | None = 0.0,
        cache_path: str | os.PathLike[str] | None = None,
    ):
        self.model = model
        self.api_base = api_base
        self.api_key = api_key
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.temperature = temperature
        self.cache_path = None if cache_path is None else str(cache_path)
        self._cache: ResponseCache | None = None
        self._lock = threading.Lock()
        self.calls = 0
        self.cache_hits = 0
        self.failures = 0

    @property
    def cache(self) -> ResponseCache | None:
        if self.cache_path and self._cache is None:
            self._cache = ResponseCache(self.cache_path)
        return self._cache

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                 tool_choice: str | dict[str, Any] | None = None, cache_tag: str | None = None,
                 **params: Any) -> Completion:
        """One completion; ``cache_tag`` is part of the response-cache key only (not sent), so repeated
        samples of one request (judge repeats) are cached apart."""
        payload: dict[str, Any] = {"model": self.model, "messages": messages}
        if tools:
            payload["tools"] = tools
            if tool_choice is not None:
                payload["tool_choice"] = tool_choice
        if self.temperature is not None:
            payload.setdefault("temperature", self.temperature)
        payload.update(params)
        h = request_hash(payload if cache_tag is None else {**payload, "_memlab_cache_tag": cache_tag})
        cache = self.cache
        if cache is not None:
            hit = cache.get(h)
            if hit is not None:
                with self._lock:
                    self.cache_hits += 1
                return Completion.from_json(hit, h)
        comp = self._call(payload, messages)
        comp.request_hash = h
        if cache is not None:
            cache.put(h, self.model, comp.to_json())
        return comp

    def _call(self, payload: dict[str, Any], messages: list[dict[str, Any]]) -> Completion:
        litellm = import_litellm()
        kw = dict(payload, timeout=self.timeout, num_retries=0)
        if self.api_base:
            kw["api_base"] = self.api_base
        if self.api_key:
            kw["api_key"] = self.api_key
        last: Exception | None = None
        for attempt in range(1, self.max_retries + 2):
            t0 = time.perf_counter()
            try:
                with self._lock:
                    self.calls += 1
                resp = litellm.completion(**kw)
                comp = self._parse(resp, messages)
                comp.latency_s = time.perf_counter() - t0
                comp.attempts = attempt
                return comp
            except Exception as e:  # litellm maps provider errors to its own exception classes
                last = e
                if type(e).__name__ in _NO_RETRY or attempt > self.max_retries:
                    break
                time.sleep(self.backoff * (2 ** (attempt - 1)))
        with self._lock:
            self.failures += 1
        raise ModelCallError(f"{self.model}: call failed after {attempt} attempt(s): "
                             f"{type(last).__name__}: {str(last)[:300]}") from last

    def _parse(self, resp: Any, messages: list[dict[str, Any]]) -> Completion:
        choice = resp.choices[0]
        msg = choice.message
        calls = []
        for i, tc in enumerate(getattr(msg, "tool_calls", None) or []):
            fn = tc.function
            args = fn.arguments if isinstance(fn.arguments, str) else json.dumps(fn.arguments)
            calls.append(ToolCall(id=getattr(tc, "id", None) or f"call_{i}", name=fn.name or "", arguments=args))
        text = msg.content or ""
        u = getattr(resp, "usage", None)
        if u is not None and getattr(u, "prompt_tokens", None):
            details = getattr(u, "prompt_tokens_details", None)
            cached = getattr(details, "cached_tokens", None) if details is not None else None
            usage = Usage(int(u.prompt_tokens), int(u.completion_tokens or 0), int(cached or 0), False)
        else:
            usage = self.estimate_usage(messages, text)
        return Completion(text=text, tool_calls=calls, usage=usage)

    def estimate_usage(self, messages: list[dict[str, Any]], text: str) -> Usage:
        litellm = import_litellm()
        try:
            p = litellm.token_counter(model=self.model, messages=messages)
            c = litellm.token_counter(model=self.model, text=text) if text else 0
        except Exception:
            p = litellm.token_counter(model="gpt-4o-mini", messages=messages)
            c = litellm.token_counter(model="gpt-4o-mini", text=text) if text else 0
        return Usage(int(p), int(c), 0, True)
