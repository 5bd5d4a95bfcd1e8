"""The one door to models: every call (extract, answer, judge, embed) goes through `ModelClient` and litellm.

- litellm is imported lazily (7-8 s) and never allowed to fetch remote config at import;
- retries with exponential backoff on rate limits, server errors, timeouts and unparsable replies,
  a bounded number of times, then the error is raised to the caller;
- an optional on-disk response cache keyed by what answers (the normalised endpoint) and the full
  request (model, messages with the rendered prompt, tools, params): a rerun makes zero model calls,
  and the client counts calls made vs served from cache; a reply its caller rejects (``check``) is
  never cached;
- error texts are redacted (`redact`): the keys clients send and ``sk-...``-like tokens never reach
  a stored error;
- token usage from the provider's ``usage`` (cached prompt tokens included); where a provider
  gives none, counted with litellm's token counter and marked ``estimated``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import sqlite3
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from memlab.breaker import CircuitOpen, breaker

log = logging.getLogger(__name__)

_OFFLINE_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # bundled model-cost map instead of a remote fetch at import
    "LITELLM_OFFLINE_MODE": "true",
}


_IMPORT_LOCK = threading.Lock()


def import_litellm() -> Any:
    for k, v in _OFFLINE_ENV.items():
        os.environ.setdefault(k, v)
    with _IMPORT_LOCK:  # threads importing it at once (first calls of a parallel run) were slow
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


#: API keys the model clients of this process send: redacted from every error text (`redact`).
_SECRETS: set[str] = set()
_SECRETS_LOCK = threading.Lock()
_SECRET_PATTERNS = (
    re.compile(r"(?i)(bearer\s+)[^\s'\",;}()\[\]]+"),  # an echoed Authorization header, whatever the token
    re.compile(r"\bsk-[A-Za-z0-9_\-]{6,}"),  # OpenAI-style keys (sk-..., sk-proj-...)
    re.compile(r"(?i)((?:api[_-]?key|authorization|x-api-key)[\"']?\s*[:=]\s*[\"']?(?:bearer\s+)?)"  # key: value
               r"(?!bearer\s)[^\s'\",;}()\[\]]{6,}"),
)
REDACTED = "[redacted]"


def register_secret(value: str | None) -> None:
    """Remember a key this process sends, so `redact` removes it from error texts (short values are
    not keys worth hiding and would blank ordinary words)."""
    if value and len(value) >= 8:
        with _SECRETS_LOCK:
            _SECRETS.add(value)


def redact(text: str) -> str:
    """``text`` with every registered key, bearer token and ``sk-...``-like token replaced by ``[redacted]``.

    A server may echo the request's ``Authorization`` header in an error body; that body becomes an
    error text stored in predictions, traces and run.json."""
    with _SECRETS_LOCK:
        secrets = sorted(_SECRETS, key=len, reverse=True)
    for s in secrets:
        text = text.replace(s, REDACTED)
    text = _SECRET_PATTERNS[0].sub(lambda m: m.group(1) + REDACTED, text)
    text = _SECRET_PATTERNS[1].sub(REDACTED, text)
    return _SECRET_PATTERNS[2].sub(lambda m: m.group(1) + REDACTED, text)


class ModelError(RuntimeError):
    """A model call gave no usable result: an error for its question or job, never an answer.

    ``partial`` carries what the failed work already cost (tokens, calls, latency, malformed tool
    calls), so a run can record it; nothing that raised a `ModelError` is written to the response cache.
    Its message is redacted (`redact`): it is stored as the question's or job's error.
    """

    def __init__(self, message: str, partial: CallStats | None = None):
        super().__init__(redact(message))
        self.partial = partial if partial is not None else CallStats()


class ModelCallError(ModelError):
    """A model call failed after its retries (the message says which model and why)."""


class EndpointUnreachable(ModelCallError):
    """Nothing answers at the endpoint (connection refused, closed port, wrong host)."""


class EmptyReply(ModelError):
    """The model answered with neither text nor a tool call."""


class MalformedToolCall(ModelError):
    """The model wrote a tool call as text (``functions.memory_search:``) or with unusable arguments."""


class ToolLoopExhausted(ModelError):
    """The agent was still calling tools after its last round."""


class PromptTooLong(ModelError):
    """The prompt does not fit the model's context window (checked before sending)."""


class BadReply(ModelError):
    """The reply has text, but not the form the caller asked for (e.g. a judge verdict)."""


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

    def __add__(self, other: CallStats) -> CallStats:
        return CallStats(self.usage + other.usage, self.calls + other.calls, self.cached_calls + other.cached_calls,
                         self.latency_s + other.latency_s, self.malformed_tool_calls + other.malformed_tool_calls)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self.usage), "calls": self.calls, "cached_calls": self.cached_calls,
                "latency_s": self.latency_s, "malformed_tool_calls": self.malformed_tool_calls}


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

    def to_json(self) -> dict[str, Any]:
        return {"text": self.text, "tool_calls": [asdict(t) for t in self.tool_calls], "usage": asdict(self.usage),
                "malformed_tool_calls": self.malformed_tool_calls}

    @classmethod
    def from_json(cls, d: dict[str, Any], request_hash: str) -> Completion:
        return cls(text=d["text"], tool_calls=[ToolCall(**t) for t in d["tool_calls"]], usage=Usage(**d["usage"]),
                   from_cache=True, request_hash=request_hash, calls=0,
                   malformed_tool_calls=int(d.get("malformed_tool_calls", 0)))

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


#: Format of the response cache file; a file of another format is reported and started afresh.
RESPONSE_CACHE_FORMAT = 2


def _check_response_db(conn: sqlite3.Connection) -> str | None:
    from memlab.cache_integrity import versioned_table

    return versioned_table(conn, "responses", "h TEXT PRIMARY KEY, model TEXT, body TEXT, sha256 TEXT NOT NULL",
                           RESPONSE_CACHE_FORMAT)


def _body_sha(h: str, model: str, body: str) -> str:
    return hashlib.sha256(f"{h}\x1f{model}\x1f{body}".encode("utf-8", "surrogatepass")).hexdigest()


class ResponseCache:
    """SQLite table of request hash -> completion JSON (thread-safe, WAL), each entry with a sha256.

    A bad file is reported, set aside and started afresh; an entry whose checksum or JSON is wrong
    is reported, deleted and treated as a miss (the call is made again), never returned.
    """

    def __init__(self, path: str | os.PathLike[str]):
        from memlab.cache_integrity import open_sqlite_cache

        self.path = str(path)
        self._conn = open_sqlite_cache(self.path, "response-cache", _check_response_db)
        self._lock = threading.Lock()

    def get(self, h: str) -> dict[str, Any] | None:
        with self._lock:
            r = self._conn.execute("SELECT model, body, sha256 FROM responses WHERE h=?", (h,)).fetchone()
        if r is None:
            return None
        model, body, sha = r
        problem = None
        if not isinstance(body, str) or _body_sha(h, model, body) != sha:
            problem = "fails its checksum"
        else:
            try:
                out = json.loads(body)
                Completion.from_json(out, h)
            except (ValueError, TypeError, KeyError) as e:
                problem = f"does not parse ({type(e).__name__})"
        if problem is None:
            return out
        from memlab.cache_integrity import report

        report("response-cache", self.path, f"entry {h[:12]} ({model}) {problem}", "entry dropped, call made again")
        with self._lock, self._conn:
            self._conn.execute("DELETE FROM responses WHERE h=?", (h,))
        return None

    def put(self, h: str, model: str, body: dict[str, Any]) -> None:
        text = json.dumps(body)
        with self._lock, self._conn:
            self._conn.execute("INSERT OR REPLACE INTO responses VALUES (?,?,?,?)",
                               (h, model, text, _body_sha(h, model, text)))

    def delete(self, h: str) -> None:
        with self._lock, self._conn:
            self._conn.execute("DELETE FROM responses WHERE h=?", (h,))


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


# ------------------------------------------------------------------------------- endpoints
def is_local(api_base: str | None) -> bool:
    if not api_base:
        return False
    host = (urllib.parse.urlsplit(api_base).hostname or "").lower()
    return host in ("localhost", "127.0.0.1", "::1", "0.0.0.0") or host.startswith("127.")


class _Endpoint:
    """One shared slot counter per ``api_base``: at most ``concurrency`` requests in flight to it."""

    def __init__(self, api_base: str, concurrency: int):
        self.api_base = api_base
        self.concurrency = concurrency
        self.slots = threading.BoundedSemaphore(concurrency)


_ENDPOINTS: dict[str, _Endpoint] = {}
_ENDPOINTS_LOCK = threading.Lock()
_CONTEXT_WINDOWS: dict[tuple[str, str], tuple[int | None, str]] = {}
_CONTEXT_WINDOWS_LOCK = threading.Lock()


def endpoint(api_base: str, concurrency: int) -> _Endpoint:
    """The process-wide slot counter of an endpoint (the first client sets its limit; a different one is an error)."""
    key = api_base.rstrip("/")
    with _ENDPOINTS_LOCK:
        ep = _ENDPOINTS.get(key)
        if ep is None:
            ep = _ENDPOINTS[key] = _Endpoint(key, concurrency)
        elif ep.concurrency != concurrency:
            raise ValueError(f"{key}: concurrency {concurrency} asked, but this endpoint is already limited to "
                             f"{ep.concurrency} request(s) at a time by another client; use one value per api_base")
        return ep


def registered_endpoint(api_base: str | None) -> _Endpoint | None:
    """The slot counter a model client of this ``api_base`` registered (None: no limit is set), so other
    callers of the same server (a litellm embedder) queue behind the same slots."""
    if not api_base:
        return None
    with _ENDPOINTS_LOCK:
        return _ENDPOINTS.get(api_base.rstrip("/"))


def _model_id(model: str) -> str:
    return model.split("/", 1)[1] if "/" in model else model


def _http_get_json(url: str, api_key: str | None, timeout: float) -> Any:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 (the user's own endpoint)
        return json.loads(r.read().decode("utf-8"))


def context_window_from_models(listing: Any, model: str) -> int | None:
    """The context length a ``/models`` listing states for ``model`` (vLLM ``max_model_len``, llama.cpp
    ``meta.n_ctx_train``/``n_ctx``, others ``context_length``/``context_window``); None when it says none."""
    data = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(data, list) or not data:
        return None
    want = _model_id(model)
    entry = next((d for d in data if isinstance(d, dict) and d.get("id") in (want, model)), None)
    if entry is None and len(data) == 1 and isinstance(data[0], dict):
        entry = data[0]  # a one-model server answers to any name
    if entry is None:
        return None
    meta = entry.get("meta") if isinstance(entry.get("meta"), dict) else {}
    for v in (entry.get("max_model_len"), entry.get("context_length"), entry.get("context_window"),
              meta.get("n_ctx"), meta.get("n_ctx_train")):
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def prompt_tokens_estimate(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> int:
    """o200k tokens of the messages' text and the tool schemas (offline; a model's own tokenizer differs a little)."""
    parts = []
    for m in messages:
        c = m.get("content")
        parts.append(c if isinstance(c, str) else json.dumps(c, default=str) if c is not None else "")
        if m.get("tool_calls"):
            parts.append(json.dumps(m["tool_calls"], default=str))
    if tools:
        parts.append(json.dumps(tools))
    return count_tokens("\n".join(parts)) + 4 * len(messages)


def _connection_error(e: BaseException) -> bool:
    chain: BaseException | None = e
    while chain is not None:
        if isinstance(chain, (ConnectionRefusedError, CircuitOpen)) or type(chain).__name__ in ("ConnectError",):
            return True
        if "connection refused" in str(chain).lower() or "connect error" in str(chain).lower():
            return True
        chain = chain.__cause__ or chain.__context__
    return False


def _retry_after(e: BaseException) -> float | None:
    """Seconds from a 429/503's ``Retry-After`` header, when the error carries the response."""
    for obj in (e, getattr(e, "__cause__", None)):
        resp = getattr(obj, "response", None)
        headers = getattr(resp, "headers", None) or getattr(obj, "litellm_response_headers", None)
        if headers is None:
            continue
        v = headers.get("retry-after") if hasattr(headers, "get") else None
        try:
            return float(v) if v is not None else None
        except ValueError:
            return None
    return None


def _is_timeout(e: BaseException) -> bool:
    return "Timeout" in type(e).__name__ or "timed out" in str(e).lower()


_NO_RETRY = ("AuthenticationError", "BadRequestError", "NotFoundError", "PermissionDeniedError",
             "ContextWindowExceededError", "ContentPolicyViolationError", "UnsupportedParamsError")
MAX_RETRY_AFTER_S = 120.0


class ModelClient:
    """A model by litellm name (``gpt-4o-mini``, ``openai/<name>`` + ``api_base`` for local servers).

    Local endpoints (``api_base`` on this machine) get ``concurrency`` = 1 by default: one request in
    flight per endpoint, shared by every client of that ``api_base`` in the process. After a timeout
    the client waits (holding the slot, up to ``busy_wait`` s) until the endpoint's ``/models``
    answers again, so a one-request server is not handed a new request while it still computes the
    old one. ``context_window`` (or the one ``/models`` states) is checked before every call.
    """

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
        concurrency: int | None = None,
        context_window: int | None = None,
        busy_wait: float | None = None,
    ):
        self.model = model
        self.api_base = api_base
        self.api_key = api_key
        register_secret(api_key)
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.temperature = temperature
        self.cache_path = None if cache_path is None else str(cache_path)
        if concurrency is None and is_local(api_base):
            concurrency = 1
        if concurrency is not None and concurrency < 1:
            raise ValueError(f"{model}: concurrency = {concurrency}; expected an integer >= 1 (or None: unlimited)")
        self.concurrency = concurrency
        self.context_window = context_window
        self.busy_wait = 4 * timeout if busy_wait is None else busy_wait
        if concurrency is not None:
            endpoint(api_base or f"provider:{model}", concurrency)  # registered now: a conflict fails early
        self._cache: ResponseCache | None = None
        self._lock = threading.Lock()
        self.calls = 0
        self.cache_hits = 0
        self.failures = 0
        self.malformed_tool_calls = 0

    @property
    def cache(self) -> ResponseCache | None:
        if self.cache_path and self._cache is None:
            self._cache = ResponseCache(self.cache_path)
        return self._cache

    @property
    def endpoint(self) -> _Endpoint | None:
        if self.concurrency is None:
            return None
        return endpoint(self.api_base or f"provider:{self.model}", self.concurrency)

    # ------------------------------------------------------------------------ context window
    def resolved_context_window(self) -> tuple[int | None, str]:
        """The context window and where it came from (config, the server's /models, or unknown)."""
        if self.context_window:
            return self.context_window, "config"
        if not self.api_base:
            return None, "unknown"
        key = (self.api_base.rstrip("/"), self.model)
        if key not in _CONTEXT_WINDOWS:
            # the probe is a request too: it takes an endpoint slot (a one-request server sees one at a time),
            # and one thread asks while the others wait for its answer
            ep = self.endpoint
            if ep is not None:
                ep.slots.acquire()
            try:
                with _CONTEXT_WINDOWS_LOCK:
                    if key not in _CONTEXT_WINDOWS:
                        _CONTEXT_WINDOWS[key] = self._probe_context_window()
            finally:
                if ep is not None:
                    ep.slots.release()
        return _CONTEXT_WINDOWS[key]

    def _probe_context_window(self) -> tuple[int | None, str]:
        base = (self.api_base or "").rstrip("/")
        try:
            n = context_window_from_models(_http_get_json(base + "/models", self.api_key, min(self.timeout, 10.0)),
                                           self.model)
        except Exception as e:
            log.info("%s: context window unknown (GET /models failed: %s: %s)", self.model, type(e).__name__, e)
            return None, "unknown"
        return (n, f"{base}/models") if n else (None, "unknown")

    def check_prompt(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                     reserve: int = 0) -> int:
        """Raise `PromptTooLong` naming both sizes when the prompt cannot fit; returns the estimate."""
        window, source = self.resolved_context_window()
        if not window:
            return 0
        n = prompt_tokens_estimate(messages, tools)
        if n + reserve > window:
            raise PromptTooLong(f"{self.model}: the prompt is ~{n} tokens (o200k estimate)"
                                f"{f' + {reserve} for the reply' if reserve else ''}, over the model's context "
                                f"window of {window} tokens (from {source}); shorten the prompt or use a "
                                f"longer-context model")
        return n

    # ------------------------------------------------------------------------------- calls
    def cache_key(self, payload: dict[str, Any], cache_tag: str | None = None) -> str:
        """The response-cache key of a request: everything sent that decides the reply (model, messages,
        which carry the rendered prompt, tools, tool_choice, temperature and every other parameter),
        the normalised endpoint that answers it, and ``cache_tag``. Two servers never share replies."""
        key = dict(payload)
        ep = normalise_endpoint(self.api_base)
        if ep is not None:  # a provider's own API (no api_base) is named by the model: keys stay as they were
            key["_memlab_endpoint"] = ep
        if cache_tag is not None:
            key["_memlab_cache_tag"] = cache_tag
        return request_hash(key)

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                 tool_choice: str | dict[str, Any] | None = None, cache_tag: str | None = None,
                 check: Callable[[Completion], Any] | None = None, **params: Any) -> Completion:
        """One completion. Raises `EmptyReply` (no text, no tool call), `MalformedToolCall` (a tool
        call written as text that neither parses nor comes back well-formed when re-asked with the
        tool forced), `PromptTooLong` or `ModelCallError`; none of these is cached. ``cache_tag`` is
        part of the response-cache key only (not sent), so repeated samples of one request (judge
        repeats) are cached apart.

        ``check(completion)`` is the caller's reading of the reply (a judge verdict, the last round
        of a tool loop): when it raises (a `ModelError`, or ValueError, raised as `BadReply`) the reply
        is not cached, so a rerun asks again; a cached reply it rejects is dropped and asked again."""
        messages = explicit_content(messages)
        payload: dict[str, Any] = {"model": self.model, "messages": messages}
        if tools:
            payload["tools"] = tools
            if tool_choice is not None:
                payload["tool_choice"] = tool_choice
        if self.temperature is not None:
            payload.setdefault("temperature", self.temperature)
        payload.update(params)
        h = self.cache_key(payload, cache_tag)
        cache = self.cache
        if cache is not None:
            hit = cache.get(h)
            if hit is not None:
                comp = Completion.from_json(hit, h)
                try:
                    self._checked(comp, check)
                except ModelError as e:  # written by an older memlab that cached rejected replies
                    log.info("%s: cached reply %s rejected (%s); asking again", self.model, h[:12], e)
                    cache.delete(h)
                else:
                    with self._lock:
                        self.cache_hits += 1
                    return comp
        self.check_prompt(messages, tools, reserve=int(params.get("max_tokens") or 0))
        comp = self._call(payload, messages)
        comp.request_hash = h
        if not comp.tool_calls and tools and tool_choice != "none":
            comp = self._recover_tool_text(comp, payload, messages, tools)
        elif not comp.tool_calls and tools:
            name, _ = tool_call_text(comp.text, [t["function"]["name"] for t in tools])
            if name is not None:
                self._count_malformed(1)
                raise MalformedToolCall(f"{self.model}: asked for no tool (tool_choice=none) but wrote a "
                                        f"{name} call as text: {comp.text[:80]!r}",
                                        replace(comp.stats(), malformed_tool_calls=1))
        if not comp.tool_calls and not comp.text.strip():
            raise EmptyReply(f"{self.model}: empty reply (no text, no tool call)", comp.stats())
        self._checked(comp, check)
        if cache is not None:
            cache.put(h, self.model, comp.to_json())
        return comp

    def _checked(self, comp: Completion, check: Callable[[Completion], Any] | None) -> None:
        """Run the caller's ``check``; its rejection is a `ModelError` carrying this reply's cost."""
        if check is None:
            return
        try:
            check(comp)
        except ModelError as e:
            e.partial = comp.stats()
            raise
        except ValueError as e:
            raise BadReply(f"{self.model}: {e}", comp.stats()) from e

    def _count_malformed(self, n: int) -> None:
        with self._lock:
            self.malformed_tool_calls += n

    def _recover_tool_text(self, comp: Completion, payload: dict[str, Any], messages: list[dict[str, Any]],
                           tools: list[dict[str, Any]]) -> Completion:
        """A tool call written as text: parse it when unambiguous, else re-ask once with that tool forced."""
        names = [t["function"]["name"] for t in tools]
        name, calls = tool_call_text(comp.text, names)
        if name is None:
            return comp
        self._count_malformed(1)
        comp.malformed_tool_calls += 1
        if calls is not None:
            comp.tool_calls, comp.text = calls, ""
            return comp
        forced = dict(payload, tool_choice={"type": "function", "function": {"name": name}})
        try:
            again = self._call(forced, messages)
        except ModelError as e:
            e.partial = comp.stats() + e.partial
            raise
        total = comp.stats() + again.stats()
        if again.tool_calls and all(tc.name in names for tc in again.tool_calls):
            again.usage, again.calls, again.latency_s = total.usage, total.calls, total.latency_s
            again.malformed_tool_calls, again.attempts = total.malformed_tool_calls, comp.attempts + again.attempts
            again.request_hash = comp.request_hash
            return again
        raise MalformedToolCall(f"{self.model}: wrote the tool call as text ({comp.text[:80]!r}) and, re-asked "
                                f"with tool_choice forced to {name}, replied {again.text[:80]!r} without a "
                                f"tool call", total)

    def _call(self, payload: dict[str, Any], messages: list[dict[str, Any]]) -> Completion:
        litellm = import_litellm()
        kw = self._endpoint_kw(payload)
        resp, attempts, spent = self._retrying(lambda: litellm.completion(**kw))
        comp = self._parse(resp, messages)
        comp.latency_s = spent
        comp.attempts = comp.calls = attempts
        return comp

    def embed(self, texts: list[str]) -> tuple[list[Any], Usage, CallStats]:
        """Embedding vectors of ``texts`` (one request), with the chat calls' retries, endpoint slots
        and accounting; usage is the provider's, else counted (``estimated``)."""
        litellm = import_litellm()
        kw = self._endpoint_kw({"model": self.model, "input": list(texts)})
        resp, attempts, spent = self._retrying(lambda: litellm.embedding(**kw))
        data = sorted(resp.data, key=lambda d: d["index"] if isinstance(d, dict) else d.index)
        vecs = [d["embedding"] if isinstance(d, dict) else d.embedding for d in data]
        u = getattr(resp, "usage", None)
        n = int(getattr(u, "prompt_tokens", 0) or 0) if u is not None else 0
        usage = Usage(n, 0, 0, False) if n else Usage(sum(count_tokens(t) for t in texts), 0, 0, True)
        return vecs, usage, CallStats(usage=usage, calls=attempts, latency_s=spent)

    def _endpoint_kw(self, payload: dict[str, Any]) -> dict[str, Any]:
        kw = dict(payload, timeout=self.timeout, num_retries=0)
        if self.api_base:
            kw["api_base"] = self.api_base
        if self.api_key:
            kw["api_key"] = self.api_key
        return kw

    def _retrying(self, send: Any) -> tuple[Any, int, float]:
        """``send()`` with bounded retries (backoff, Retry-After, the endpoint's slots, the busy wait
        after a timeout); returns (response, attempts, seconds) or raises `ModelCallError` /
        `EndpointUnreachable` carrying the attempts as partial cost."""
        last: Exception | None = None
        spent = 0.0
        ep = self.endpoint
        br = breaker(self.api_base or f"provider:{self.model}")
        attempt = 0
        for attempt in range(1, self.max_retries + 2):
            try:
                br.before()  # a few calls in a row could not connect: fail now, not after every retry
            except CircuitOpen as e:
                last, attempt = e, attempt - 1
                break
            t0 = time.perf_counter()
            wait = 0.0
            if ep is not None:
                ep.slots.acquire()
            try:
                with self._lock:
                    self.calls += 1
                resp = send()
                br.record(True)
                return resp, attempt, spent + time.perf_counter() - t0
            except Exception as e:  # litellm maps provider errors to its own exception classes
                last = e
                br.record(not _connection_error(e), f"{type(e).__name__}: {e}")
                if _is_timeout(e) and ep is not None:
                    self._wait_until_idle()  # still holding the slot: nothing new reaches a busy server
                wait = _retry_after(e) or 0.0
            finally:
                if ep is not None:
                    ep.slots.release()
                spent += time.perf_counter() - t0
            if type(last).__name__ in _NO_RETRY or attempt > self.max_retries:
                break
            wait = min(MAX_RETRY_AFTER_S, max(wait, self.backoff * (2 ** (attempt - 1))))
            time.sleep(wait)
            spent += wait
        with self._lock:
            self.failures += 1
        cls = EndpointUnreachable if last is not None and _connection_error(last) else ModelCallError
        where = f" at {self.api_base}" if self.api_base else ""
        raise cls(f"{self.model}{where}: call failed after {attempt} attempt(s): "
                  f"{type(last).__name__}: {redact(str(last))[:300]}",
                  CallStats(calls=attempt, latency_s=spent)) from last

    def _wait_until_idle(self) -> None:
        """After a timeout: wait until the endpoint answers ``/models`` (a one-request server answers
        only when it has finished the abandoned request), at most ``busy_wait`` seconds."""
        if not self.api_base:
            return
        deadline = time.monotonic() + self.busy_wait
        while time.monotonic() < deadline:
            try:
                _http_get_json(self.api_base.rstrip("/") + "/models", self.api_key,
                               max(0.1, deadline - time.monotonic()))
                return
            except Exception:
                time.sleep(0.05)

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
        except Exception as e:
            log.debug("%s: no tokenizer (%s); estimating with gpt-4o-mini's", self.model, type(e).__name__)
            p = litellm.token_counter(model="gpt-4o-mini", messages=messages)
            c = litellm.token_counter(model="gpt-4o-mini", text=text) if text else 0
        return Usage(int(p), int(c), 0, True)


def explicit_content(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every assistant message carries a ``content`` string: some servers' chat templates (llama.cpp)
    fail with HTTP 500 on a tool-call message whose ``content`` is missing or null."""
    out = []
    for m in messages:
        if m.get("role") == "assistant" and m.get("content") is None:
            m = {**m, "content": ""}
        out.append(m)
    return out
