"""The spend cap (``run.max_calls``, ``run.max_usd``): every model request of a run asks it first.

One cap per process at a time, installed by the run (`capped`), as `memlab.llm.cancel` cuts calls: so every
client the run's components build (extractor, reader, tool-loop rounds, judge, a litellm embedder, mem0's own
calls) is held by it without being handed it. Before a request is sent, `SpendCap.admit` refuses it when

- ``calls so far + in flight + 1 > max_calls`` (each request sent counts, retries included), or
- ``dollars so far + in flight (their worst case) + this request's worst case > max_usd``, the worst case being
  its prompt tokens (o200k estimate) and the role's ``max_tokens`` at the model's price, as ``--plan`` prices them.

A refusal raises `SpendCapReached`, a ``KeyboardInterrupt``: no broad ``except Exception`` in a component turns
it into a question's error, and the run stops through its interrupt path, keeping every finished question and
extraction cursor, marked ``stopped``. Once refused, every later request is refused too (the run is stopping).
A request that got a reply is counted at its reported usage (else at its worst case); one that failed without a
reply costs nothing, except a timeout, counted at its worst case (the provider may have computed it).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any


class SpendCapReached(KeyboardInterrupt):
    """The next model request could pass ``run.max_calls`` or ``run.max_usd``: it was not sent; the run stops."""

    #: Set by an extraction it stopped (`memlab.extract.pipeline`): the (chat session, worker) so far, saved
    #: before the run stops so that a resume goes on at the refused job.
    extraction: Any = None


#: ``price(model, api_base)``: an object with ``cost(prompt, completion, cached) -> USD`` and ``source`` (a
#: `memlab.eval.cost.Price`); a source starting with ``unknown`` means no price is known.
PriceOf = Callable[[str, "str | None"], Any]


class SpendCap:
    """What a run has spent (``calls``, ``usd``: over every session of it, its earlier sessions' given at start) and its
    limits (None: no limit). Thread-safe: requests in flight hold their worst case until they settle."""

    def __init__(self, max_calls: int | None = None, max_usd: float | None = None, price: PriceOf | None = None,
                 calls: int = 0, usd: float | None = 0.0):
        if max_usd is not None and price is None:
            raise ValueError("SpendCap: max_usd needs a price function")
        self.max_calls = max_calls
        self.max_usd = max_usd
        self.price = price
        self.calls = calls
        self.usd = usd
        """Dollars so far (None: a request of a model without a known price was counted)."""
        self.reason: str | None = None
        """Why the cap stopped the run (None: it has not)."""
        self._in_flight = 0
        self._reserved = 0.0
        self._lock = threading.Lock()

    def _cost(self, model: str, api_base: str | None, prompt: int, completion: int, cached: int = 0
              ) -> float | None:
        if self.price is None:
            return None
        p = self.price(model, api_base)
        return None if str(p.source).startswith("unknown") else float(p.cost(prompt, completion, cached))

    def admit(self, role: str, model: str, api_base: str | None, prompt_tokens: int, max_tokens: int
              ) -> float | None:
        """Reserve one request (its worst-case dollars, None: unpriced; kept for `settle`) or raise
        `SpendCapReached`."""
        who = f"{role} {model}" if role else model
        with self._lock:
            if self.reason is not None:
                raise SpendCapReached(self.reason)
            if self.max_calls is not None and self.calls + self._in_flight + 1 > self.max_calls:
                self.reason = (f"spend cap: run.max_calls={self.max_calls} reached ({self.calls} calls made"
                               f"{f', {self._in_flight} in flight' if self._in_flight else ''}); the next "
                               f"({who}) was not sent")
                raise SpendCapReached(self.reason)
            worst = self._cost(model, api_base, prompt_tokens, max_tokens)
            if self.max_usd is not None and (self.usd or 0.0) + self._reserved + (worst or 0.0) > self.max_usd:
                self.reason = (f"spend cap: run.max_usd={self.max_usd:g} reached: spent ${self.usd or 0.0:.6f}"
                               f"{f' (+ ${self._reserved:.6f} in flight)' if self._in_flight else ''}, and the "
                               f"next call ({who}, ~{prompt_tokens:,} prompt tokens + up to {max_tokens:,} "
                               f"reply tokens) could cost up to ${worst or 0.0:.6f}; it was not sent")
                raise SpendCapReached(self.reason)
            self._in_flight += 1
            self._reserved += worst or 0.0
            return worst

    def settle(self, reserved: float | None, model: str, api_base: str | None,
               usage: tuple[int, int, int] | None, worst: bool = False) -> None:
        """After the request: ``usage`` (prompt, completion, cached tokens) of its reply, None without one;
        ``worst``: count it at its reservation (a timeout, or a reply without usage)."""
        cost = reserved if worst else 0.0 if usage is None else self._cost(model, api_base, *usage)
        with self._lock:
            self._in_flight -= 1
            self._reserved -= reserved or 0.0
            self.calls += 1
            self.usd = None if self.usd is None or cost is None else self.usd + cost

    def record(self) -> dict[str, Any]:
        """What run.json keeps (``spend``): the totals so far and the limits they were held to."""
        return {"calls": self.calls, "usd": None if self.usd is None else round(self.usd, 8),
                "max_calls": self.max_calls, "max_usd": self.max_usd, "stopped": self.reason}


def billed_tokens(resp: Any) -> tuple[int, int, int] | None:
    """(prompt, completion, cached) tokens a response reports (None: it reports none)."""
    u = getattr(resp, "usage", None)
    n = int(getattr(u, "prompt_tokens", 0) or 0) if u is not None else 0
    if not n:
        return None
    details = getattr(u, "prompt_tokens_details", None)
    cached = getattr(details, "cached_tokens", None) if details is not None else None
    return n, int(getattr(u, "completion_tokens", 0) or 0), int(cached or 0)


_CAP: list[SpendCap | None] = [None]
_CAP_LOCK = threading.Lock()


def current_cap() -> SpendCap | None:
    """The cap of the run in progress in this process (None: none installed)."""
    return _CAP[0]


@contextlib.contextmanager
def capped(cap: SpendCap) -> Iterator[SpendCap]:
    """Hold every model request of this process to ``cap`` while the block runs (one run at a time)."""
    with _CAP_LOCK:
        if _CAP[0] is not None:
            raise RuntimeError("a spend cap is already installed: one run per process at a time")
        _CAP[0] = cap
    try:
        yield cap
    finally:
        with _CAP_LOCK:
            _CAP[0] = None


@contextlib.contextmanager
def spending(role: str, model: str, api_base: str | None, prompt_tokens: int, max_tokens: int
             ) -> Iterator[Callable[..., None]]:
    """Around one request: admitted by the installed cap (if any); the block calls the yielded
    ``done(usage=None, worst=False)`` once it knows what the request cost (not calling it: nothing billed)."""
    cap = _CAP[0]
    if cap is None:
        yield lambda usage=None, worst=False: None
        return
    reserved = cap.admit(role, model, api_base, prompt_tokens, max_tokens)
    seen: dict[str, Any] = {"usage": None, "worst": False}

    def done(usage: tuple[int, int, int] | None = None, worst: bool = False) -> None:
        seen["usage"], seen["worst"] = usage, worst

    try:
        yield done
    finally:
        cap.settle(reserved, model, api_base, seen["usage"], seen["worst"])
