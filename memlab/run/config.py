"""Experiments as data: a dataclass tree that round-trips to YAML, validated with clear errors.

An *ablation* is a base config plus a ``grid`` of dotted keys to value lists, expanded into runs
(``retrieval.top_k: [5, 10, 20, 40]`` gives four configs).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from memlab.extract.reconcile import ReconcileConfig

EXTRACTORS = ("turns", "observations", "turns+observations", "llm")
BACKENDS = ("sqlite", "memory")
KEYWORDS = ("tfidf", "bm25")
ARMS = ("extractive", "long-context", "original", "optimized")
SPANS = ("novel", "clause", "memory")


class ConfigError(ValueError):
    """A config value is wrong (the message names the key and the allowed values)."""


@dataclass
class DatasetConfig:
    path: str | None = None
    conversations: list[str] | None = None
    categories: list[int] | None = None
    question_limit: int | None = None
    """At most this many questions per conversation (after the category filter), in file order."""


@dataclass
class ExtractionConfig:
    extractor: str = "observations"
    prompt: str = "structured"
    model: str | None = None
    turn_style: str = "speaker-context"
    reconcile: ReconcileConfig = field(default_factory=ReconcileConfig)
    job_timeout: float | None = None
    """Seconds one extraction job may take; None: the extractor role's timeout x (max_retries + 1) + 30."""


@dataclass
class StoreConfig:
    backend: str = "sqlite"


@dataclass
class IndexConfig:
    embedder: str = "tfidf-lsa"
    factory: str = "Flat"
    keyword: str = "tfidf"
    date_in_text: bool = True


@dataclass
class RetrievalConfig:
    top_k: int = 10
    hybrid: bool = True
    rrf_k: int = 60
    dedupe: bool = True
    kind_fallback: bool = True
    participant_boost: bool = False
    preload: int = 0


@dataclass
class AnswerConfig:
    arm: str = "extractive"
    prompt: str | None = None
    model: str | None = None
    max_rounds: int = 4
    span: str = "novel"
    abstain: bool = True
    speaker_window: int = 1


@dataclass
class JudgeConfig:
    model: str | None = None
    prompt: str = "default"


@dataclass
class RoleConfig:
    """One role's endpoint (``models.extractor``, ``.reader``, ``.judge``, ``.embedder``); unset keys
    fall back to ``models.*``. The role's model name stays where it was (``extraction.model``,
    ``answer.model``, ``judge.model``, ``index.embedder: litellm:<model>``)."""

    api_base: str | None = None
    api_key_env: str | None = None
    timeout: float | None = None
    max_retries: int | None = None
    concurrency: int | None = None
    context_window: int | None = None


ROLES = ("extractor", "reader", "judge", "embedder")
_ROLE_KEYS = ("api_base", "api_key_env", "timeout", "max_retries", "concurrency", "context_window")


@dataclass
class ModelsConfig:
    """Where model names resolve: a local OpenAI-compatible server (``api_base``) or a provider.

    ``concurrency``: requests in flight per endpoint (None: 1 for a local ``api_base``, unlimited for a
    provider); ``context_window``: tokens, checked before each call (None: what the server's
    ``/models`` states, else unchecked). Each role may override any of these.
    """

    api_base: str | None = None
    api_key_env: str | None = None
    timeout: float = 60.0
    max_retries: int = 3
    concurrency: int | None = None
    context_window: int | None = None
    extractor: RoleConfig = field(default_factory=RoleConfig)
    reader: RoleConfig = field(default_factory=RoleConfig)
    judge: RoleConfig = field(default_factory=RoleConfig)
    embedder: RoleConfig = field(default_factory=RoleConfig)

    def resolve(self, role: str) -> dict[str, Any]:
        """The role's endpoint settings, each from ``models.<role>`` when set, else from ``models``."""
        if role not in ROLES:
            raise ConfigError(f"models: unknown role {role!r}; roles: {', '.join(ROLES)}")
        r = getattr(self, role)
        return {k: getattr(r, k) if getattr(r, k) is not None else getattr(self, k) for k in _ROLE_KEYS}


@dataclass
class RunConfig:
    concurrency: int = 1
    seed: int = 0


@dataclass
class ExperimentConfig:
    name: str = "experiment"
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    extraction: ExtractionConfig = field(default_factory=ExtractionConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    index: IndexConfig = field(default_factory=IndexConfig)
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    answer: AnswerConfig = field(default_factory=AnswerConfig)
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    models: ModelsConfig = field(default_factory=ModelsConfig)
    run: RunConfig = field(default_factory=RunConfig)
    grid: dict[str, list[Any]] = field(default_factory=dict)

    # ----------------------------------------------------------------------------- YAML
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "config") -> ExperimentConfig:
        d = dict(d or {})
        if isinstance(d.get("judge"), str):  # the shorthand ``judge: litellm:<model>``
            spec = d["judge"]
            if not spec.startswith("litellm:") or len(spec) <= len("litellm:"):
                raise ConfigError(f"{where}: judge = {spec!r}; expected litellm:<model> or a judge section")
            d["judge"] = {"model": spec[len("litellm:"):]}
        cfg = _build(cls, d, where)
        cfg.validate(where)
        return cfg

    @classmethod
    def from_yaml(cls, path: str | Path) -> ExperimentConfig:
        p = Path(path)
        if not p.is_file():
            named = Path(__file__).resolve().parents[2] / "configs" / f"{path}.yaml"
            if named.is_file():
                p = named
            else:
                raise ConfigError(f"{path}: no such config file (nor configs/{path}.yaml)")
        try:
            d = yaml.safe_load(p.read_text(encoding="utf-8"))
        except yaml.YAMLError as e:
            raise ConfigError(f"{p}: not valid YAML ({e})") from e
        if not isinstance(d, dict):
            raise ConfigError(f"{p}: expected a mapping at the top, got {type(d).__name__}")
        return cls.from_dict(d, where=str(p))

    # ----------------------------------------------------------------------------- rules
    def validate(self, where: str = "config") -> None:
        def one_of(key: str, value: Any, allowed: tuple[Any, ...]) -> None:
            if value not in allowed:
                raise ConfigError(f"{where}: {key} = {value!r}; allowed: {', '.join(map(str, allowed))}")

        one_of("extraction.extractor", self.extraction.extractor, EXTRACTORS)
        one_of("store.backend", self.store.backend, BACKENDS)
        one_of("index.keyword", self.index.keyword, KEYWORDS)
        one_of("answer.arm", self.answer.arm, ARMS)
        one_of("answer.span", self.answer.span, SPANS)
        emb = self.index.embedder
        if emb not in ("tfidf-lsa", "minilm") and not (emb.startswith("litellm:") and len(emb) > 8):
            raise ConfigError(f"{where}: index.embedder = {emb!r}; allowed: tfidf-lsa, minilm, litellm:<model>")
        if self.extraction.extractor == "llm" and not self.extraction.model:
            raise ConfigError(f"{where}: extraction.model is required when extraction.extractor = 'llm'")
        if self.answer.arm != "extractive" and not self.answer.model:
            raise ConfigError(f"{where}: answer.model is required for answer.arm = {self.answer.arm!r}")
        ints = (("retrieval.top_k", self.retrieval.top_k, 1), ("retrieval.rrf_k", self.retrieval.rrf_k, 1),
                ("run.concurrency", self.run.concurrency, 1), ("answer.max_rounds", self.answer.max_rounds, 1))
        for key, v, lo in ints:
            if not isinstance(v, int) or v < lo:
                raise ConfigError(f"{where}: {key} = {v!r}; expected an integer >= {lo}")
        if self.retrieval.preload < -1:
            raise ConfigError(f"{where}: retrieval.preload = {self.retrieval.preload}; expected -1 (all), 0 (off) or N")
        if self.dataset.categories is not None:
            bad = [c for c in self.dataset.categories if c not in (1, 2, 3, 4, 5)]
            if bad:
                raise ConfigError(f"{where}: dataset.categories has {bad}; allowed: 1, 2, 3, 4, 5")
        self._validate_models(where)
        if self.extraction.job_timeout is not None and not self.extraction.job_timeout > 0:
            raise ConfigError(f"{where}: extraction.job_timeout = {self.extraction.job_timeout!r}; expected "
                              "seconds > 0 (or null: derived from the extractor's timeout)")
        for key in self.grid:
            get_dotted(self, key, where=f"{where}: grid")

    def _validate_models(self, where: str) -> None:
        limits: dict[str, tuple[int | None, str]] = {}
        for role in ROLES:
            r = self.models.resolve(role)
            for key, lo, kind in (("timeout", 0, float), ("max_retries", 0, int), ("concurrency", 1, int),
                                  ("context_window", 1, int)):
                v, src = r[key], f"models.{role}.{key}" if getattr(getattr(self.models, role), key) is not None \
                    else f"models.{key}"
                if v is None:
                    continue
                ok = (isinstance(v, (int, float)) and not isinstance(v, bool) and v > lo) if kind is float else \
                    (isinstance(v, int) and not isinstance(v, bool) and v >= lo)
                if not ok:
                    want = "seconds > 0" if kind is float else f"an integer >= {lo}"
                    raise ConfigError(f"{where}: {src} = {v!r}; expected {want}")
            base = r["api_base"]
            if base is not None and not (isinstance(base, str) and base.startswith(("http://", "https://"))):
                raise ConfigError(f"{where}: api_base of role {role} = {base!r}; expected an http(s):// URL")
            if base and self.role_in_use(role):
                prev = limits.get(base.rstrip("/"))
                if prev is not None and prev[0] != r["concurrency"]:
                    raise ConfigError(f"{where}: {base} has concurrency {prev[0]} for {prev[1]} but "
                                      f"{r['concurrency']} for {role}; one endpoint, one limit")
                limits[base.rstrip("/")] = (r["concurrency"], role)

    def role_in_use(self, role: str) -> bool:
        """Whether this config calls a model for the role."""
        return {"extractor": self.extraction.extractor == "llm" and bool(self.extraction.model),
                "reader": self.answer.arm != "extractive" and bool(self.answer.model),
                "judge": bool(self.judge.model),
                "embedder": self.index.embedder.startswith("litellm:")}[role]

    def describe_models(self) -> list[str]:
        """One line per role: its model and endpoint, and which local embedder runs when none is remote."""
        names = {"extractor": self.extraction.model, "reader": self.answer.model, "judge": self.judge.model,
                 "embedder": self.index.embedder[len("litellm:"):] if self.index.embedder.startswith("litellm:")
                 else None}
        lines = []
        for role in ROLES:
            r = self.models.resolve(role)
            if role == "embedder" and names[role] is None:
                remote = [x for x in ROLES if x != "embedder" and self.role_in_use(x) and self.models.resolve(x)[
                    "api_base"]]
                plural = len(remote) > 1
                note = (f"; the chat endpoint{'s' if plural else ''} of {', '.join(remote)} "
                        f"{'are' if plural else 'is'} not used for embeddings") if remote else ""
                lines.append(f"embedder: {self.index.embedder} (local, in this process){note}")
                continue
            if not self.role_in_use(role):
                continue
            where = r["api_base"] or "provider default endpoint"
            conc = r["concurrency"] if r["concurrency"] is not None else (1 if r["api_base"] and _local(
                r["api_base"]) else "unlimited")
            lines.append(f"{role}: {names[role]} at {where} (timeout {r['timeout']:g} s, max_retries "
                         f"{r['max_retries']}, concurrency {conc}, context window "
                         f"{r['context_window'] or 'from /models or unchecked'})")
        return lines

    # ----------------------------------------------------------------------------- edits
    def with_overrides(self, overrides: dict[str, Any] | list[str]) -> ExperimentConfig:
        """A copy with dotted-key overrides (``{"retrieval.top_k": 20}`` or ``["retrieval.top_k=20"]``)."""
        if isinstance(overrides, list):
            overrides = parse_sets(overrides)
        d = self.to_dict()
        for key, value in overrides.items():
            set_dotted_dict(d, key, value)
        return ExperimentConfig.from_dict(d, where="config with --set")

    def expand(self) -> list[ExperimentConfig]:
        """The runs of an ablation (a config without a grid is one run)."""
        if not self.grid:
            return [self]
        keys = list(self.grid)
        out = []
        for combo in itertools.product(*(self.grid[k] for k in keys)):
            c = self.with_overrides(dict(zip(keys, combo)))
            c.grid = {}
            c.name = self.name + "-" + "-".join(f"{k.split('.')[-1]}{v}" for k, v in zip(keys, combo))
            out.append(c)
        return out


def _local(api_base: str) -> bool:
    from urllib.parse import urlsplit

    host = (urlsplit(api_base).hostname or "").lower()
    return host in ("localhost", "::1", "0.0.0.0") or host.startswith("127.")


def _build(cls: type, d: dict[str, Any], where: str, prefix: str = "") -> Any:
    if not isinstance(d, dict):
        raise ConfigError(f"{where}: {prefix.rstrip('.') or 'config'}: expected a mapping, got {d!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - set(fields))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(prefix + u for u in unknown)}; "
                          f"allowed under {prefix.rstrip('.') or 'top level'}: {', '.join(fields)}")
    kw = {}
    for name, value in d.items():
        f = fields[name]
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default  # type: ignore
        if dataclasses.is_dataclass(default):
            kw[name] = _build(type(default), value or {}, where, f"{prefix}{name}.")
            continue
        kw[name] = _check_scalar(value, default, f"{prefix}{name}", where)
    try:
        return cls(**kw)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: {prefix.rstrip('.')}: {e}") from e


def _check_scalar(value: Any, default: Any, key: str, where: str) -> Any:
    if value is None or default is None:
        return value
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: {key} = {value!r}; expected true or false")
    elif isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: {key} = {value!r}; expected an integer")
    elif isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: {key} = {value!r}; expected a number")
        value = float(value)
    elif isinstance(default, str):
        if not isinstance(value, str):
            raise ConfigError(f"{where}: {key} = {value!r}; expected a string")
    return value


def get_dotted(cfg: Any, key: str, where: str = "config") -> Any:
    obj = cfg
    for part in key.split("."):
        if not dataclasses.is_dataclass(obj) or part not in {f.name for f in dataclasses.fields(obj)}:
            raise ConfigError(f"{where}: unknown key {key!r}")
        obj = getattr(obj, part)
    return obj


def set_dotted_dict(d: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    cur = d
    for p in parts[:-1]:
        if not isinstance(cur.get(p), dict):
            raise ConfigError(f"--set {key}: {p!r} is not a section; sections: "
                              f"{', '.join(k for k, v in cur.items() if isinstance(v, dict))}")
        cur = cur[p]
    if parts[-1] not in cur:
        raise ConfigError(f"--set {key}: unknown key {parts[-1]!r}; allowed: {', '.join(cur)}")
    cur[parts[-1]] = copy.deepcopy(value)


def parse_sets(items: list[str]) -> dict[str, Any]:
    """``key=value`` strings, values parsed as YAML (``20`` -> 20, ``true`` -> True, ``[1, 2]`` -> list)."""
    out = {}
    for it in items:
        if "=" not in it:
            raise ConfigError(f"--set {it!r}: expected key=value")
        k, v = it.split("=", 1)
        out[k.strip()] = yaml.safe_load(v)
    return out
