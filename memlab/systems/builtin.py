"""memlab's own pipeline as a `MemorySystem`: a thin adapter over the extraction worker, the store and its index."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from memlab.data.locomo import Conversation
from memlab.extract.checkers import Checker
from memlab.extract.extractors import Extractor
from memlab.extract.pipeline import extract_conversation
from memlab.extract.reconcile import ReconcileConfig
from memlab.memory.entry import MemoryEntry, UserKey
from memlab.memory.search_types import SearchOptions
from memlab.memory.service import MemoryService
from memlab.systems.base import SYSTEMS, MemorySystem, Message, SystemHit


def _hit(e: MemoryEntry, score: float = 0.0) -> SystemHit:
    return SystemHit(memory_id=e.id, text=e.text, score=score, source_ids=tuple(e.source_ids), time=e.event_time,
                     participants=tuple(e.participants))


@SYSTEMS.register("memlab")
class MemlabSystem(MemorySystem):
    """``service`` (a `MemoryService` with its index attached) filled by ``extractor`` through the extraction
    worker; ``options`` are the search options (hybrid, RRF k, dedupe ...) a bare ``search(query, k)`` uses.

    A run with ``system.name = memlab`` (the default) builds this pipeline from the config through the cached
    extraction stage; an object of this class given to ``run_experiment(system=...)`` is used as it is.
    """

    name = "memlab"
    #: Built by the run's extraction stage from the config's sections, never from ``system.params``.
    fixed_params = {"worker_params": "extraction.worker"}

    def __init__(self, service: MemoryService, extractor: Extractor, options: SearchOptions | None = None,
                 checkers: Sequence[Checker] = (), reconcile: ReconcileConfig | None = None,
                 worker_params: dict[str, Any] | None = None):
        self.service = service
        self.extractor = extractor
        self.options = options or SearchOptions()
        self.checkers = checkers
        self.reconcile = reconcile
        self.worker_params = worker_params

    @classmethod
    def from_config(cls, params: dict[str, Any], ctx: dict[str, Any]) -> MemorySystem:
        raise TypeError("system 'memlab' is built by the run's extraction stage from the config; to use your own "
                        "pipeline pass MemlabSystem(service, extractor) to run_experiment(system=...)")

    def ingest(self, key: UserKey, session: str, messages: list[Message]) -> None:
        raise TypeError("MemlabSystem ingests whole conversations (its extractors bind to one, e.g. observations): "
                        "call ingest_conversation")

    def ingest_conversation(self, key: UserKey, conv: Conversation) -> None:
        """The conversation replayed session by session through the worker, one extraction job after each."""
        _, worker = extract_conversation(self.service, conv, self.extractor.bind(conv), self.checkers,
                                         self.reconcile, worker_params=self.worker_params)
        failed = [r.reason for r in worker.results if r.status == "failed"]
        if failed:
            raise RuntimeError(f"memlab extraction failed for {conv.sample_id}: {failed[0]}")

    def search(self, key: UserKey, query: str, k: int) -> list[SystemHit]:
        res = self.service.search(key, replace(self.options, query=query, max_results=k))
        return [_hit(h.entry, h.score) for h in res.hits]

    def memories(self, key: UserKey) -> list[SystemHit]:
        return [_hit(e) for e in self.service.list(key)]

    def cache_id(self) -> str:
        return f"memlab:{self.extractor.cache_id()}"

    def features(self) -> dict[str, Any]:
        o = self.options
        return {"hybrid": o.hybrid, "rrf_k": o.rrf_k, "dedupe": o.dedupe, "kind_fallback": o.kind_fallback}

    def as_service(self) -> MemoryService:
        return self.service

    def close(self) -> None:
        self.service.close()
