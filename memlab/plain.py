"""Dataclass records as plain dicts, without `dataclasses.asdict`'s deep copies, and back (`from_fields`).

`asdict` deep-copies every leaf value; a run writes four records per question (predictions and trace lines
holding lists of hit dicts), and those copies were the largest single cost of an offline LoCoMo-10 run
(asdict and deepcopy: about a third of the answering stage's CPU). The records are serialised at once, so
containers are rebuilt (nested dataclasses become dicts, as with `asdict`) but leaf values are shared.

The walk itself visits every value of every trace line (~1.7 M calls in an offline LoCoMo-10 run), so exact
leaf types, plain dicts and lists take a fast path (no `dataclasses.is_dataclass` per value) and a dataclass
type's field names are looked up once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")

_LEAVES = frozenset({str, int, float, bool, type(None)})
_FIELD_NAMES: dict[type, tuple[str, ...] | None] = {}
_FIELD_SETS: dict[type, frozenset[str]] = {}


def _field_names(t: type) -> tuple[str, ...] | None:
    """The field names of dataclass type ``t`` in order (None: not a dataclass), looked up once per type."""
    try:
        return _FIELD_NAMES[t]
    except KeyError:
        names = tuple(f.name for f in dataclasses.fields(t)) if dataclasses.is_dataclass(t) else None
        _FIELD_NAMES[t] = names
        return names


def plain(value: Any) -> Any:
    """``value`` with every nested dataclass instance turned into a dict of its fields (field order kept),
    lists, tuples and dicts rebuilt around the converted items, anything else returned as is."""
    t = type(value)
    if t in _LEAVES:
        return value
    if t is dict:
        return {k: v if type(v) in _LEAVES else plain(v) for k, v in value.items()}
    if t is list:
        return [v if type(v) in _LEAVES else plain(v) for v in value]
    names = None if isinstance(value, type) else _field_names(t)
    if names is not None:
        return {n: plain(getattr(value, n)) for n in names}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, tuple):
        return type(value)(*(plain(v) for v in value)) if hasattr(value, "_fields") else tuple(plain(v) for v in value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def from_fields(cls: type[T], d: Mapping[str, Any], where: str, error: type[Exception] = ValueError) -> T:
    """``cls(**d)`` for a dataclass read back from a file, strictly: a key that is not one of its fields or a
    missing required field raises ``error`` naming ``where`` (the file, line or record), the class and the
    fields, never a bare TypeError."""
    names = _field_names(cls)  # looked up once per class: a run's traces read ~100,000 records
    if names is None:
        raise error(f"{where}: {cls.__name__} is not a dataclass")
    known = _FIELD_SETS.get(cls)
    if known is None:
        known = _FIELD_SETS[cls] = frozenset(names)
    if not known.issuperset(d):
        unknown = sorted(set(d).difference(names))
        raise error(f"{where}: unknown field(s) {unknown} for {cls.__name__}; its fields: {', '.join(names)}")
    try:
        return cls(**d)
    except TypeError as e:
        raise error(f"{where}: {cls.__name__}: {e}") from None
