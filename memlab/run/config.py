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


@dataclass
class StoreConfig:
    backend: str = "sqlite"


@dataclass
class IndexConfig:
    embedder: str = "tfidf-lsa"
    factory: str = "Flat"
    keyword: str = "tfidf"
    date_in_text: bool = True
    append_citing: bool = False
    """Observation-aware keyword text: a dialog-turn record's text plus every memory citing that turn."""
    ef_search: int = 1024
    ef_construction: int = 128


@dataclass
class RetrievalConfig:
    top_k: int = 10
    hybrid: bool = True
    rrf_k: int = 60
    dedupe: bool = True
    kind_fallback: bool = True
    participant_boost: bool = False
    participant_boost_sigma: float = 1.0
    fusion: str = "rrf"
    fusion_weights: dict[str, float] | None = None
    unit: str = "memory"
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
class ModelsConfig:
    """Where model names resolve: a local OpenAI-compatible server (``api_base``) or a provider."""

    api_base: str | None = None
    api_key_env: str | None = None
    timeout: float = 60.0
    max_retries: int = 3


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
        from memlab.index.embedders import embedder_class, embedder_names
        from memlab.index.fusion import FUSIONS, check_weights

        emb = self.index.embedder
        try:
            embedder_class(emb)
        except ValueError:
            raise ConfigError(f"{where}: index.embedder = {emb!r}; allowed: {', '.join(embedder_names())}") from None
        one_of("retrieval.fusion", self.retrieval.fusion, tuple(FUSIONS))
        one_of("retrieval.unit", self.retrieval.unit, ("memory", "turn"))
        try:
            check_weights(self.retrieval.fusion_weights, "retrieval.fusion_weights")
        except ValueError as e:
            raise ConfigError(f"{where}: {e}") from None
        if self.retrieval.participant_boost_sigma < 0:
            raise ConfigError(f"{where}: retrieval.participant_boost_sigma = {self.retrieval.participant_boost_sigma}; "
                              "expected >= 0")
        if self.extraction.extractor == "llm" and not self.extraction.model:
            raise ConfigError(f"{where}: extraction.model is required when extraction.extractor = 'llm'")
        if self.answer.arm != "extractive" and not self.answer.model:
            raise ConfigError(f"{where}: answer.model is required for answer.arm = {self.answer.arm!r}")
        ints = (("retrieval.top_k", self.retrieval.top_k, 1), ("retrieval.rrf_k", self.retrieval.rrf_k, 1),
                ("run.concurrency", self.run.concurrency, 1), ("answer.max_rounds", self.answer.max_rounds, 1),
                ("index.ef_search", self.index.ef_search, 1), ("index.ef_construction", self.index.ef_construction, 1))
        for key, v, lo in ints:
            if not isinstance(v, int) or v < lo:
                raise ConfigError(f"{where}: {key} = {v!r}; expected an integer >= {lo}")
        if self.retrieval.preload < -1:
            raise ConfigError(f"{where}: retrieval.preload = {self.retrieval.preload}; expected -1 (all), 0 (off) or N")
        if self.dataset.categories is not None:
            bad = [c for c in self.dataset.categories if c not in (1, 2, 3, 4, 5)]
            if bad:
                raise ConfigError(f"{where}: dataset.categories has {bad}; allowed: 1, 2, 3, 4, 5")
        for key in self.grid:
            get_dotted(self, key, where=f"{where}: grid")

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
