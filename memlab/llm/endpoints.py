"""The process-wide endpoint registry (one slot counter per ``api_base``), what an endpoint says of its models,
and the classification of errors the retrying client acts on."""

from __future__ import annotations

import json
import threading
import urllib.request
from typing import Any

from memlab.breaker import CircuitOpen
from memlab.llm.imports import count_tokens
from memlab.llm.retry import is_local  # noqa: F401 - public here too (memlab.llm re-exports it)


# ------------------------------------------------------------------------------- endpoints
class _Endpoint:
    """One shared slot counter per ``api_base``: at most ``concurrency`` requests in flight to it."""

    def __init__(self, api_base: str, concurrency: int):
        self.api_base = api_base
        self.concurrency = concurrency
        self.slots = threading.BoundedSemaphore(concurrency)

    def idle(self) -> bool:
        """No request holds a slot now (each free slot is taken and given straight back)."""
        taken = 0
        while taken < self.concurrency and self.slots.acquire(blocking=False):
            taken += 1
        for _ in range(taken):
            self.slots.release()
        return taken == self.concurrency


_ENDPOINTS: dict[str, _Endpoint] = {}
_ENDPOINTS_LOCK = threading.Lock()


def endpoint(api_base: str, concurrency: int) -> _Endpoint:
    """The process-wide slot counter of an endpoint: its clients share one limit. A client asking another limit
    replaces it while no request is in flight (a later run in the same process, such as a notebook's next cell,
    with another ``concurrency``, or a new server on a port an old one used), and is an error while one is. The
    roles of one run on one server agree, or its config is refused ("one endpoint, one limit")."""
    key = api_base.rstrip("/")
    with _ENDPOINTS_LOCK:
        ep = _ENDPOINTS.get(key)
        if ep is None or (ep.concurrency != concurrency and ep.idle()):
            ep = _ENDPOINTS[key] = _Endpoint(key, concurrency)
        elif ep.concurrency != concurrency:
            raise ValueError(f"{key}: concurrency {concurrency} asked while another client's request is in flight "
                             f"under its limit of {ep.concurrency}; use one value per api_base")
        return ep


def registered_endpoint(api_base: str | None) -> _Endpoint | None:
    """The slot counter a model client of this ``api_base`` registered (None: no limit is set), so other
    callers of the same server (a litellm embedder) queue behind the same slots."""
    if not api_base:
        return None
    with _ENDPOINTS_LOCK:
        return _ENDPOINTS.get(api_base.rstrip("/"))


def served_model_id(model: str) -> str:
    """The name a server lists a model under: litellm's ``provider/`` prefix dropped (``openai/local`` -> ``local``)."""
    return model.split("/", 1)[1] if "/" in model else model


def http_get_json(url: str, api_key: str | None, timeout: float) -> Any:
    """GET ``url`` (an endpoint's ``/models``) as JSON, with the bearer key when there is one; no litellm import."""
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 (the user's own endpoint)
        return json.loads(r.read().decode("utf-8"))


def context_window_from_models(listing: Any, model: str) -> int | None:
    """The context length a ``/models`` listing states for ``model`` (vLLM ``max_model_len``, llama.cpp
    ``meta.n_ctx_train``/``n_ctx``, others ``context_length``/``context_window``); None when it says none."""
    data = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(data, list) or not data:
        return None
    want = served_model_id(model)
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


def _is_timeout(e: BaseException) -> bool:
    return "Timeout" in type(e).__name__ or "timed out" in str(e).lower()
