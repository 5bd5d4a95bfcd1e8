"""Experiments as data: a dataclass tree that round-trips to YAML, validated with clear errors.

An *ablation* is a base config plus a ``grid`` of dotted keys to value lists, expanded into runs
(``retrieval.top_k: [5, 10, 20, 40]`` gives four configs). Component names (extractor, answer arm,
judge, embedder, keyword scorer) are validated against their registries, so a new component is
allowed as soon as its class is registered. Shipped configs are package data (``memlab/configs``).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from memlab.answer import ANSWERERS, JUDGES
from memlab.answer.extractive import SPANS
from memlab.eval.profiles import PROFILES
from memlab.extract.extractors import EXTRACTORS
from memlab.extract.policy import POLICIES
from memlab.extract.reconcile import ReconcileConfig
from memlab.index.embedders import embedder_model, parse_embedder_spec, spec_forms
from memlab.index.keyword import KEYWORD_SCORERS
from memlab.memory.search_types import SearchOptions
from memlab.params import ParamError, check_params, spec_text
from memlab.prompts import load_prompt
from memlab.systems import SYSTEMS

BACKENDS = ("sqlite", "memory")
SPLITS = ("sentence", "clause")
COMBINES = ("all", "any")
EXECUTORS = ("local", "ray")
#: A run name becomes a folder under the results root: no separators, no leading dot, at most
#: `MAX_NAME` characters (the folder adds a timestamp; file systems stop at 255 bytes).
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+=-]*$")
MAX_NAME = 120
#: Largest ``retrieval.top_k``: more than any LoCoMo conversation holds memories; a larger value would
#: silently read a whole store into one prompt.
MAX_TOP_K = 10_000
#: Seeds go to numpy's generators: an unsigned 32-bit integer.
MAX_SEED = 2**32 - 1
#: FAISS factory strings memlab builds (FAISS aborts the process on some malformed ones, e.g.
#: ``HNSW0``, so they are checked here before any index is built).
_FACTORY = re.compile(r"^(Flat|HNSW[1-9][0-9]*(,Flat)?|IVF[1-9][0-9]*,(Flat|PQ[1-9][0-9]*)|PQ[1-9][0-9]*|LSH)$")


class ConfigError(ValueError):
    """A config value is wrong (the message names the key and the allowed values)."""


@dataclass
class DatasetConfig:
    path: str | None = None
    conversations: list[str] | None = None
    """Sample ids (``[conv-26, conv-30]``; a single id is read as a one-item list)."""
    categories: list[int] | None = None
    question_limit: int | None = None
    """At most this many questions per conversation (after the category filter), in file order."""

    def __post_init__(self) -> None:
        if isinstance(self.conversations, str):
            self.conversations = [self.conversations]
        if isinstance(self.categories, int) and not isinstance(self.categories, bool):
            self.categories = [self.categories]


@dataclass
class CheckerConfig:
    """DESIGN's checkers: extract when the delta has *more than* ``message_threshold`` messages and/or
    more than ``time_interval_s`` passed since the last extraction; ``combine`` is all (AND) or any
    (OR). No checker set: every job extracts."""

    message_threshold: int | None = None
    time_interval_s: float | None = None
    combine: str = "all"


@dataclass
class WorkerConfig:
    """The extraction queue: W workers (a user's jobs stay on one), capacity, per-job timeout."""

    workers: int = 1
    capacity: int = 10
    job_timeout_s: float | None = None
    """None: 30 s for a model-free extractor; for a model one its call timeout x (max_retries + 1) + 30 s,
    so a slow local model's retries fit in one job (see `job_timeout`)."""


@dataclass
class ExtractionConfig:
    extractor: str = "observations"
    prompt: str = "structured"
    model: str | None = None
    turn_style: str = "speaker-context"
    policy: str = "merge-similar"
    """Update policy (`memlab.extract.policy`): merge-similar | preserve-history | append-only."""
    reconcile: ReconcileConfig = field(default_factory=ReconcileConfig)
    checkers: CheckerConfig = field(default_factory=CheckerConfig)
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    params: dict[str, Any] = field(default_factory=dict)
    """The extractor's constructor settings by name (`memlab.params`), over what the fields above give it."""


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
    sparse: str | None = None
    """A second lexical list over the same keyword texts (a keyword scorer name, e.g. ``splade``), fused as
    ``sparse``."""
    session_text: bool = False
    """Also score each dialog-turn record by BM25 over its whole session (the records sharing its event time,
    joined), fused as the ``session`` list: a turn in the session the question is about ranks up. Meant for
    ``retrieval.fusion: zscore`` (a session's turns tie in this list)."""
    ef_search: int = 1024
    ef_construction: int = 128
    embedder_params: dict[str, Any] = field(default_factory=dict)
    """The embedder's constructor settings by name (`memlab.params`; ``litellm:<model>`` is its ``model``)."""
    keyword_params: dict[str, Any] = field(default_factory=dict)
    """The keyword scorer's constructor settings by name (the index names it ``bm25(k1=1.5)``)."""

    def embedder_model(self) -> str | None:
        """The model a model-backed embedder calls (None: the embedder runs in this process)."""
        return embedder_model(self.embedder, self.embedder_params)

    def service_params(self) -> dict[str, Any]:
        """This section as `memlab.index.open_service` keywords (every index the run builds reads them here);
        the embedder's settings travel apart (`memlab.run.clients.Clients.embedder_params`)."""
        return {"embedder": self.embedder, "index": self.factory, "keyword": spec_text(self.keyword,
                                                                                       self.keyword_params),
                "date_in_text": self.date_in_text, "append_citing": self.append_citing, "sparse": self.sparse,
                "session_text": self.session_text, "ef_search": self.ef_search, "ef_construction": self.ef_construction}


@dataclass
class RetrievalConfig:
    """Search options of the answering stage; every field but ``top_k`` (``max_results``) and
    ``preload`` maps to the `SearchOptions` field of the same name."""

    top_k: int = 10
    """Memories per question, 1 to `MAX_TOP_K`."""
    hybrid: bool = True
    rrf_k: int = 60
    dedupe: bool = True
    kind_fallback: bool = True
    participant_boost: bool = False
    participant_boost_sigma: float = 1.0
    fusion: str = "rrf"
    fusion_weights: dict[str, float] | None = None
    unit: str = "memory"
    keyword_only: bool = False
    feedback: int = 0
    similarity_threshold: float | None = None
    order_by_event_time: bool = False
    preload: int = 0
    include_superseded: bool = True
    """Whether answering searches memories superseded under ``extraction.policy: preserve-history``."""

    def search_options(self) -> SearchOptions:
        names = {f.name for f in dataclasses.fields(SearchOptions)}
        same = {k: v for k, v in dataclasses.asdict(self).items() if k in names}
        return SearchOptions(max_results=self.top_k, **same)


@dataclass
class AnswerConfig:
    arm: str = "extractive"
    prompt: str | None = None
    model: str | None = None
    max_rounds: int = 4
    # the extractive reader's knobs (memlab.answer.extractive)
    span: str = "novel"
    abstain: bool = True
    recall_unit: str = "session"
    """session-recall: load whole ``session``s around the top turn hits, or a ``window`` of turns."""
    recall_window: int = 3
    """session-recall, ``recall_unit: window``: turns loaded either side of each hit."""
    recall_max: int = 3
    """session-recall: at most this many sessions (or windows) loaded into the prompt."""
    temporal_window: int | None = None
    """Ranks a time question's answer may come from (None: every retrieved memory)."""
    span_window: int | None = None
    """Ranks a span may come from (None: every retrieved memory)."""
    max_words: int = 12
    split: str = "sentence"
    drop_filler: bool = True
    list_spans: int = 3
    # the extractive reader's weights: None = the fitted default (memlab.answer.reader_weights)
    rank_weight: float | None = None
    memory_weight: float | None = None
    agreement_weight: float | None = None
    speaker_weight: float | None = None
    date_weight: float | None = None
    length_weight: float | None = None
    phrase_bonus: float | None = None
    temporal_rank_weight: float | None = None
    abstain_margin: float | None = None
    params: dict[str, Any] = field(default_factory=dict)
    """The arm's constructor settings by name (`memlab.params`), over what the fields above give it."""


@dataclass
class JudgeConfig:
    model: str | None = None
    prompt: str = "default"
    """A name under memlab/prompts/judge/ (default, generous, strict) or a file path."""
    kind: str = "llm"
    repeats: int = 1
    """Ask the judge this many times per question (each repeat cached apart); J = the mean verdict."""
    temperature: float = 0.0


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
class ScoringConfig:
    """How answers are scored: a harness profile (`memlab.eval.profiles`) and an optional errata CSV."""

    profile: str = "locomo"
    errata: str | None = None


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
class CostConfig:
    prices: str | None = None
    """A price table (YAML or CSV, USD per million tokens) overriding litellm's bundled map."""


@dataclass
class SystemConfig:
    """The memory system the arms search (`memlab.systems`): ``memlab`` (this pipeline, from the sections
    above) or an adapter such as ``mem0``, built with ``params``."""

    name: str = "memlab"
    params: dict[str, Any] | None = None


@dataclass
class RunConfig:
    concurrency: int = 1
    seed: int = 0
    """Seeds everything random in a run (the bootstrap of the summary's confidence intervals); 0 to 2**32 - 1."""
    max_error_rate: float = 0.0
    """The CLI exits non-zero when more than this share of questions ended in an error."""
    allow_failed_extraction: bool = False
    """Answer even when an extraction job failed or a conversation with text got no memory."""
    check_endpoint: bool = True
    """Before answering, check that each model endpoint (``api_base``) answers ``/models``."""
    executor: str = "local"
    """``local`` (this process) or ``ray`` ((grid cell x conversation) tasks on a Ray cluster)."""
    ray_address: str | None = None
    """Ray cluster to join (``auto``, ``ray://host:10001``); unset: start a local Ray instance."""
    ray_max_retries: int = 2
    """A Ray task that failed or lost its worker is retried this many times, then its questions are errors."""
    threads: int | None = None
    """Threads of every native pool (torch, OpenMP/BLAS, FAISS; `memlab.threads`); null: the cores available to
    the process. A Ray task gets the CPUs Ray assigned it, at most this."""


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
    scoring: ScoringConfig = field(default_factory=ScoringConfig)
    models: ModelsConfig = field(default_factory=ModelsConfig)
    run: RunConfig = field(default_factory=RunConfig)
    cost: CostConfig = field(default_factory=CostConfig)
    system: SystemConfig = field(default_factory=SystemConfig)
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
        if isinstance(d.get("answer"), dict) and "speaker_window" in d["answer"]:  # removed with the fitted reader
            d["answer"] = dict(d["answer"])
            if d["answer"].pop("speaker_window") not in (None, 1):  # 1: what every older run folder recorded
                raise ConfigError(f"{where}: answer.speaker_window was removed: the offline reader's abstain test "
                                  "reads the whole context; tune answer.abstain_margin instead")
        cfg = _build(cls, d, where)
        cfg.validate(where)
        return cfg

    @classmethod
    def from_yaml(cls, path: str | Path) -> ExperimentConfig:
        """A config file, or a name: ``./configs/<name>.yaml`` first, then the shipped configs."""
        p = Path(path)
        if p.is_file():
            where, text = str(p), p.read_text(encoding="utf-8")
        elif (Path("configs") / f"{path}.yaml").is_file():
            p = Path("configs") / f"{path}.yaml"
            where, text = str(p), p.read_text(encoding="utf-8")
        elif str(path) in shipped_configs():
            res = resources.files("memlab.configs").joinpath(f"{path}.yaml")
            where, text = f"memlab/configs/{path}.yaml", res.read_text(encoding="utf-8")
        else:
            raise ConfigError(f"{path}: no such config file, no ./configs/{path}.yaml, and no shipped config of "
                              f"that name; shipped: {', '.join(shipped_configs())}")
        try:
            d = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"{where}: not valid YAML ({e})") from e
        if not isinstance(d, dict):
            raise ConfigError(f"{where}: expected a mapping at the top, got {type(d).__name__}")
        return cls.from_dict(d, where=where)

    # ----------------------------------------------------------------------------- rules
    def validate(self, where: str = "config") -> None:
        def one_of(key: str, value: Any, allowed: tuple[Any, ...]) -> None:
            if value not in allowed:
                raise ConfigError(f"{where}: {key} = {value!r}; allowed: {', '.join(map(str, allowed))}")

        check_name(self.name, where)
        one_of("extraction.extractor", self.extraction.extractor, EXTRACTORS.names())
        one_of("extraction.policy", self.extraction.policy, POLICIES)
        one_of("store.backend", self.store.backend, BACKENDS)
        one_of("index.keyword", self.index.keyword, KEYWORD_SCORERS.names())
        if self.index.sparse is not None:
            one_of("index.sparse", self.index.sparse, KEYWORD_SCORERS.names())
        one_of("answer.arm", self.answer.arm, ANSWERERS.names())
        one_of("system.name", self.system.name, SYSTEMS.names())
        if self.system.name != "memlab" and self.run.executor != "local":
            raise ConfigError(f"{where}: system.name = {self.system.name!r} runs on the local executor only "
                              f"(run.executor = {self.run.executor!r})")
        one_of("judge.kind", self.judge.kind, JUDGES.names())
        one_of("answer.span", self.answer.span, SPANS)
        one_of("answer.recall_unit", self.answer.recall_unit, ("session", "window"))
        from memlab.index.fusion import FUSIONS, check_weights

        one_of("retrieval.fusion", self.retrieval.fusion, tuple(FUSIONS))
        one_of("retrieval.unit", self.retrieval.unit, ("memory", "turn"))
        try:
            check_weights(self.retrieval.fusion_weights, "retrieval.fusion_weights")
        except ValueError as e:
            raise ConfigError(f"{where}: {e}") from None
        if self.retrieval.participant_boost_sigma < 0:
            raise ConfigError(f"{where}: retrieval.participant_boost_sigma = {self.retrieval.participant_boost_sigma}; "
                              "expected >= 0")
        one_of("scoring.profile", self.scoring.profile, tuple(PROFILES))
        one_of("answer.split", self.answer.split, SPLITS)
        one_of("run.executor", self.run.executor, EXECUTORS)
        one_of("extraction.checkers.combine", self.extraction.checkers.combine, COMBINES)
        self._validate_settings(where)
        if not _FACTORY.match(self.index.factory):
            raise ConfigError(f"{where}: index.factory = {self.index.factory!r}; expected a FAISS factory string "
                              f"memlab builds: Flat, HNSW<M> (M >= 1), IVF<n>,Flat, IVF<n>,PQ<m>, PQ<m> or LSH")
        prompts = [("answer", "answer.prompt", self.answer.prompt), ("judge", "judge.prompt", self.judge.prompt)]
        if EXTRACTORS.get(self.extraction.extractor).requires_model:
            prompts.append(("extract", "extraction.prompt", self.extraction.prompt))
        for stage, key, name in prompts:
            if name is not None:
                try:
                    load_prompt(stage, name)
                except FileNotFoundError as e:
                    raise ConfigError(f"{where}: {key} = {name!r}: {e}") from None
        if EXTRACTORS.get(self.extraction.extractor).requires_model and not self.extraction.model:
            raise ConfigError(f"{where}: extraction.model is required when extraction.extractor = "
                              f"{self.extraction.extractor!r}")
        if ANSWERERS.get(self.answer.arm).requires_model and not self.answer.model:
            raise ConfigError(f"{where}: answer.model is required for answer.arm = {self.answer.arm!r}")
        ints = (("retrieval.top_k", self.retrieval.top_k, 1), ("retrieval.rrf_k", self.retrieval.rrf_k, 1),
                ("run.concurrency", self.run.concurrency, 1),
                ("run.ray_max_retries", self.run.ray_max_retries, 0), ("answer.max_rounds", self.answer.max_rounds, 1),
                ("models.max_retries", self.models.max_retries, 0), ("retrieval.feedback", self.retrieval.feedback, 0),
                ("extraction.worker.workers", self.extraction.worker.workers, 1),
                ("extraction.worker.capacity", self.extraction.worker.capacity, 1),
                ("answer.max_words", self.answer.max_words, 1), ("judge.repeats", self.judge.repeats, 1),
                ("answer.recall_window", self.answer.recall_window, 0),
                ("answer.recall_max", self.answer.recall_max, 1),
                ("index.ef_search", self.index.ef_search, 1), ("index.ef_construction", self.index.ef_construction, 1),
                ("run.seed", self.run.seed, 0))
        for key, v in (("answer.temporal_window", self.answer.temporal_window),
                       ("answer.span_window", self.answer.span_window)):
            if v is not None:
                ints += ((key, v, 1),)
        if self.dataset.question_limit is not None:
            ints += (("dataset.question_limit", self.dataset.question_limit, 1),)
        if self.run.threads is not None:
            ints += (("run.threads", self.run.threads, 1),)
        if self.extraction.checkers.message_threshold is not None:
            ints += (("extraction.checkers.message_threshold", self.extraction.checkers.message_threshold, 0),)
        for key, v, lo in ints:
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ConfigError(f"{where}: {key} = {v!r}; expected an integer >= {lo}")
        for key, v, hi in (("retrieval.top_k", self.retrieval.top_k, MAX_TOP_K), ("run.seed", self.run.seed, MAX_SEED)):
            if v > hi:
                raise ConfigError(f"{where}: {key} = {v!r}; expected an integer <= {hi}")
        if not 0.0 <= self.run.max_error_rate <= 1.0:
            raise ConfigError(f"{where}: run.max_error_rate = {self.run.max_error_rate!r}; expected a share in [0, 1]")
        positive = (("models.timeout", self.models.timeout),
                    ("extraction.worker.job_timeout_s", self.extraction.worker.job_timeout_s),
                    ("extraction.checkers.time_interval_s", self.extraction.checkers.time_interval_s))
        for key, v in positive:
            if v is not None and not v > 0:
                raise ConfigError(f"{where}: {key} = {v!r}; expected a number > 0")
        if self.dataset.conversations is not None and not all(isinstance(c, str) for c in self.dataset.conversations):
            raise ConfigError(f"{where}: dataset.conversations = {self.dataset.conversations!r}; expected sample ids "
                              f"(strings, e.g. [conv-26])")
        if self.retrieval.preload < -1:
            raise ConfigError(f"{where}: retrieval.preload = {self.retrieval.preload}; expected -1 (all), 0 (off) or N")
        if self.dataset.categories is not None:
            # 1-5: LoCoMo's numbers; 6, 7: LongMemEval's (memlab.data.longmemeval numbers its types 1-7)
            bad = [c for c in self.dataset.categories if isinstance(c, bool) or c not in range(1, 8)]
            if bad:
                raise ConfigError(f"{where}: dataset.categories has {bad}; allowed: 1-5 (LoCoMo), 1-7 (LongMemEval)")
        self._validate_models(where)
        for key in self.grid:
            get_dotted(self, key, where=f"{where}: grid")

    def _validate_settings(self, where: str) -> None:
        """Each component's settings (``extraction.params``, ``answer.params``, ``index.embedder_params``,
        ``index.keyword_params``, ``system.params``) against its class's declared parameters
        (`memlab.params.check_params`)."""
        idx = self.index
        named = (("extraction.params", EXTRACTORS, self.extraction.extractor, self.extraction.params),
                 ("answer.params", ANSWERERS, self.answer.arm, self.answer.params),
                 ("index.keyword_params", KEYWORD_SCORERS, idx.keyword, idx.keyword_params),
                 ("index.embedder_params", None, idx.embedder, idx.embedder_params),
                 ("system.params", SYSTEMS, self.system.name,
                  {} if self.system.params is None else self.system.params))
        for key, registry, name, params in named:
            if not isinstance(params, dict):
                raise ConfigError(f"{where}: {key} = {params!r}; expected a mapping of setting names to values")
            try:
                if registry is None:
                    checked = parse_embedder_spec(name, params, complete=True)[1]
                    checked = {k: checked[k] for k in params}  # the spec's own setting stays in the spec
                else:
                    checked = check_params(registry.get(name), params, f"{registry.family} {name!r}")
                params.update(checked)  # as the constructor gets them (2 for a float is 2.0): one cache key
            except ParamError as e:
                raise ConfigError(f"{where}: {key}.{e}" if e.key else f"{where}: {key}: {e}") from None
            except ValueError as e:
                raise ConfigError(f"{where}: index.embedder = {name!r}; allowed: {spec_forms()} ({e})") from None

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
        return {"extractor": EXTRACTORS.get(self.extraction.extractor).requires_model and bool(self.extraction.model),
                "reader": ANSWERERS.get(self.answer.arm).requires_model and bool(self.answer.model),
                "judge": bool(self.judge.model),
                "embedder": self.index.embedder_model() is not None}[role]

    def trust_settings(self) -> dict[str, Any]:
        """What decides where requests and secrets go: each model role's endpoint and key variable, and the prompt
        files in use (a resume uses them only when this user started the run with them or confirms them)."""
        out: dict[str, Any] = {}
        for role in ROLES:
            if self.role_in_use(role):
                r = self.models.resolve(role)
                out.update({f"models.{role}.{k}": r[k] for k in ("api_base", "api_key_env") if r[k] is not None})
        for key, value, role in (("extraction.prompt", self.extraction.prompt, "extractor"),
                                 ("answer.prompt", self.answer.prompt, "reader"),
                                 ("judge.prompt", self.judge.prompt, "judge")):
            if value is not None and self.role_in_use(role) and ("/" in value or Path(value).suffix):
                out[key] = value  # a file path (a shipped prompt is a bare name)
        return out

    def describe_models(self) -> list[str]:
        """One line per role: its model and endpoint, and which local embedder runs when none is remote."""
        names = {"extractor": self.extraction.model, "reader": self.answer.model, "judge": self.judge.model,
                 "embedder": self.index.embedder_model()}
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
            c.name = self.name + "-" + "-".join(f"{k.split('.')[-1]}{slug(v)}" for k, v in zip(keys, combo))
            check_name(c.name, f"grid point {dict(zip(keys, combo))!r}")
            out.append(c)
        return out


def check_name(name: Any, where: str = "config") -> None:
    """A run name (it becomes a folder under the results root) or a `ConfigError` saying what is expected."""
    if not isinstance(name, str) or not _NAME.match(name) or len(name) > MAX_NAME:
        raise ConfigError(f"{where}: name = {name!r}; expected at most {MAX_NAME} letters, digits and . _ + = - (it "
                          f"names a folder under the results root: no path separators, no leading dot)")


def slug(value: Any, limit: int = 40) -> str:
    """A grid value as part of a run name: characters other than letters, digits and ``. _ + = -`` become ``_``
    (a value such as ``../../x`` can never make a path), at most ``limit`` characters; a value changed on the
    way gets a short hash of itself, so two values never share a name (``openai/m`` -> ``openai_m_1c2f3a``)."""
    raw = str(value)
    text = re.sub(r"[^A-Za-z0-9._+=-]+", "_", raw).strip("._")[:limit]
    if text == raw:
        return text
    import hashlib

    return f"{text}_{hashlib.sha256(raw.encode()).hexdigest()[:6]}".lstrip("_")


def _local(api_base: str) -> bool:
    from urllib.parse import urlsplit

    host = (urlsplit(api_base).hostname or "").lower()
    return host in ("localhost", "::1", "0.0.0.0") or host.startswith("127.")


def shipped_configs() -> list[str]:
    """Names of the configs shipped in the package (``memlab run <name>``)."""
    return sorted(p.name[:-5] for p in resources.files("memlab.configs").iterdir() if p.name.endswith(".yaml"))


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
        kw[name] = _check_scalar(value, default, f"{prefix}{name}", where, f.type)
    try:
        return cls(**kw)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: {prefix.rstrip('.')}: {e}") from e


#: What a field whose default is None holds, from its annotation (``str | None`` -> a string).
_OPTIONAL = {"str": (str, "a string"), "int": (int, "an integer"), "float": ((int, float), "a number"),
             "list[str]": ((list, str), "a list"), "list[int]": ((list, int), "a list"),
             "dict[str, float]": (dict, "a mapping"), "dict[str, Any]": (dict, "a mapping")}


def _check_scalar(value: Any, default: Any, key: str, where: str, annotation: Any = None) -> Any:
    if value is None:
        return value
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{where}: {key} = {value!r}; expected a finite number")
    if default is None:
        want = _OPTIONAL.get(str(annotation).replace(" | None", "").strip())
        if want is not None and (isinstance(value, bool) or not isinstance(value, want[0])):
            raise ConfigError(f"{where}: {key} = {value!r}; expected {want[1]} or null")
        if isinstance(value, (list, dict)):
            inner = value.values() if isinstance(value, dict) else value
            bad = [v for v in inner if isinstance(v, float) and not math.isfinite(v)]
            if bad:
                raise ConfigError(f"{where}: {key} has {bad[0]!r}; expected finite numbers")
        return float(value) if str(annotation).startswith("float") else value
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
