"""The sections of an experiment config (`memlab.run.config.ExperimentConfig`): one dataclass each, with the
constraints on its own fields (``check``); rules across sections stay in `ExperimentConfig.validate`."""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any

from memlab.extract.reconcile import ReconcileConfig
from memlab.index import BACKENDS  # noqa: F401  (the store backends: defined once, where they are opened)
from memlab.index.embedders import embedder_model
from memlab.memory.search_types import SearchOptions
from memlab.params import spec_text

#: Field metadata: the field names a file memlab reads (`memlab.run.trust`: a resume or rescore of a folder from
#: elsewhere uses it only when its user started the run with it).
TRUST_FILE = {"trust": "file"}
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


class ConfigError(ValueError):
    """A config value is wrong (the message names the key and the allowed values)."""


def one_of(where: str, key: str, value: Any, allowed: tuple[Any, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{where}: {key} = {value!r}; allowed: {', '.join(map(str, allowed))}")


def integer(where: str, key: str, v: Any, lo: int, hi: int | None = None, optional: bool = False) -> None:
    """An integer >= lo (and <= hi); None passes when ``optional``."""
    if v is None and optional:
        return
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ConfigError(f"{where}: {key} = {v!r}; expected an integer >= {lo}")
    if hi is not None and v > hi:
        raise ConfigError(f"{where}: {key} = {v!r}; expected an integer <= {hi}")


def positive(where: str, key: str, v: Any) -> None:
    """A number > 0, or None."""
    if v is not None and not v > 0:
        raise ConfigError(f"{where}: {key} = {v!r}; expected a number > 0")


@dataclass
class DatasetConfig:
    path: str | None = field(default=None, metadata=TRUST_FILE)
    conversations: list[str] | None = None
    """Sample ids (``[conv-26, conv-30]``; a single id is read as a one-item list)."""
    categories: list[int] | None = None
    question_limit: int | None = None
    """At most this many questions per conversation (after the category filter), in file order."""
    per_category: int | None = None
    """At most this many questions of each category per conversation (after the category filter, before
    ``question_limit``): the first in file order, or a seeded sample (``sample_seed``) kept in file order."""
    sample_seed: int | None = None
    """With ``per_category``: draw each category's questions at random with this seed (None: the first N)."""

    def __post_init__(self) -> None:
        if isinstance(self.conversations, str):
            self.conversations = [self.conversations]
        if isinstance(self.categories, int) and not isinstance(self.categories, bool):
            self.categories = [self.categories]

    def check(self, where: str) -> None:
        integer(where, "dataset.question_limit", self.question_limit, 1, optional=True)
        integer(where, "dataset.per_category", self.per_category, 1, optional=True)
        integer(where, "dataset.sample_seed", self.sample_seed, 0, MAX_SEED, optional=True)
        if self.sample_seed is not None and self.per_category is None:
            raise ConfigError(f"{where}: dataset.sample_seed = {self.sample_seed!r} without dataset.per_category; "
                              f"the seed draws each category's per_category questions")
        if self.conversations is not None and not all(isinstance(c, str) for c in self.conversations):
            raise ConfigError(f"{where}: dataset.conversations = {self.conversations!r}; expected sample ids "
                              f"(strings, e.g. [conv-26])")
        if self.categories is not None:
            # 1-5: LoCoMo's numbers; 6, 7: LongMemEval's (memlab.data.longmemeval numbers its types 1-7)
            bad = [c for c in self.categories if isinstance(c, bool) or c not in range(1, 8)]
            if bad:
                raise ConfigError(f"{where}: dataset.categories has {bad}; allowed: 1-5 (LoCoMo), 1-7 (LongMemEval)")


@dataclass
class CheckerConfig:
    """DESIGN's checkers: extract when the delta has *more than* ``message_threshold`` messages and/or
    more than ``time_interval_s`` passed since the last extraction; ``combine`` is all (AND) or any
    (OR). No checker set: every job extracts."""

    message_threshold: int | None = None
    time_interval_s: float | None = None
    combine: str = "all"

    def check(self, where: str) -> None:
        one_of(where, "extraction.checkers.combine", self.combine, COMBINES)
        integer(where, "extraction.checkers.message_threshold", self.message_threshold, 0, optional=True)
        positive(where, "extraction.checkers.time_interval_s", self.time_interval_s)


@dataclass
class WorkerConfig:
    """The extraction queue: W workers (a user's jobs stay on one), capacity, per-job timeout."""

    workers: int = 1
    capacity: int = 10
    job_timeout_s: float | None = None
    """None: 30 s for a model-free extractor; for a model one its call timeout x (max_retries + 1) + 30 s,
    so a slow local model's retries fit in one job (see `job_timeout`)."""

    def check(self, where: str) -> None:
        integer(where, "extraction.worker.workers", self.workers, 1)
        integer(where, "extraction.worker.capacity", self.capacity, 1)
        positive(where, "extraction.worker.job_timeout_s", self.job_timeout_s)


@dataclass
class ExtractionConfig:
    name: str = "observations"
    """The extractor (`memlab.extract.extractors.EXTRACTORS`), with its settings under ``params``."""
    prompt: str = field(default="structured", metadata=TRUST_FILE)
    model: str | None = None
    turn_style: str = "speaker-context"
    policy: str = "merge-similar"
    """Update policy (`memlab.extract.policy`): merge-similar | preserve-history | append-only."""
    reconcile: ReconcileConfig = field(default_factory=ReconcileConfig)
    checkers: CheckerConfig = field(default_factory=CheckerConfig)
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    params: dict[str, Any] = field(default_factory=dict)
    """The extractor's constructor settings by name (`memlab.params`), over what the fields above give it."""

    def check(self, where: str) -> None:
        from memlab.extract.memory_sets import TURN_STYLES
        from memlab.extract.policy import POLICIES

        one_of(where, "extraction.policy", self.policy, POLICIES)
        one_of(where, "extraction.turn_style", self.turn_style, TURN_STYLES)
        self.checkers.check(where)
        self.worker.check(where)


@dataclass
class StoreConfig:
    backend: str = "sqlite"

    def check(self, where: str) -> None:
        one_of(where, "store.backend", self.backend, BACKENDS)


@dataclass
class PartConfig:
    """A component given by its registered ``name`` and its constructor's settings (``params``, `memlab.params`):
    the one shape of every family (``extraction``, ``answer``, ``judge``, ``system`` and the index's parts)."""

    name: str | None = None
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class IndexConfig:
    """The run's `memlab.index.hybrid.HybridIndex`: its parts, each a name with its settings (``embedder``,
    ``keyword``, and ``sparse``: a second lexical list over the same keyword texts, fused as ``sparse``), and its
    own settings under ``params`` (declared, with their constraints and meaning, once in its constructor;
    ``memlab components`` lists them)."""

    embedder: PartConfig = field(default_factory=lambda: PartConfig("tfidf-lsa"))
    """``litellm:<model>`` names the ``litellm`` embedder with its ``model``."""
    keyword: PartConfig = field(default_factory=lambda: PartConfig("tfidf"))
    sparse: PartConfig = field(default_factory=PartConfig)
    params: dict[str, Any] = field(default_factory=dict)

    def check(self, where: str) -> None:
        if self.sparse.name is None and self.sparse.params:
            raise ConfigError(f"{where}: index.sparse.params = {self.sparse.params!r} without index.sparse.name; name "
                              f"the sparse scorer these settings are for")

    def embedder_model(self) -> str | None:
        """The model a model-backed embedder calls (None: the embedder runs in this process)."""
        return embedder_model(self.embedder.name, self.embedder.params)

    def own(self) -> dict[str, Any]:
        """The index's own settings in force: ``params`` with the constructor's defaults filled in."""
        from memlab.index.hybrid import HybridIndex
        from memlab.params import resolved_params

        return resolved_params(HybridIndex, self.params)

    def hybrid_params(self) -> dict[str, Any]:
        """This section as `memlab.index.hybrid.HybridIndex` keywords (every index the run builds reads them here);
        the embedder's settings travel apart (`memlab.run.clients.Clients.embedder_params`: its endpoint added)."""
        sparse = self.sparse
        return {"embedder": self.embedder.name, "keyword": spec_text(self.keyword.name, self.keyword.params),
                "sparse": None if sparse.name is None else spec_text(sparse.name, sparse.params), **self.params}

    def file_key(self) -> dict[str, Any]:
        """What names the run's saved index (`memlab.run.extraction.index_file`): the parts by name with their
        settings, and the index's own settings, as that name has always hashed them (`memlab.index.persist`)."""
        from memlab.index.hybrid import HybridIndex
        from memlab.index.persist import FILE_FIRST, frozen_key
        from memlab.params import settable_specs

        parts = {"embedder": self.embedder, "keyword": self.keyword, "sparse": self.sparse}
        out: dict[str, Any] = {n: p.name for n, p in parts.items()}
        out.update({f"{n}_params": p.params for n, p in parts.items()})
        out.update(self.own())
        defaults = {n: s.default for n, s in settable_specs(HybridIndex).items()}
        return frozen_key(out, {**defaults, "sparse": None, **{f"{n}_params": {} for n in parts}}, FILE_FIRST)


@dataclass
class RetrievalConfig:
    """Search options of the answering stage; every field but ``top_k`` (``max_results``), ``preload`` and
    ``context_tokens`` maps to the `SearchOptions` field of the same name."""

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
    context_tokens: int | None = None
    """A token budget for the reader's context (equal budgets across systems and arms): each search's hits, in rank
    order, while their texts fit this many o200k tokens (as ``context_tokens_qa`` counts them; the first that does
    not fit ends the context). ``top_k`` stays the most memories read: set it high (e.g. 100) for the budget to
    bind. null: no budget, ``top_k`` alone."""

    def search_options(self) -> SearchOptions:
        names = {f.name for f in dataclasses.fields(SearchOptions)}
        same = {k: v for k, v in dataclasses.asdict(self).items() if k in names}
        return SearchOptions(max_results=self.top_k, **same)

    def check(self, where: str) -> None:
        from memlab.index.fusion import FUSIONS, check_weights

        one_of(where, "retrieval.fusion", self.fusion, tuple(FUSIONS))
        one_of(where, "retrieval.unit", self.unit, ("memory", "turn"))
        try:
            check_weights(self.fusion_weights, "retrieval.fusion_weights")
        except ValueError as e:
            raise ConfigError(f"{where}: {e}") from None
        if self.participant_boost_sigma < 0:
            raise ConfigError(f"{where}: retrieval.participant_boost_sigma = {self.participant_boost_sigma}; "
                              "expected >= 0")
        integer(where, "retrieval.top_k", self.top_k, 1, MAX_TOP_K)
        integer(where, "retrieval.rrf_k", self.rrf_k, 1)
        integer(where, "retrieval.feedback", self.feedback, 0)
        integer(where, "retrieval.context_tokens", self.context_tokens, 1, optional=True)
        if self.preload < -1:
            raise ConfigError(f"{where}: retrieval.preload = {self.preload}; expected -1 (all), 0 (off) or N")


@dataclass
class AnswerConfig:
    """The answer arm: ``name`` (``answer.name``) with its constructor's settings (``params``; the extractive
    reader's span, weights and scorer, session-recall's ``unit``/``window``/``max_units`` and its offline reader's
    as ``reader__<setting>``, the optimized arm's ``max_rounds``), its ``prompt`` (a file memlab reads) and the
    ``reader`` role's ``model``."""

    name: str = "extractive"
    prompt: str | None = field(default=None, metadata=TRUST_FILE)
    model: str | None = None
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class JudgeConfig:
    model: str | None = None
    prompt: str = field(default="default", metadata=TRUST_FILE)
    """A name under memlab/prompts/judge/ (default, generous, strict) or a file path."""
    name: str = "llm"
    repeats: int = 1
    """Ask the judge this many times per question (each repeat cached apart); J = the mean verdict."""
    temperature: float = 0.0
    params: dict[str, Any] = field(default_factory=dict)
    """The judge's constructor settings by name (`memlab.params`); ``prompt``, ``repeats`` and ``temperature`` are
    given by the fields above (each is the setting of its name), never here."""

    def check(self, where: str) -> None:
        integer(where, "judge.repeats", self.repeats, 1)
        if isinstance(self.params, dict):
            own = [k for k in self.params if k in {f.name for f in dataclasses.fields(self)}]
            if own:
                raise ConfigError(f"{where}: judge.params.{own[0]} = {self.params[own[0]]!r}; set judge.{own[0]} "
                                  f"instead (that field is this setting)")


@dataclass
class ScoringConfig:
    """How answers are scored: a harness profile (`memlab.eval.profiles`) and an optional errata CSV."""

    profile: str = "locomo"
    errata: str | None = field(default=None, metadata=TRUST_FILE)


@dataclass
class CostConfig:
    prices: str | None = field(default=None, metadata=TRUST_FILE)
    """A price table (YAML or CSV, USD per million tokens) overriding litellm's bundled map."""


@dataclass
class SystemConfig:
    """The memory system the arms search (`memlab.systems`): ``memlab`` (this pipeline, from the sections
    above) or an adapter such as ``mem0``, built with ``params``."""

    name: str = "memlab"
    params: dict[str, Any] = field(default_factory=dict)


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
    the process. Without a model pass (a corpus-fitted index, a model-free arm) the local executor spends them
    as keys built side by side and forked answering processes (`memlab.run.forked`), with equal results. A Ray
    task gets the CPUs Ray assigned it, at most this."""
    cache_dir: str | None = None
    """The machine cache folder (pretrained models' vectors, shared by every results root;
    `memlab.index.machine_cache`); null: ``$MEMLAB_CACHE_DIR``, else ``$XDG_CACHE_HOME/memlab``, else
    ``~/.cache/memlab``. Never changes a result."""

    max_calls: int | None = None
    """Spend cap: the run stops cleanly before the model request that would be its ``max_calls + 1``-th (every
    role's, retries included; counted over its resumes); ``memlab run --resume`` with a raised cap goes on."""
    max_usd: float | None = None
    """Spend cap in US dollars: the run stops before a request whose worst case (its prompt tokens and the role's
    max_tokens, priced as ``--plan`` prices them) could take the run's spend past it (`memlab.llm.spend`)."""

    def check(self, where: str) -> None:
        one_of(where, "run.executor", self.executor, EXECUTORS)
        integer(where, "run.max_calls", self.max_calls, 1, optional=True)
        v = self.max_usd
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf")):
            raise ConfigError(f"{where}: run.max_usd = {v!r}; expected a number of US dollars > 0 (or null: no cap)")
        if (self.max_calls is not None or v is not None) and self.executor != "local":
            raise ConfigError(f"{where}: run.max_calls / run.max_usd with run.executor = {self.executor!r}: the "
                              f"spend cap counts one process's calls; use the local executor")
        integer(where, "run.concurrency", self.concurrency, 1)
        integer(where, "run.ray_max_retries", self.ray_max_retries, 0)
        integer(where, "run.seed", self.seed, 0, MAX_SEED)
        integer(where, "run.threads", self.threads, 1, optional=True)
        if not 0.0 <= self.max_error_rate <= 1.0:
            raise ConfigError(f"{where}: run.max_error_rate = {self.max_error_rate!r}; expected a share in [0, 1]")


def build_section(cls: type, d: dict[str, Any], where: str, prefix: str = "") -> Any:
    """A config section (dataclass) from its mapping: unknown keys named with the allowed ones, each value's type
    checked against its field's default (or annotation)."""
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
            if isinstance(default, PartConfig) and isinstance(value, dict) and "name" not in value:
                value = {"name": default.name, **value}  # a part's settings alone: its default name
            kw[name] = build_section(type(default), value or {}, where, f"{prefix}{name}.")
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
