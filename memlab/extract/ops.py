"""Memory operations an extractor proposes and the worker applies."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

ACTIONS = ("add", "update", "delete", "clear")


@dataclass(frozen=True)
class MemoryOp:
    action: str
    text: str = ""
    kind: str = "fact"
    topics: tuple[str, ...] = ()
    event_time: datetime | None = None
    participants: tuple[str, ...] = ()
    location: str | None = None
    memory_id: str | None = None
    source_ids: tuple[str, ...] = ()
    note: str = ""
    """Why the op looks as it does (e.g. ``reconcile: add->update (score 0.71)``)."""

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"MemoryOp.action: expected one of {ACTIONS}, got {self.action!r}")

    def with_changes(self, **kw: Any) -> MemoryOp:
        return replace(self, **kw)

    def add_kwargs(self) -> dict[str, Any]:
        return {"text": self.text, "kind": self.kind, "topics": self.topics, "event_time": self.event_time,
                "participants": self.participants, "location": self.location, "source_ids": self.source_ids}

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.action, "text": self.text, "kind": self.kind, "topics": list(self.topics),
                "event_time": self.event_time.isoformat() if self.event_time else None,
                "participants": list(self.participants), "location": self.location,
                "memory_id": self.memory_id, "source_ids": list(self.source_ids), "note": self.note}


@dataclass
class ExtractionResult:
    ops: list[MemoryOp] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    """One reason per malformed proposal that was dropped (the rest still apply)."""
    usage: Any = None
    calls: int = 0
    malformed_tool_calls: int = 0
    """Tool calls the model wrote as text (recovered by parsing or a forced re-ask)."""
    verbatim: list[MemoryOp] = field(default_factory=list)
    """Adds written as they are, before ``ops`` and never reconciled: the verbatim dialog turns of an extractor
    that keeps them beside its own memories (``turns+llm``)."""
