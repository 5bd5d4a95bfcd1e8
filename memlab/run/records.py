"""The records a run writes and reads back, defined once: one prediction row per question and the
retrieval and answer trace lines, each with a schema version.

The same dataclasses write ``predictions.jsonl`` / the trace files and read them (`load_run`,
`memlab.trace.load`), so a saved run comes back with the types a fresh one has: lists stay lists.
Machine-read tables are Parquet (``predictions.parquet``, ``summary.parquet``); the CSV files
beside them are a human export.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, TypedDict, TypeVar

import pandas as pd

from memlab.atomic import write_table
from memlab.plain import check_types, check_version, from_fields, plain

SCHEMA_VERSION = 1

R = TypeVar("R", bound="Record")


class RunStatus(str, Enum):
    """What ``run.json`` says of a run."""

    RUNNING = "running"
    COMPLETE = "complete"
    COMPLETE_WITH_ERRORS = "complete-with-errors"
    INTERRUPTED = "interrupted"
    STOPPED = "stopped"
    """The spend cap (``run.max_calls`` / ``run.max_usd``) refused a request: resumable with a raised cap."""
    FAILED = "failed"


class RunFileError(ValueError):
    """A file of a run folder cannot be read: corrupt, cut short, or not what memlab writes (the message names it)."""


class RecordSchemaError(ValueError):
    """A saved record of another schema version, or with unknown or missing fields."""


def check_schema(d: dict[str, Any], where: str) -> None:
    """A saved record of another schema version is an error naming ``where`` (no version: the current one)."""
    check_version(d, SCHEMA_VERSION, where, RecordSchemaError)


class Record:
    """JSON round trip shared by the records (strict: unknown fields and other versions are errors)."""

    def to_dict(self) -> dict[str, Any]:
        return plain(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), default=str)

    @classmethod
    def from_dict(cls: type[R], d: dict[str, Any], where: str = "record") -> R:
        check_schema(d, where)
        return from_fields(cls, d, where, RecordSchemaError)


@dataclass
class PredictionRecord(Record):
    """One question's outcome: the scored row (an errored question has every field, ``error`` set)."""

    qid: str
    conversation_id: str
    q_index: int
    category: int
    question: str
    answer: str | None
    evidence: list[str]
    evidence_raw: list[str]
    prediction: str = ""
    error: str | None = None
    calls: int = 0
    cached_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    tokens_estimated: bool = False
    context_tokens: int = 0
    latency_s: float = 0.0
    retrieved_ids: list[str] = field(default_factory=list)
    first_query_ids: list[list[str]] = field(default_factory=list)
    """Source ids of each hit of the first query, in rank order (Recall@k reads these)."""
    rule: str = ""
    j: float | None = None
    j_repeats: list[float] = field(default_factory=list)
    """Each judge repeat's verdict (``judge.repeats``); ``j`` is their mean."""
    judge_error: str | None = None
    judge_replies: list[str] = field(default_factory=list)
    """Each judge repeat's reply as the model wrote it (an unreadable one too, last): J under another verdict
    rule is read from these (`memlab.eval.profiles.judge_rule_columns`)."""
    judge_prompt_tokens: int = 0
    judge_completion_tokens: int = 0
    judge_cached_tokens: int = 0
    malformed_tool_calls: int = 0
    """Tool calls the model wrote as text (recovered by parsing or a forced re-ask, or the error)."""
    answer_ceiling: float | None = None
    """Best official F1 any span (or implied date) of the context lines about the question could score
    (`memlab.eval.ceiling`; None: category 5 or an arm that reads no memory)."""
    answer_bearing: float | None = None
    """1.0 when the reader's context supports the gold: its lines about the question hold every gold content
    word, each person's for a two-person question (`memlab.eval.ceiling`)."""
    schema: int = SCHEMA_VERSION


@dataclass
class RetrievalRecord(Record):
    """The retrieval trace layer of one question: every search with every hit's ranks."""

    qid: str
    evidence: list[str] = field(default_factory=list)
    preload: dict[str, Any] | None = None
    queries: list[dict[str, Any]] = field(default_factory=list)
    context_ids: list[str] = field(default_factory=list)
    error: str | None = None
    rank_depth: int | None = None
    """How deep the trace-only full ranking went (`memlab.answer.base.evidence_ranks`)."""
    evidence_memories: list[dict[str, Any]] = field(default_factory=list)
    """The evidence-sourced memories at answering time: id, source_ids, in_context."""
    rank_error: str | None = None
    schema: int = SCHEMA_VERSION


@dataclass
class AnswerRecord(Record):
    """The answer trace layer of one question: prompt, response, tool calls, usage."""

    qid: str
    prediction: str = ""
    rule: str = ""
    prompt_hash: str = ""
    prompt: str = ""
    response: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    usage: dict[str, Any] = field(default_factory=dict)
    calls: int = 0
    latency_s: float = 0.0
    error: str | None = None
    reading: dict[str, Any] | None = None
    """An offline reader's account of what it read (`memlab.answer.base.Answer.reading`)."""
    schema: int = SCHEMA_VERSION


@dataclass
class MemoryRecord(Record):
    """One stored memory of the memories trace (``traces/memories.jsonl``): the store at answering time."""

    conversation: str
    id: str
    text: str
    kind: str
    event_time: str | None = None
    source_ids: list[str] = field(default_factory=list)
    superseded_at: str | None = None
    superseded_by: str | None = None
    # a memory system's store (`memlab.systems`): whether its dialog ids are its own (``exact``), recovered by
    # alignment (``recovered``, with the top candidates and their scores) or missing (``none``)
    provenance: str | None = None
    session: str | None = None
    candidates: list[Any] | None = None
    schema: int = SCHEMA_VERSION

    @classmethod
    def of(cls, conversation: str, e: Any) -> MemoryRecord:
        """From a `memlab.memory.MemoryEntry` (times as ISO text, as JSON has them)."""
        return cls(conversation=conversation, id=e.id, text=e.text, kind=e.kind,
                   event_time=None if e.event_time is None else str(e.event_time), source_ids=list(e.source_ids),
                   superseded_at=None if e.superseded_at is None else str(e.superseded_at),
                   superseded_by=e.superseded_by)

    def to_dict(self) -> dict[str, Any]:
        d = plain(self)  # a system's fields only on a system's memories, as the line has always been written
        return {k: v for k, v in d.items() if v is not None or k not in _SYSTEM_MEMORY_FIELDS}


_SYSTEM_MEMORY_FIELDS = ("provenance", "session", "candidates")


@dataclass
class ExtractionTraceRecord(Record):
    """One line of the extraction trace (``traces/extraction.jsonl``): an op the worker applied, skipped or
    failed (``op`` and its ``reconcile`` decision, ``result``, ``memory_id``, ``error``), a dropped proposal
    (``dropped``), a failed job (``reason``), or a job's count of tool calls written as text."""

    conversation: str
    job_status: str
    op: dict[str, Any] | None = None
    reconcile: dict[str, Any] | None = None
    result: str | None = None
    memory_id: str | None = None
    error: str | None = None
    dropped: str | None = None
    reason: str | None = None
    malformed_tool_calls: int | None = None
    schema: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        """The line as it has always been written (an op line has all its fields, the others only theirs), with its
        schema version."""
        d: dict[str, Any] = {"conversation": self.conversation, "job_status": self.job_status, "schema": self.schema}
        if self.op is not None:
            d.update(op=self.op, reconcile=self.reconcile, result=self.result, memory_id=self.memory_id,
                     error=self.error)
        for k in ("dropped", "reason", "malformed_tool_calls"):
            if getattr(self, k) is not None:
                d[k] = getattr(self, k)
        return d


# run.json's nested objects: plain dicts to every reader (``run.info["executor"]["kind"]``), typed here so that
# `RunInfo.from_dict` checks what it reads key by key. Each is open: a key it does not name is kept unchecked
# (later memlabs add keys; the Ray executor writes its own).
class SessionInfo(TypedDict, total=False):
    """One session of a run (a start, each ``--resume``): its stage timings and how it ended."""

    timings: dict[str, float]
    status: str
    peak_rss_mb: dict[str, float]
    executor: str
    models_by_role: dict[str, Any]


class ExecutorInfo(TypedDict, total=False):
    kind: str
    index_threads: int
    answer_processes: int
    max_retries: int
    units: list[dict[str, Any]]
    nodes: list[str]


class ComponentsInfo(TypedDict, total=False):
    """Each component's label (class and settings); ``custom``: which were objects the caller passed in."""

    answerer: str
    extractor: str | None
    judge: str
    searcher: str
    embedder: str
    custom: dict[str, bool]
    params: dict[str, Any]


class EnvironmentInfo(TypedDict, total=False):
    python: str
    platform: str
    cpu_count: int | None
    packages: dict[str, str | None]
    memlab_commit: str | None
    memlab_source_sha256: str
    created_utc: str


class RoleErrors(TypedDict):
    """A model role's units that ended in an error, ``errors`` of ``of``."""

    errors: int
    of: int


class ScoringInfo(TypedDict, total=False):
    profile: str
    errata: str | None
    errata_corrected: int
    errata_excluded: int


class ModelsInfo(TypedDict, total=False):
    """Model calls, cache hits, failures, malformed tool calls and cut-off replies, summed and ``by_role``."""

    model_calls: int
    cache_hits: int
    failures: int
    malformed_tool_calls: int
    truncated: int
    by_role: dict[str, dict[str, Any]]


@dataclass
class RunInfo(Record):
    """``run.json``: a run's status, counts, timings and provenance. Both executors write it through this class
    (`memlab.run.steps`), and `memlab.run.results.read_run_json` reads it back through it, so a field is named
    once. Every value is checked against its field's type, nested objects key by key (the `TypedDict`s above):
    a wrong type is an error naming the file and the field. Open to later fields: keys this memlab does not know
    are kept in ``extra`` and written back as they were; a field never set is not written."""

    run_id: str
    status: str
    memlab_version: str = ""
    dataset: str | None = None
    dataset_format: str | None = None
    dataset_sha256: str | None = None
    input_files: dict[str, str] | None = None
    """sha256 of each other file the config names (prompt, errata, prices): what `memlab.run.reuse` compares."""
    questions: int | None = None
    config: dict[str, Any] = field(default_factory=dict)
    environment: EnvironmentInfo = field(default_factory=EnvironmentInfo)
    components: ComponentsInfo = field(default_factory=ComponentsInfo)
    sessions: list[SessionInfo] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    executor: ExecutorInfo | None = None
    threads: dict[str, Any] | None = None
    """The thread settings in force (the local executor's counts; the Ray driver's ``run.threads`` and a note)."""
    timings: dict[str, float] = field(default_factory=dict)
    peak_rss_mb: dict[str, float] | None = None
    system: dict[str, Any] | None = None
    extraction: dict[str, Any] | None = None
    cost: dict[str, Any] | None = None
    scoring: ScoringInfo | None = None
    errors: int | None = None
    judge_errors: int | None = None
    error_rate: float | None = None
    role_errors: dict[str, RoleErrors] | None = None
    """Per model role (reader, judge, extractor): ``errors`` of ``of`` units; each against run.max_error_rate."""
    outputs: dict[str, str] | None = None
    """sha256 of every output file, by path in the folder, recorded when the run completed (`memlab.run.outputs`)."""
    completed_utc: str | None = None
    """When the run completed (UTC, ISO 8601): a reuse prefers the newest by it, never by a folder's name."""
    resumed_skipped: int | None = None
    answered_now: int | None = None
    models: ModelsInfo | None = None
    model_roles: list[str] | None = None
    """One line per model role: its model and endpoint (`ExperimentConfig.describe_models`)."""
    plan: dict[str, Any] | None = None
    """What the run planned to ask of each model role (`memlab.run.plan`), beside what ``models`` says it did."""
    cache_integrity: list[dict[str, Any]] | None = None
    resume: str | None = None
    failure: str | None = None
    stopped: str | None = None
    """Why the spend cap stopped the run (status ``stopped``)."""
    spend: dict[str, Any] | None = None
    """Model requests sent and their dollars over every session of the run, and the cap held to
    (`memlab.run.spend`)."""
    schema: int = SCHEMA_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        d = {k: v for k, v in d.items() if v is not None}
        return {**d, **self.extra}

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "run.json") -> RunInfo:  # type: ignore[override]
        check_schema(d, where)
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        missing = [k for k in ("run_id", "status") if k not in d]
        if missing:
            raise RecordSchemaError(f"{where}: missing field(s) {missing} (every run.json names its run and status)")
        if d["status"] not in {s.value for s in RunStatus}:
            raise RecordSchemaError(f"{where}: status {d['status']!r}; expected one of "
                                    f"{', '.join(s.value for s in RunStatus)}")
        check_types(cls, d, where, RecordSchemaError)
        return cls(**{k: v for k, v in d.items() if k in names},
                   extra={k: v for k, v in d.items() if k not in names})


def read_jsonl(path: str | os.PathLike[str], cls: type[R]) -> list[R]:
    """Records of one JSONL file; a malformed line is an error naming the file and line."""
    out = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError as e:
                raise RecordSchemaError(f"{path}:{i}: not JSON ({e.msg})") from None
            out.append(cls.from_dict(d, where=f"{path}:{i}"))
    return out


# --------------------------------------------------------------------------------- tables
LIST_COLUMNS = ("evidence", "evidence_raw", "retrieved_ids")


def write_frame(path_stem: Path, frame: pd.DataFrame, index: bool = True) -> None:
    """``<stem>.parquet`` (what memlab reads back) and ``<stem>.csv`` (a human export), atomically."""
    from memlab.atomic import write_parquet

    write_parquet(path_stem.with_suffix(".parquet"), frame, index=index)
    write_table(path_stem.with_suffix(".csv"), frame)


def read_frame(path_stem: Path, source: Any = None) -> pd.DataFrame:
    """Read back a table written by `write_frame` (Parquet; list columns come back as lists); ``source``: the
    file already opened (`memlab.run.outputs.open_regular`)."""
    p = path_stem.with_suffix(".parquet")
    if source is None and not p.is_file():
        raise FileNotFoundError(f"{p}: missing (runs written before memlab 0.2 kept only CSV: rerun or resume it)")
    frame = pd.read_parquet(p if source is None else source)
    for c in LIST_COLUMNS:
        if c in frame.columns:
            frame[c] = [list(v) if v is not None else [] for v in frame[c]]
    return frame
