"""Update policies: what an update or delete does to the store (``extraction.policy``).

- ``merge-similar`` (default; tRPC-Agent-Go's behaviour): reconcile may turn an add into an update
  of a similar memory, and an update overwrites that memory's text in place (its id and merged
  provenance kept) — the old wording is gone;
- ``preserve-history``: reconcile as above, but an update keeps the old memory, marked
  ``superseded_at`` (the time of the extraction job, i.e. the conversation's time) and
  ``superseded_by`` (the new version's id), and stores the new version as its own memory.
  Superseded memories stay in the store, in the memories trace and in answer-time search (so a
  question about what changed, and when, can still be answered); the worker's old-memory lookup
  and reconcile search see only current memories, so history never forks. A delete still deletes;
  clear still clears;
- ``append-only``: nothing is ever changed or removed: reconcile is off (every add kept; identical
  content is still one entry by its content id), a proposed update is stored as a new memory, and
  deletes and clears are refused (recorded in the extraction trace as ``refused (append-only)``).
"""

from __future__ import annotations

POLICIES = ("merge-similar", "preserve-history", "append-only")
DEFAULT_POLICY = "merge-similar"


def check_policy(policy: str) -> str:
    if policy not in POLICIES:
        raise ValueError(f"update policy: expected one of {POLICIES}, got {policy!r}")
    return policy
