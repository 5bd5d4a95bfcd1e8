"""Checkers: plain predicates deciding whether an extraction job calls the model at all (no model).

A checker takes a `CheckContext` and returns True to extract. No checkers configured = extract.
False is a normal no-op: no model call, no write, cursor unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from memlab.extract.messages import Message
from memlab.memory.entry import UserKey


@dataclass(frozen=True)
class CheckContext:
    key: UserKey
    delta: Sequence[Message]
    last_extract_at: datetime | None
    now: datetime


Checker = Callable[[CheckContext], bool]


def message_threshold(n: int) -> Checker:
    """Extract when the delta holds strictly more than ``n`` messages."""
    if n < 0:
        raise ValueError(f"message_threshold: n must be >= 0, got {n}")

    def check(ctx: CheckContext) -> bool:
        return len(ctx.delta) > n

    check.__name__ = f"message_threshold({n})"
    return check


def time_interval(d: timedelta) -> Checker:
    """Extract when more than ``d`` has passed since the last extraction (or there was none)."""

    def check(ctx: CheckContext) -> bool:
        return ctx.last_extract_at is None or ctx.now - ctx.last_extract_at > d

    check.__name__ = f"time_interval({d})"
    return check


def checks_all(*checkers: Checker) -> Checker:
    """AND of checkers (an empty AND is True)."""

    def check(ctx: CheckContext) -> bool:
        return all(c(ctx) for c in checkers)

    check.__name__ = "checks_all(" + ", ".join(getattr(c, "__name__", "?") for c in checkers) + ")"
    return check


def checks_any(*checkers: Checker) -> Checker:
    """OR of checkers (an empty OR is False)."""

    def check(ctx: CheckContext) -> bool:
        return any(c(ctx) for c in checkers)

    check.__name__ = "checks_any(" + ", ".join(getattr(c, "__name__", "?") for c in checkers) + ")"
    return check


def should_extract(checkers: Sequence[Checker], ctx: CheckContext) -> bool:
    """The job's gate: several configured checkers must all pass; none configured means extract."""
    return all(c(ctx) for c in checkers)
