"""Memory systems as arms: one `MemorySystem` interface (ingest sessions, search, what was stored), memlab's own
pipeline as one implementation, external systems (mem0) as adapters, and provenance recovery for black boxes."""

from memlab.systems import mem0 as _mem0  # noqa: E402,F401  (registers "mem0"; mem0ai itself is imported lazily)
from memlab.systems.base import (
    SYSTEMS,
    MemorySystem,
    Message,
    SystemHit,
    SystemReplyError,
    SystemService,
    session_messages,
)
from memlab.systems.builtin import MemlabSystem
from memlab.systems.provenance import Alignment, ProvenanceAligner

__all__ = ["SYSTEMS", "Alignment", "MemlabSystem", "MemorySystem", "Message", "ProvenanceAligner", "SystemHit",
           "SystemReplyError", "SystemService", "session_messages"]
