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
import numbers
import types
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints, is_typeddict

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


def check_version(d: Mapping[str, Any], current: int, where: str, error: type[Exception] = ValueError) -> None:
    """A record read back carries ``schema`` (none: written before records were versioned, read as ``current``);
    another version is ``error`` naming ``where`` and both versions, never a record half understood."""
    version = d.get("schema", current)
    if version != current or type(version) is not int:
        raise error(f"{where}: schema version {version!r}; this memlab reads version {current}")


def _name(tp: Any) -> str:
    if tp is type(None):
        return "null"
    if tp is Any:
        return "anything"
    args, origin = get_args(tp), get_origin(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(_name(a) for a in args)
    if origin is Literal:
        return "one of " + ", ".join(map(repr, args))
    if origin is not None:
        return f"{origin.__name__}[{', '.join(_name(a) for a in args)}]"
    if is_typeddict(tp):
        return f"an object ({tp.__name__})"
    return {"str": "text", "int": "an integer", "float": "a number", "bool": "true/false"}.get(tp.__name__, tp.__name__)


def type_problem(value: Any, tp: Any, path: str) -> str | None:
    """Where ``value`` (as JSON reads it) is not of type ``tp``: ``path`` of the first bad value, what was expected
    and what it is; None when it fits. A `TypedDict` is checked key by key (keys it does not name are allowed)."""
    if tp is Any:
        return None
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, types.UnionType):
        problems = [type_problem(value, a, path) for a in args]
        if all(problems):
            return next((p for p in problems if not p.startswith(f"{path}:")), None) or \
                f"{path}: expected {_name(tp)}, got {type(value).__name__} {value!r:.60}"
        return None
    if origin is Literal:
        ok = value in args
    elif tp is type(None):
        ok = value is None
    elif tp is bool:
        ok = isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    elif tp is float:
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    elif tp is str:
        ok = isinstance(value, str)
    elif is_typeddict(tp):
        if not isinstance(value, dict):
            return f"{path}: expected {_name(tp)}, got {type(value).__name__} {value!r:.60}"
        hints = get_type_hints(tp)
        return next((p for k, v in value.items() if k in hints
                     and (p := type_problem(v, hints[k], f"{path}.{k}")) is not None), None)
    elif origin in (list, tuple) or tp in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return f"{path}: expected {_name(tp)}, got {type(value).__name__} {value!r:.60}"
        item = args[0] if args else Any
        return next((p for i, v in enumerate(value) if (p := type_problem(v, item, f"{path}[{i}]")) is not None), None)
    elif origin is dict or tp is dict:
        if not isinstance(value, dict):
            return f"{path}: expected {_name(tp)}, got {type(value).__name__} {value!r:.60}"
        kt, vt = args if args else (Any, Any)
        return next((p for k, v in value.items() if (p := type_problem(k, kt, f"{path} key {k!r}")
                                                     or type_problem(v, vt, f"{path}.{k}")) is not None), None)
    else:
        ok = isinstance(value, tp)
    return None if ok else f"{path}: expected {_name(tp)}, got {type(value).__name__} {value!r:.60}"


def check_types(cls: type, d: Mapping[str, Any], where: str, error: type[Exception] = ValueError) -> None:
    """Every value of ``d`` that names a field of dataclass ``cls`` is of the field's type, else ``error`` naming
    ``where`` (the file), the field (its path inside nested objects), what was expected and what is there."""
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in d and (problem := type_problem(d[f.name], hints[f.name], f.name)) is not None:
            raise error(f"{where}: field {problem}")
