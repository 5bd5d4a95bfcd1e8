"""Memory records: the typed entry, the per-user key, and the validation every write goes through."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

KINDS = ("fact", "episode")


class MemoryValidationError(ValueError):
    """A write was refused; nothing was stored."""


@dataclass(frozen=True, slots=True, order=True)
class UserKey:
    """Every read and write is scoped to one (app_name, user_id); nothing crosses keys."""

    app_name: str
    user_id: str

    def __post_init__(self) -> None:
        for name in ("app_name", "user_id"):
            v = getattr(self, name)
            if not isinstance(v, str) or not v:
                raise MemoryValidationError(f"UserKey.{name}: expected a non-empty string, got {v!r}")

    def __str__(self) -> str:
        return f"{self.app_name}/{self.user_id}"


@dataclass(frozen=True, slots=True)
class MemoryEntry:
    id: str
    key: UserKey
    text: str
    kind: str = "fact"
    topics: tuple[str, ...] = ()
    event_time: datetime | None = None
    participants: tuple[str, ...] = ()
    location: str | None = None
    source_ids: tuple[str, ...] = ()
    """Dialog ids (``D3:7``) the memory came from: what failure attribution follows back."""
    created_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    updated_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    superseded_at: datetime | None = None
    """Set when an update under the ``preserve-history`` policy replaced this memory: it stays in the
    store (history answers "when did X change" questions), marked with when and by which id."""
    superseded_by: str | None = None

    @property
    def superseded(self) -> bool:
        return self.superseded_at is not None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["key"] = {"app_name": self.key.app_name, "user_id": self.key.user_id}
        for k in ("event_time", "created_at", "updated_at", "superseded_at"):
            d[k] = None if d[k] is None else d[k].isoformat()
        for k in ("topics", "participants", "source_ids"):
            d[k] = list(d[k])
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MemoryEntry:
        def dt(v: str | None) -> datetime | None:
            return None if v is None else datetime.fromisoformat(v)

        return cls(
            id=d["id"],
            key=UserKey(**d["key"]),
            text=d["text"],
            kind=d["kind"],
            topics=tuple(d.get("topics") or ()),
            event_time=dt(d.get("event_time")),
            participants=tuple(d.get("participants") or ()),
            location=d.get("location"),
            source_ids=tuple(d.get("source_ids") or ()),
            created_at=dt(d["created_at"]),
            updated_at=dt(d["updated_at"]),
            superseded_at=dt(d.get("superseded_at")),
            superseded_by=d.get("superseded_by"),
        )

    def with_changes(self, **changes: Any) -> MemoryEntry:
        return replace(self, **changes)


def content_id(key: UserKey, text: str, kind: str, event_time: datetime | None) -> str:
    """Content-addressed id: the same memory written twice for one key is one entry."""
    payload = json.dumps([key.app_name, key.user_id, text, kind, event_time.isoformat() if event_time else None])
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:20]


def is_aware(dt: datetime) -> bool:
    return dt.tzinfo is not None and dt.tzinfo.utcoffset(dt) is not None


def _str_tuple(name: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        raise MemoryValidationError(f"{name}: expected a list of strings, got the string {value!r}")
    out = tuple(value)
    bad = [v for v in out if not isinstance(v, str) or not v.strip()]
    if bad:
        raise MemoryValidationError(f"{name}: expected non-empty strings, got {bad!r}")
    return out


def validate_fields(
    text: Any,
    kind: Any,
    topics: Any = (),
    event_time: Any = None,
    participants: Any = (),
    location: Any = None,
    source_ids: Any = (),
) -> dict[str, Any]:
    """Check and normalise the user-supplied fields of a memory; raises `MemoryValidationError`."""
    if not isinstance(text, str) or not text.strip():
        raise MemoryValidationError(f"text: expected non-empty text, got {text!r}")
    if kind not in KINDS:
        raise MemoryValidationError(f"kind: expected one of {KINDS}, got {kind!r}")
    if event_time is not None and not isinstance(event_time, datetime):
        raise MemoryValidationError(f"event_time: expected a datetime or None, got {type(event_time).__name__}")
    if location is not None and (not isinstance(location, str) or not location.strip()):
        raise MemoryValidationError(f"location: expected non-empty text or None, got {location!r}")
    return {
        "text": text.strip(),
        "kind": kind,
        "topics": _str_tuple("topics", topics),
        "event_time": event_time,
        "participants": _str_tuple("participants", participants),
        "location": location,
        "source_ids": tuple(dict.fromkeys(_str_tuple("source_ids", source_ids))),
    }


def check_time_awareness(new: datetime | None, existing: datetime | None, what: str) -> None:
    """Naive and timezone-aware datetimes cannot be compared: refuse mixing them within one key."""
    if new is None or existing is None:
        return
    if is_aware(new) != is_aware(existing):
        a = "timezone-aware" if is_aware(new) else "naive"
        b = "timezone-aware" if is_aware(existing) else "naive"
        raise MemoryValidationError(
            f"{what}: got a {a} datetime ({new.isoformat()}) but this key already holds {b} ones "
            f"({existing.isoformat()}); use one kind of datetime per user key"
        )
