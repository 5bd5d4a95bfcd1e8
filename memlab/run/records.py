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
from typing import Any, TypeVar

import pandas as pd

from memlab.atomic import write_table

SCHEMA_VERSION = 1

R = TypeVar("R", bound="Record")


class RunStatus(str, Enum):
    """What ``run.json`` says of a run."""

    RUNNING = "running"
    COMPLETE = "complete"
    COMPLETE_WITH_ERRORS = "complete-with-errors"
    INTERRUPTED = "interrupted"
    FAILED = "failed"


class RecordSchemaError(ValueError):
    """A saved record of another schema version, or with unknown or missing fields."""


class Record:
    """JSON round trip shared by the records (strict: unknown fields and other versions are errors)."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), default=str)

    @classmethod
    def from_dict(cls: type[R], d: dict[str, Any], where: str = "record") -> R:
        version = d.get("schema", SCHEMA_VERSION)
        if version != SCHEMA_VERSION:
            raise RecordSchemaError(f"{where}: schema version {version}; this memlab reads version {SCHEMA_VERSION}")
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(d) - names)
        if unknown:
            raise RecordSchemaError(f"{where}: unknown field(s) {unknown} for {cls.__name__}")
        try:
            return cls(**d)
        except TypeError as e:
            raise RecordSchemaError(f"{where}: {cls.__name__}: {e}") from None


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
    judge_prompt_tokens: int = 0
    judge_completion_tokens: int = 0
    judge_cached_tokens: int = 0
    malformed_tool_calls: int = 0
    """Tool calls the model wrote as text (recovered by parsing or a forced re-ask, or the error)."""
    answer_ceiling: float | None = None
    """Best official F1 any span of the reader's context could score (`memlab.eval.ceiling`; None: category 5
    or an arm that reads no memory)."""
    answer_bearing: float | None = None
    """1.0 when every gold answer token is in the reader's context (`memlab.eval.ceiling`)."""
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


def read_frame(path_stem: Path) -> pd.DataFrame:
    """Read back a table written by `write_frame` (Parquet; list columns come back as lists)."""
    p = path_stem.with_suffix(".parquet")
    if not p.is_file():
        raise FileNotFoundError(f"{p}: missing (runs written before memlab 0.2 kept only CSV: rerun or resume it)")
    frame = pd.read_parquet(p)
    for c in LIST_COLUMNS:
        if c in frame.columns:
            frame[c] = [list(v) if v is not None else [] for v in frame[c]]
    return frame
