"""A component's parameters, declared once: its constructor's keyword arguments (scikit-learn's convention).

Every family (extractors, embedders, keyword scorers, answer arms, judges, systems) reads the same
declaration: `param_specs` (name, default, type and the constraints written beside the parameter, as in
``k1: Annotated[float, Range(0, None, lo_open=True)] = 1.2``) feeds config validation (`check_params`),
``from_config`` (``cls(**params)``), the cache key (`cache_id`: class + parameters), copies (`clone`), the
run's recorded settings (`resolved_params`) and the CLI's help (`describe_params`). A constructor only stores
its arguments, each under its own name (``self.k1 = k1``), so `get_params` can read them back. The constraints
(`memlab.constraints`: `Range`, `OneOf`, `Pattern`, `PromptName`, `FolderWith`, and `Trust` for an endpoint, key or
file) are re-exported here; every setting of a shipped component carries one (a test walks them all).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import math
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

from memlab.constraints import (  # noqa: F401  (re-exported: declared beside the parameters they constrain)
    MODEL_NAME,
    SEED,
    FolderWith,
    OneOf,
    Pattern,
    PromptName,
    Range,
    Trust,
)


@runtime_checkable
class CacheIdentified(Protocol):
    """An object that names itself in cache keys and run.json (``cache_id()``): a component, a user's searcher or
    embedder object; checked with ``isinstance`` where a setting or a component is labelled."""

    def cache_id(self) -> str: ...


class _Required:
    def __repr__(self) -> str:
        return "<required>"


#: The default of a parameter the constructor requires.
REQUIRED: Any = _Required()
#: Between a part's name and its setting's (``reader__span``), as in scikit-learn.
SEP = "__"


class ParamError(ValueError):
    """A setting a component does not take, or a value it does not accept (the message names both; ``key``:
    the setting whose value is wrong, None for unknown names)."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key


#: Types a config file can give (YAML scalars, lists, mappings), with how an error names them.
_PLAIN_TYPES: dict[Any, str] = {bool: "true or false", int: "an integer", float: "a number", str: "a string",
                                list: "a list", tuple: "a list", dict: "a mapping"}


@dataclass(frozen=True)
class ParamSpec:
    """One constructor parameter: its name, default (`REQUIRED` when none), type and constraints."""

    name: str
    default: Any
    annotation: Any = Any
    constraints: tuple[Any, ...] = ()
    nested: type | None = None
    """The `Component` class the parameter holds when its class lists it in ``nested_params``
    (``reader: ExtractiveAnswerer | None``): a config gives that part's settings as ``reader__<setting>``
    (scikit-learn's ``comp__param``), never the object."""

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    def _types(self) -> tuple[list[Any], bool, tuple[Any, ...] | None]:
        """(the plain types allowed, whether None is allowed, the Literal choices if any)."""
        ann, optional, choices = self.annotation, self.default is None, None
        origin = typing.get_origin(ann)
        if origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(ann) if a is not type(None)]
            optional = optional or len(args) < len(typing.get_args(ann))
            ann = args[0] if len(args) == 1 else str if str in args else Any  # str | Path: a path as text
            origin = typing.get_origin(ann)
        if origin is Literal:
            choices = typing.get_args(ann)
            return [], optional, choices
        base = origin or ann
        if base in _PLAIN_TYPES:
            return [base], optional, None
        if ann is Any and self.default not in (None, REQUIRED) and type(self.default) in _PLAIN_TYPES:
            return [type(self.default)], optional, None  # unannotated: the default's type
        return [], optional, None

    @property
    def settable(self) -> bool:
        """Whether a config file can give it (a plain value, not an object such as a model client)."""
        plain, _, choices = self._types()
        return bool(plain) or choices is not None or (self.annotation is Any and self.default is None)

    def expected(self) -> str:
        plain, optional, choices = self._types()
        one_of = next((c for c in self.constraints if isinstance(c, OneOf)), None)
        if choices is not None or one_of is not None:
            want = f"one of {', '.join(map(str, choices if choices is not None else one_of.allowed()))}"
        else:
            want = " or ".join(_PLAIN_TYPES[t] for t in plain) or "a value"
            bounds = [c.text() for c in self.constraints if isinstance(c, Range) and c.text()]
            if bounds:
                want += " " + " and ".join(bounds)
            other = [c for c in self.constraints if hasattr(c, "text") and not isinstance(c, (Range, OneOf))]
            if len(other) > 1:  # a path that is also something more specific: the specific one says it
                other = [c for c in other if c != Trust.file]
            said = [c.text() for c in other]
            if said:
                want += f" ({'; '.join(said)})"
        return want + (" or null" if optional else "")

    def check(self, value: Any) -> Any:
        """The value as the constructor gets it (an int given for a float becomes a float); raises
        `ParamError` saying what is expected."""
        plain, optional, choices = self._types()
        if value is None:
            if optional:
                return None
            raise ParamError(f"expected {self.expected()}")
        if choices is not None and value not in choices:
            raise ParamError(f"expected {self.expected()}")
        if plain:
            t = plain[0]
            ok = isinstance(value, bool) if t is bool else \
                (isinstance(value, (int, float)) and not isinstance(value, bool)) if t is float else \
                (isinstance(value, int) and not isinstance(value, bool)) if t is int else \
                isinstance(value, (list, tuple)) if t in (list, tuple) else isinstance(value, t)
            if not ok or (t is float and not math.isfinite(value)):
                raise ParamError(f"expected {self.expected()}")
            if t is float:
                value = float(value)
        for c in self.constraints:
            if hasattr(c, "check") and c.check(value) is not None:
                raise ParamError(f"expected {self.expected()}")
        return value

    def describe(self) -> str:
        """``name: type = default (constraints)`` for the CLI's help."""
        default = "" if self.required else f" = {json.dumps(self.default, default=str)}"
        return f"{self.name}{default} ({self.expected()})"


@functools.cache
def _specs(cls: type) -> dict[str, ParamSpec]:
    init = cls.__init__
    if init is object.__init__:
        return {}
    try:
        hints = typing.get_type_hints(init, include_extras=True)
    except Exception:  # an annotation naming something only imported for type checking: types unchecked
        hints = {}
    out: dict[str, ParamSpec] = {}
    for p in list(inspect.signature(init).parameters.values())[1:]:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        ann, constraints = hints.get(p.name, Any), ()
        if typing.get_origin(ann) is typing.Annotated:
            ann, *meta = typing.get_args(ann)
            constraints = tuple(meta)
        default = REQUIRED if p.default is p.empty else p.default
        out[p.name] = ParamSpec(p.name, default, ann, constraints,
                                _part_class(cls, p.name, ann) if p.name in getattr(cls, "nested_params", ()) else None)
    return out


def _part_class(cls: type, name: str, ann: Any) -> type:
    """The `Component` class in a nested parameter's annotation (``ExtractiveAnswerer | None``)."""
    args = typing.get_args(ann) if typing.get_origin(ann) in (typing.Union, types.UnionType) else (ann,)
    found = next((a for a in args if isinstance(a, type) and issubclass(a, Component)), None)
    if found is None:
        raise TypeError(f"{cls.__qualname__}.nested_params names {name!r}, whose annotation {ann!r} names no "
                        "Component class to take its settings from")
    return found


def param_specs(cls: type) -> dict[str, ParamSpec]:
    """A class's parameters by name, read from its constructor's signature (and ``Annotated`` constraints)."""
    return dict(_specs(cls))


def fixed_params(cls: type) -> dict[str, str]:
    """The constructor parameters ``cls`` declares the run decides (`Component.fixed_params`: name -> the config
    key that decides it)."""
    return dict(getattr(cls, "fixed_params", None) or {})


def settable_specs(cls: type) -> dict[str, ParamSpec]:
    """The parameters a config's settings may give: plain values (`ParamSpec.settable`) the run does not decide
    (`fixed_params`)."""
    fixed = fixed_params(cls)
    return {n: s for n, s in _specs(cls).items() if s.settable and n not in fixed}


def trust_kinds(cls: type) -> dict[str, str]:
    """The parameters ``cls`` marks with `Trust` (name -> endpoint, secret or file)."""
    return {n: c.kind for n, s in _specs(cls).items() for c in s.constraints if isinstance(c, Trust)}


def secret_names(cls: type) -> tuple[str, ...]:
    """The parameters ``cls`` declares secrets (`Trust.secret`): never in a config, a cache id or run.json."""
    return tuple(n for n, k in trust_kinds(cls).items() if k == "secret")


def get_params(obj: Any, exclude: tuple[str, ...] = ()) -> dict[str, Any]:
    """The constructor's arguments as ``obj`` holds them (each stored under its own name), less ``exclude``;
    raises TypeError naming one that is not stored."""
    out: dict[str, Any] = {}
    for name in param_specs(type(obj)):
        if name in exclude:
            continue
        if not hasattr(obj, name):
            raise TypeError(f"{type(obj).__qualname__}: constructor argument {name!r} is not stored as self.{name}, "
                            "so its cache key and copies cannot cover it; store it under its own name, list it in "
                            "cache_exclude, or override cache_id()")
        out[name] = getattr(obj, name)
    return out


def check_params(cls: type, params: Mapping[str, Any] | None, what: str = "component") -> dict[str, Any]:
    """``params`` checked against ``cls``'s declaration: each a parameter a config can set, with an accepted
    value (returned as the constructor gets it); raises `ParamError` naming the setting, the value and what is
    expected, or the unknown names with the allowed ones."""
    specs = param_specs(cls)
    settable = list(settable_specs(cls))
    params = dict(params or {})
    fixed = fixed_params(cls)
    for k in params:
        if k in fixed:
            raise ParamError(f"{k} = {params[k]!r}; not a setting of {what}: the run gives it from {fixed[k]} "
                             f"(set that instead)", key=k)
    nested = {n: s.nested for n, s in specs.items() if s.nested is not None and n not in fixed}
    unknown = [k for k in params if k not in settable and k.partition(SEP)[0] not in nested]
    if unknown:
        inner = [f"{n}{SEP}<a setting of {c.__qualname__}>" for n, c in nested.items()]
        raise ParamError(f"unknown setting(s) {', '.join(map(repr, unknown))} for {what}; "
                         f"settings: {', '.join([*settable, *inner]) or '(none)'}")
    out = {}
    for n, cls_ in nested.items():  # ``reader__span``: checked against the part's own declaration
        part = {k[len(n) + len(SEP):]: v for k, v in params.items() if k.startswith(n + SEP)}
        if part:
            try:
                checked = check_params(cls_, part, f"{what}'s {n}")
            except ParamError as e:
                if e.key is not None:
                    raise ParamError(f"{n}{SEP}{e}", key=n + SEP + e.key) from None
                bad = [f"{n}{SEP}{k}" for k in part if k not in settable_specs(cls_)]
                raise ParamError(f"unknown setting(s) {', '.join(map(repr, bad))} for {what}; {n}{SEP}<setting> "
                                 f"takes a setting of {cls_.__qualname__}: {', '.join(settable_specs(cls_))}") from None
            out.update({f"{n}{SEP}{k}": v for k, v in checked.items()})
    for k, v in params.items():
        if SEP in k and k.partition(SEP)[0] in nested:
            continue
        try:
            out[k] = specs[k].check(v)
        except ParamError as e:
            raise ParamError(f"{k} = {v!r}; {e}", key=k) from None
    return out


def resolved_params(cls: type, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The settings a config gives ``cls`` with every other settable parameter's default, a part's
    (`ParamSpec.nested`) as ``part__setting`` (what run.json records)."""
    out = {n: s.default for n, s in settable_specs(cls).items() if not s.required}
    fixed = fixed_params(cls)
    for n, s in _specs(cls).items():
        if s.nested is not None and n not in fixed:
            out.update({f"{n}{SEP}{k}": v for k, v in resolved_params(s.nested).items()})
    out.update(params or {})
    return out


def construct(cls: type, params: Mapping[str, Any]) -> Any:
    """``cls(**params)`` with each part's ``part__setting`` keys made into that part (`ParamSpec.nested`): the
    part is built whenever the parameters name one of its settings."""
    specs = _specs(cls)
    plain: dict[str, Any] = {}
    parts: dict[str, dict[str, Any]] = {}
    for k, v in params.items():
        n, sep, rest = k.partition(SEP)
        if sep and n in specs and specs[n].nested is not None:
            parts.setdefault(n, {})[rest] = v
        else:
            plain[k] = v
    for n, sub in parts.items():
        plain[n] = construct(specs[n].nested, sub)
    return cls(**plain)


def describe_params(cls: type) -> str:
    """The settable parameters in one line, for the CLI's help (empty when there is none)."""
    fixed = fixed_params(cls)
    parts = [f"{n}{SEP}<setting> (a setting of {s.nested.__qualname__}: {', '.join(settable_specs(s.nested))})"
             for n, s in _specs(cls).items() if s.nested is not None and n not in fixed]
    return "; ".join([*(s.describe() for s in settable_specs(cls).values()), *parts])


def settings(section: Any, **from_fields: Any) -> dict[str, Any]:
    """A component's constructor settings from its config section: what the section's own fields give
    (``from_fields``), then its ``params`` (checked by `check_params` when the config was read)."""
    return {**from_fields, **(getattr(section, "params", None) or {})}


_PLAIN = re.compile(r"[\w.:/@+-]*")


def param_id(name: str, v: Any) -> str:
    """One setting as text in a cache id (plain strings as they are, others as JSON-like text)."""
    from memlab.llm import ModelClient, normalise_endpoint

    if isinstance(v, str):
        return v if _PLAIN.fullmatch(v) else json.dumps(v)
    if v is None or isinstance(v, (bool, int, float)):
        return json.dumps(v)
    if isinstance(v, CacheIdentified):
        return v.cache_id()
    if isinstance(v, ModelClient):
        return f"{v.model}@{normalise_endpoint(v.api_base) or 'provider'}"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(param_id(name, x) for x in v) + "]"
    if isinstance(v, dict):
        items = sorted(v.items(), key=lambda kv: str(kv[0]))
        return "{" + ",".join(f"{k}={param_id(name, x)}" for k, x in items) + "}"
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return f"{type(v).__qualname__}{param_id(name, dataclasses.asdict(v))}"
    if isinstance(v, (datetime, Enum)):
        return json.dumps(str(v))
    raise TypeError(f"setting {name}={v!r} ({type(v).__qualname__}) cannot be written into a cache key; list it "
                    "in cache_exclude or override cache_id()")


def spec_text(name: str, params: Mapping[str, Any] | None) -> str:
    """A registered name with settings as one string, ``bm25(k1=1.5,b=0.7)`` (values as JSON); the name alone
    without settings. `parse_spec` reads it back."""
    if not params:
        return name
    return f"{name}({','.join(f'{k}={json.dumps(v, sort_keys=True)}' for k, v in params.items())})"


_KEY = re.compile(r"\s*([A-Za-z_]\w*)\s*=\s*")


def parse_spec(text: str) -> tuple[str, dict[str, Any]]:
    """``name`` or ``name(k=<json>,...)`` -> (name, settings); raises ValueError naming the text."""
    if not text.endswith(")") or "(" not in text:
        return text, {}
    name, body = text[:-1].split("(", 1)
    params: dict[str, Any] = {}
    pos, dec = 0, json.JSONDecoder()
    while pos < len(body):
        m = _KEY.match(body, pos)
        if m is None:
            raise ValueError(f"{text!r}: expected name(key=value,...) with JSON values")
        try:
            params[m.group(1)], pos = dec.raw_decode(body, m.end())
        except json.JSONDecodeError as e:
            raise ValueError(f"{text!r}: {m.group(1)}: not a JSON value ({e.msg})") from None
        if pos < len(body):
            if body[pos] != ",":
                raise ValueError(f"{text!r}: expected ',' at {pos}")
            pos += 1
    return name, params


class Component:
    """What every registered component shares: parameters read from its constructor (`param_specs`), a copy
    with changes (`clone`), and a cache id naming what decides its output (class + parameters)."""

    #: Constructor arguments that do not decide the output (a key, a timeout): left out of `cache_id`.
    cache_exclude: tuple[str, ...] = ()
    #: Constructor arguments holding another component whose settings a config gives as ``name__setting`` (the
    #: offline reader of session-recall: ``reader__max_words``); checked, built (`construct`) and recorded as such.
    nested_params: ClassVar[tuple[str, ...]] = ()
    #: Constructor arguments the run decides from another config key (name -> that key, e.g. a judge's
    #: ``profile`` -> ``scoring.profile``): never a setting (`check_params` says where to set it instead); the
    #: builder passes the key's value.
    fixed_params: ClassVar[dict[str, str]] = {}

    @classmethod
    def param_specs(cls) -> dict[str, ParamSpec]:
        return param_specs(cls)

    def get_params(self, deep: bool = False) -> dict[str, Any]:
        """Every constructor argument as this instance holds it; ``deep``: each part's (`ParamSpec.nested`, a
        component it holds) as ``part__setting`` too, as scikit-learn spells them."""
        out = get_params(self)
        if deep:
            for name, v in list(out.items()):
                if isinstance(v, Component):
                    out.update({f"{name}{SEP}{k}": x for k, x in v.get_params(deep=True).items()})
        return out

    def cache_params(self) -> dict[str, Any]:
        """The parameters that decide the output (`get_params` less `cache_exclude` and any secret)."""
        return get_params(self, (*self.cache_exclude, *secret_names(type(self))))

    def clone(self, **changes: Any) -> Any:
        """A new, unfitted instance with the same parameters, ``changes`` applied (its twin when none)."""
        unknown = [k for k in changes if k not in param_specs(type(self))]
        if unknown:
            raise ParamError(f"{type(self).__qualname__}: no parameter {', '.join(unknown)}; parameters: "
                             f"{', '.join(param_specs(type(self)))}")
        return type(self)(**{**self.get_params(), **changes})

    def cache_id(self) -> str:
        """What, besides the data, decides the output: the class (its own ``name``, else module and qualified
        name: never a name inherited from a base) and its settings (`cache_params`)."""
        cls = type(self)
        ident = cls.__dict__.get("name") or f"{cls.__module__}.{cls.__qualname__}"
        params = self.cache_params()
        if not params:
            return ident
        return f"{ident}({','.join(param_id(k, v) for k, v in params.items())})"
