"""A circuit breaker per model endpoint: after a few consecutive connection failures, stop calling it.

Without it a dead server cost every job its full retries (272 extraction jobs x 4 attempts: 1,074 s
before the run gave up). Once ``threshold`` calls in a row could not connect, the breaker opens and
every call fails at once, naming the endpoint; after ``cooldown_s`` one trial call is let through
(a server started again is used again), and any answer closes it. Only connection failures count:
a slow or erroring server is the retry loop's business.
"""

from __future__ import annotations

import threading
import time


class CircuitOpen(ConnectionError):
    """The endpoint's breaker is open: recent calls could not connect, so this one is not sent."""


class CircuitBreaker:
    """Counts consecutive connection failures of one endpoint; `before()` raises `CircuitOpen` when open."""

    def __init__(self, name: str, threshold: int = 3, cooldown_s: float = 30.0):
        self.name = name
        self.threshold = threshold
        self.cooldown_s = cooldown_s
        self.failures = 0
        self.opened_at: float | None = None
        self.last_error = ""
        self._lock = threading.Lock()

    def before(self) -> None:
        """Call before sending a request: raises `CircuitOpen` while open (one trial passes per cooldown)."""
        with self._lock:
            if self.opened_at is None:
                return
            if time.monotonic() - self.opened_at >= self.cooldown_s:
                self.opened_at = time.monotonic()  # half-open: this call is the trial, the next ones wait again
                return
            raise CircuitOpen(f"{self.name}: not called: the last {self.failures} calls could not connect "
                              f"({self.last_error}); is the server running? (retried after {self.cooldown_s:.0f} s)")

    def record(self, connected: bool, error: str = "") -> None:
        """After a request: ``connected`` False when it failed to reach the endpoint at all."""
        with self._lock:
            if connected:
                self.failures, self.opened_at = 0, None
                return
            self.failures += 1
            self.last_error = error[:200]
            if self.failures >= self.threshold:
                self.opened_at = time.monotonic()

    def reset(self) -> None:
        """Close it (the endpoint was just seen answering, e.g. by the run's up-front check)."""
        self.record(True)


_BREAKERS: dict[str, CircuitBreaker] = {}
_BREAKERS_LOCK = threading.Lock()


def breaker(endpoint: str) -> CircuitBreaker:
    """The process-wide breaker of an endpoint (an ``api_base``, or ``provider:<model>``)."""
    key = endpoint.rstrip("/")
    with _BREAKERS_LOCK:
        if key not in _BREAKERS:
            _BREAKERS[key] = CircuitBreaker(key)
        return _BREAKERS[key]
