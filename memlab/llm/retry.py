"""The retry and rate-limit policy of every model request (`memlab.llm.ModelClient`), declared in one place.

- A request that failed with an error that can pass (HTTP 429, 5xx, a timeout, a dropped connection) is sent
  again, up to the role's ``max_retries`` (``models.max_retries``, default 3) more times; an error that cannot
  pass (a rejected key, a bad request, a prompt over the context window: `NO_RETRY`) is not retried.
- When the error carries ``Retry-After`` (seconds or an HTTP date; or OpenAI's ``retry-after-ms``), the next
  attempt waits exactly that long, capped at `MAX_RETRY_AFTER_S`.
- Otherwise it backs off exponentially with jitter: attempt ``n`` waits between half and all of
  ``backoff x 2^(n-1)`` seconds (``backoff`` 0.5 s by default; the base capped at `MAX_BACKOFF_S`), uniformly
  drawn, so clients that failed together do not retry together.
- After the last retry the call fails (`ModelCallError`): the question, verdict or extraction job is an error,
  counted against ``run.max_error_rate`` as any failed call; a dead endpoint (refused connections) trips the
  endpoint's circuit breaker (`memlab.breaker`) and stops the run.
- Requests in flight are limited per endpoint (one counter per ``api_base``, or per model for a provider's own
  API, shared by every role and client of the process): ``models.concurrency``, by default `LOCAL_CONCURRENCY`
  for a server on this machine and `HOSTED_CONCURRENCY` for a hosted one, never unlimited. A retry's wait is
  spent outside the endpoint's slot.
"""

from __future__ import annotations

import email.utils
import random
import time
import urllib.parse
from typing import Any

#: A ``Retry-After`` longer than this waits this long (then the attempt is made; it may be refused again).
MAX_RETRY_AFTER_S = 120.0
#: The exponential backoff's base never grows past this (seconds).
MAX_BACKOFF_S = 60.0
#: Default requests in flight to one endpoint: a server on this machine (127.0.0.1, localhost) ...
LOCAL_CONCURRENCY = 1
#: ... and a hosted API (bounded: a provider's rate limits are per key, and a run's threads would all fire at once).
HOSTED_CONCURRENCY = 4
#: Errors that a second attempt cannot fix (litellm's exception class names).
NO_RETRY = ("AuthenticationError", "BadRequestError", "NotFoundError", "PermissionDeniedError",
            "ContextWindowExceededError", "ContentPolicyViolationError", "UnsupportedParamsError")


def is_local(api_base: str | None) -> bool:
    """Whether ``api_base`` is a server on this machine."""
    if not api_base:
        return False
    host = (urllib.parse.urlsplit(api_base).hostname or "").lower()
    return host in ("localhost", "127.0.0.1", "::1", "0.0.0.0") or host.startswith("127.")


def default_concurrency(api_base: str | None) -> int:
    """Requests in flight to an endpoint when ``models.concurrency`` is not set."""
    return LOCAL_CONCURRENCY if is_local(api_base) else HOSTED_CONCURRENCY


def _seconds(v: Any, ms: bool = False) -> float | None:
    if v is None:
        return None
    try:
        s = float(v)
        return s / 1000 if ms else s
    except (TypeError, ValueError):
        pass
    if ms:
        return None
    try:  # an HTTP date
        when = email.utils.parsedate_to_datetime(str(v))
    except (TypeError, ValueError):
        return None
    return None if when is None else when.timestamp() - time.time()


def retry_after(e: BaseException) -> float | None:
    """Seconds the server asked to wait (``retry-after-ms``, ``Retry-After``), when the error carries its response."""
    for obj in (e, getattr(e, "__cause__", None)):
        resp = getattr(obj, "response", None)
        headers = getattr(resp, "headers", None) or getattr(obj, "litellm_response_headers", None)
        if headers is None or not hasattr(headers, "get"):
            continue
        for name, ms in (("retry-after-ms", True), ("retry-after", False)):
            s = _seconds(headers.get(name), ms)
            if s is not None:
                return max(0.0, s)
        return None
    return None


def retryable(e: BaseException) -> bool:
    """Whether another attempt may succeed (not a rejected key, a bad request, an over-long prompt ...)."""
    return type(e).__name__ not in NO_RETRY


def retry_wait(e: BaseException, attempt: int, backoff: float, rng: random.Random | None = None) -> float:
    """Seconds to wait before attempt ``attempt + 1`` after ``e`` (the module's policy)."""
    asked = retry_after(e)
    if asked is not None:
        return min(MAX_RETRY_AFTER_S, asked)
    base = min(MAX_BACKOFF_S, backoff * (2 ** (attempt - 1)))
    return base / 2 + (rng or random).uniform(0.0, base / 2)
