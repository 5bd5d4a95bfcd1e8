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

An add is written alike under every policy; only updates, deletes and clears differ. So the policy decides what
a store holds only when one of those can reach it (`policy_decides_store`): proposed by the extractor
(`memlab.extract.Extractor.proposes`) or made by reconcile rewriting an add into an update. Otherwise every job
writes the same adds, the store after each job is the same, and so is what the next job's old-memory lookup and
reconcile search see: the extraction cache (`memlab.run.extraction.extraction_cache_key`) then leaves the
policy out, and a sweep over policies extracts once.
"""

from __future__ import annotations

from collections.abc import Set

from memlab.extract.reconcile import ReconcileConfig

POLICIES = ("merge-similar", "preserve-history", "append-only")
DEFAULT_POLICY = "merge-similar"
#: The only op every policy applies alike.
POLICY_FREE_OPS = frozenset({"add"})
#: Reconcile switched off: one value whatever the thresholds (none of them is read then).
RECONCILE_OFF = ReconcileConfig(enabled=False)


def check_policy(policy: str) -> str:
    if policy not in POLICIES:
        raise ValueError(f"update policy: expected one of {POLICIES}, got {policy!r}")
    return policy


def applied_reconcile(reconcile: ReconcileConfig, extractor_reconciles: bool, policy: str) -> ReconcileConfig:
    """The reconcile the worker applies: `RECONCILE_OFF` when it is disabled, for an extractor that opts out
    (``Extractor.reconciles``) and under append-only; else ``reconcile`` as configured."""
    if not reconcile.enabled or not extractor_reconciles or policy == "append-only":
        return RECONCILE_OFF
    return reconcile


def policy_decides_store(proposes: Set[str], reconcile: ReconcileConfig) -> bool:
    """Whether the update policy can change what extraction stores, given the ops the extractor can propose
    and the reconcile applied (`applied_reconcile`): only when an update, delete or clear can reach the store
    (see the module doc)."""
    return bool(set(proposes) - POLICY_FREE_OPS) or (reconcile.enabled and reconcile.updates_enabled)
