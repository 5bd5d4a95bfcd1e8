"""LongMemEval (ICLR 2025) behind the `Dataset` interface: one `Conversation` per question.

Each LongMemEval item is a question with its **own** haystack of chat sessions, so each becomes a
`Conversation` whose ``sample_id`` is the ``question_id`` (one user key per question) holding that
question alone. Turns are numbered ``S<session>:<turn>`` (1-based positions in the haystack), the
``has_answer: true`` turns are the question's evidence ids, and the user is ``speakers[0]``, so
extraction, retrieval traces, attribution and reports run on it unchanged.

Category numbers (stable; the one place they are defined; scoring and reports key on them):

==  ========================== ===========================================================
 1  single-session-user
 2  single-session-assistant
 3  single-session-preference   gold is a rubric, judged as such
 4  multi-session
 5  abstention                  every ``*_abs`` question, whatever its type (its type is kept
                                in ``question_type``); LoCoMo's category 5 is also "should
                                abstain", so the abstention rules of scoring and attribution apply
 6  knowledge-update
 7  temporal-reasoning
==  ========================== ===========================================================

Structure errors are fatal, one message naming file, question id, session and turn; data-quality
facts (a question without evidence turns, sessions moved seconds apart) go to the load report. Loading
validates every item in one pass but keeps of each only its question and its place in the file
(`Haystack`): an M file's haystacks are parsed again one at a time when a run reaches them.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import lru_cache
from pathlib import Path
from typing import Any

from memlab.data.json_stream import scan_items
from memlab.data.locomo import (
    Conversation,
    Dataset,
    LoadReport,
    LoCoMoFormatError,
    Question,
    Session,
    Turn,
)

QUESTION_TYPES: tuple[str, ...] = (
    "single-session-user", "single-session-assistant", "single-session-preference",
    "multi-session", "knowledge-update", "temporal-reasoning",
)
ABSTENTION = 5
#: LongMemEval's category numbers (see the module notes).
LONGMEMEVAL_LABELS: dict[int, str] = {
    1: "single-session-user", 2: "single-session-assistant", 3: "single-session-preference",
    4: "multi-session", 5: "abstention", 6: "knowledge-update", 7: "temporal-reasoning",
}
TYPE_CATEGORY: dict[str, int] = {t: c for c, t in LONGMEMEVAL_LABELS.items() if t in QUESTION_TYPES}
#: Questions per type in the published S / M / oracle files (500 each; the 30 abstention questions
#: are counted in their type). The scoring guard uses them as upper bounds per category.
PUBLISHED_TYPE_COUNTS: dict[str, int] = {
    "single-session-user": 70, "single-session-assistant": 56, "single-session-preference": 30,
    "multi-session": 133, "knowledge-update": 78, "temporal-reasoning": 133,
}
PUBLISHED_ABSTENTION = 30
DATE_FORMAT = "%Y/%m/%d (%a) %H:%M"
USER, ASSISTANT = "user", "assistant"
REQUIRED = ("question_id", "question_type", "question", "answer", "question_date", "haystack_session_ids",
            "haystack_dates", "haystack_sessions", "answer_session_ids")


class LongMemEvalFormatError(LoCoMoFormatError):
    """A LongMemEval file is structurally broken (the message names file, question, session, turn)."""


@dataclass(frozen=True, slots=True)
class LongMemEvalQuestion(Question):
    """A `Question` plus what LongMemEval adds: its type, date, abstention flag and answer sessions."""

    question_type: str
    question_date: datetime
    question_date_raw: str
    abstention: bool
    answer_session_ids: tuple[str, ...]
    """Haystack session ids holding the answer, as in the file."""
    answer_sessions: tuple[int, ...]
    """Their 1-based positions in the haystack (the ``S<n>`` of the turn ids)."""


@dataclass
class LongMemEvalReport(LoadReport):
    """What the loader found questionable but did not reject."""

    questions_without_evidence: list[str] = field(default_factory=list)
    """Answerable questions with no ``has_answer`` turn (evidence recall is NaN for them)."""
    evidence_outside_answer_sessions: list[tuple[str, str]] = field(default_factory=list)
    sessions_shifted: list[tuple[str, int, float]] = field(default_factory=list)
    """(question id, session, seconds): sessions starting before the previous session's last turn (the same
    minute, say), moved that many seconds later (``date_time``; ``date_time_raw`` keeps the file's date).
    Turn timestamps are the session date plus one second per turn, and an incremental extractor reads only
    messages after its cursor: without the shift it would silently skip the later session."""

    def summary(self) -> str:
        return (f"{len(self.questions_without_evidence)} answerable questions without has_answer turns; "
                f"{len(self.evidence_outside_answer_sessions)} has_answer turns outside the answer sessions; "
                f"{len(self.sessions_shifted)} sessions moved seconds later to keep turn timestamps apart")


@dataclass(frozen=True)
class LongMemEval(Dataset):
    """A loaded LongMemEval file: one conversation (haystack) per question; ``sha256`` comes from the loading
    pass (no second read of a gigabytes file)."""

    name: str = "longmemeval"

    def counts(self) -> dict[str, int]:
        """`Dataset.counts` from what the loading pass noted per question (no haystack read again)."""
        convs = self.conversations
        return {"conversations": len(convs), "sessions": sum(c.n_sessions for c in convs),  # type: ignore[attr-defined]
                "turns": sum(c.n_turns for c in convs), "questions": sum(len(c.questions) for c in convs),  # type: ignore[attr-defined]
                "observations": 0}

    def type_counts(self) -> dict[str, int]:
        """Questions per published type (abstention questions counted in their type) plus ``abstention``."""
        out = {t: 0 for t in QUESTION_TYPES}
        for q in self.questions:
            out[q.question_type] += 1  # type: ignore[attr-defined]
        out["abstention"] = sum(1 for q in self.questions if q.abstention)  # type: ignore[attr-defined]
        return out


def parse_date(raw: str) -> datetime:
    """LongMemEval's ``2023/05/20 (Sat) 02:21`` (the weekday is read but not checked; also without it)."""
    try:
        return datetime.strptime(raw.strip(), DATE_FORMAT)
    except ValueError:
        return datetime.strptime(raw.strip(), "%Y/%m/%d %H:%M")


def _fail(path: str, where: str, key: str, expected: str, got: Any = None) -> LongMemEvalFormatError:
    got_s = "" if got is None else f"; got {type(got).__name__} {str(got)[:60]!r}"
    return LongMemEvalFormatError(f"{path}: {where}: key {key!r}: expected {expected}{got_s}")


def _get(obj: dict, key: str, typ: type | tuple[type, ...], path: str, where: str, expected: str) -> Any:
    if key not in obj:
        raise _fail(path, where, key, f"{expected} (key missing)")
    val = obj[key]
    if not isinstance(val, typ) or isinstance(val, bool):
        raise _fail(path, where, key, expected, val)
    return val


def _text(v: str, path: str, where: str, key: str) -> str:
    try:
        v.encode("utf-8")
    except UnicodeEncodeError as e:
        raise _fail(path, where, key, f"text encodable as UTF-8 (a lone surrogate at character {e.start})", v) from None
    return v


def _date(raw: Any, path: str, where: str, key: str) -> datetime:
    if not isinstance(raw, str):
        raise _fail(path, where, key, "a date like '2023/05/20 (Sat) 02:21'", raw)
    try:
        return parse_date(raw)
    except ValueError:
        raise _fail(path, where, key, "a date like '2023/05/20 (Sat) 02:21'", raw) from None


def _parse_item(item: Any, pos: int, path: str, report: LongMemEvalReport) -> Conversation:
    where = f"question #{pos}"
    if not isinstance(item, dict):
        raise LongMemEvalFormatError(f"{path}: {where}: expected a JSON object, got {type(item).__name__}")
    qid = _text(_get(item, "question_id", str, path, where, "a string id"), path, where, "question_id")
    where = f"question {qid} (#{pos})"
    missing = [k for k in REQUIRED if k not in item]
    if missing:
        raise _fail(path, where, missing[0], f"every LongMemEval field; missing {missing}")
    qtype = _get(item, "question_type", str, path, where, f"one of {list(QUESTION_TYPES)}")
    if qtype not in QUESTION_TYPES:
        raise _fail(path, where, "question_type", f"one of {list(QUESTION_TYPES)}", qtype)
    text = _text(_get(item, "question", str, path, where, "the question text"), path, where, "question")
    ans = _get(item, "answer", (str, int, float), path, where, "the gold answer (a string or number)")
    if isinstance(ans, float) and not math.isfinite(ans):  # JSON's NaN / Infinity: the gold text would be "nan"
        raise _fail(path, where, "answer", "the gold answer (a string or a finite number)", ans)
    answer = _text(str(ans), path, where, "answer")
    if not answer.strip():
        raise _fail(path, where, "answer", "a non-empty gold answer", ans)
    qdate_raw = item["question_date"]
    qdate = _date(qdate_raw, path, where, "question_date")
    sids = _get(item, "haystack_session_ids", list, path, where, "a list of session ids")
    dates = _get(item, "haystack_dates", list, path, where, "a list of session dates")
    hay = _get(item, "haystack_sessions", list, path, where, "a list of sessions (lists of {role, content})")
    if not (len(sids) == len(dates) == len(hay)):
        raise _fail(path, where, "haystack_sessions", f"as many sessions as haystack_session_ids ({len(sids)}) "
                    f"and haystack_dates ({len(dates)})", f"{len(hay)} sessions")
    if not hay:
        raise _fail(path, where, "haystack_sessions", "at least one session")
    seen: dict[str, int] = {}
    sessions: list[Session] = []
    evidence: list[str] = []
    for i, (sid, draw, turns_raw) in enumerate(zip(sids, dates, hay), 1):
        swhere = f"{where}: session {sid!r} (#{i})" if isinstance(sid, str) else f"{where}: session #{i}"
        if not isinstance(sid, str) or not sid:
            raise _fail(path, swhere, "haystack_session_ids", "a non-empty string", sid)
        if sid in seen:
            raise _fail(path, swhere, "haystack_session_ids", f"ids used once (also session #{seen[sid]})", sid)
        seen[sid] = i
        when = _date(draw, path, swhere, "haystack_dates")
        if not isinstance(turns_raw, list):
            raise _fail(path, swhere, "haystack_sessions", "a list of {role, content} turns", turns_raw)
        turns = []
        for j, t in enumerate(turns_raw, 1):
            twhere = f"{swhere}: turn {j}"
            if not isinstance(t, dict):
                raise _fail(path, twhere, "turn", "an object {role, content}", t)
            role = _get(t, "role", str, path, twhere, f"'{USER}' or '{ASSISTANT}'")
            if role not in (USER, ASSISTANT):
                raise _fail(path, twhere, "role", f"'{USER}' or '{ASSISTANT}'", role)
            content = _text(_get(t, "content", str, path, twhere, "the message text"), path, twhere, "content")
            has = t.get("has_answer", False)
            if not isinstance(has, bool):
                raise _fail(path, twhere, "has_answer", "true or false", has)
            tid = f"S{i}:{j}"
            if has:
                evidence.append(tid)
            turns.append(Turn(dia_id=tid, speaker=role, text=content, session_index=i))
        sessions.append(Session(index=i, date_time=when, date_time_raw=draw, turns=tuple(turns)))
    sessions = _apart(sessions, qid, report)
    ans_ids = _get(item, "answer_session_ids", list, path, where, "a list of haystack session ids")
    for a in ans_ids:
        if a not in seen:
            raise _fail(path, where, "answer_session_ids", "ids of sessions in this question's haystack", a)
    abstention = qid.endswith("_abs")
    ans_idx = tuple(seen[a] for a in ans_ids)
    for e in evidence:
        if int(e[1:].split(":")[0]) not in ans_idx:
            report.evidence_outside_answer_sessions.append((qid, e))
    if not evidence and not abstention:
        report.questions_without_evidence.append(qid)
    category = ABSTENTION if abstention else TYPE_CATEGORY[qtype]
    q = LongMemEvalQuestion(
        conversation_id=qid, index=0, question=text, answer=answer, adversarial_answer=None,
        evidence=tuple(evidence), evidence_ids=tuple(evidence), category=category,
        category_label=LONGMEMEVAL_LABELS[category], question_type=qtype, question_date=qdate,
        question_date_raw=qdate_raw, abstention=abstention, answer_session_ids=tuple(ans_ids), answer_sessions=ans_idx)
    return Conversation(sample_id=qid, speakers=(USER, ASSISTANT), sessions=tuple(sessions), questions=(q,))


def _apart(sessions: list[Session], qid: str, report: LongMemEvalReport) -> list[Session]:
    """Sessions in date order (haystack order among equal dates) each start after the previous one's last
    turn timestamp; a session that would not is moved later by whole seconds and reported."""
    out = {s.index: s for s in sessions}
    last_end: datetime | None = None
    for s in sorted(sessions, key=lambda s: (s.date_time, s.index)):
        start = s.date_time
        if last_end is not None and start <= last_end:
            start = last_end + timedelta(seconds=1)
            report.sessions_shifted.append((qid, s.index, (start - s.date_time).total_seconds()))
            out[s.index] = replace(s, date_time=start)
        last_end = start + timedelta(seconds=max(len(s.turns) - 1, 0))
    return [out[s.index] for s in sessions]


@dataclass(frozen=True)
class ItemSpan:
    """Where one validated question lies in its file: byte span, position in the list, the file's size."""

    path: str
    start: int
    end: int
    pos: int
    file_size: int


class Haystack(Conversation):
    """A question's `Conversation` whose haystack stays in the file until used.

    The loader validates every item, then keeps of each only its question, counts and byte span: ``sessions``
    and the turn tables are parsed again from the file when read (`haystack`: the last one read is kept, so
    memory holds one question's haystack at a time, however many questions a run selects). A copy or pickle
    (a Ray task's argument) is the plain parsed `Conversation`, so a worker needs no access to the file.
    """

    span: ItemSpan
    n_sessions: int
    n_turns: int

    def __init__(self, conv: Conversation, span: ItemSpan) -> None:
        for name in ("sample_id", "speakers", "questions", "observations", "session_summaries"):
            object.__setattr__(self, name, getattr(conv, name))
        object.__setattr__(self, "span", span)
        object.__setattr__(self, "n_sessions", len(conv.sessions))
        object.__setattr__(self, "n_turns", sum(len(s.turns) for s in conv.sessions))

    def load(self) -> Conversation:
        """The parsed conversation (read from the file unless it is the last one read)."""
        conv = haystack(self.span)
        if conv.sample_id != self.sample_id or conv.questions != self.questions:
            raise LongMemEvalFormatError(f"{self.span.path}: question {self.sample_id} (#{self.span.pos}) changed "
                                         f"since the file was loaded; load it again")
        return conv

    sessions = property(lambda self: self.load().sessions)  # type: ignore[assignment]
    turns = property(lambda self: self.load().turns)  # type: ignore[assignment]
    turn_index = property(lambda self: self.load().turn_index)  # type: ignore[assignment]
    session_by_index = property(lambda self: self.load().session_by_index)  # type: ignore[assignment]

    def __eq__(self, other: object) -> bool:
        return self.span == other.span if isinstance(other, Haystack) else NotImplemented

    def __hash__(self) -> int:
        return hash(self.span)

    def __repr__(self) -> str:
        return f"Haystack({self.sample_id!r}, {self.span.path!r} #{self.span.pos})"

    def __reduce__(self) -> tuple[Any, ...]:
        c = self.load()
        return Conversation, (c.sample_id, c.speakers, c.sessions, c.questions, c.observations, c.session_summaries)


@lru_cache(maxsize=1)
def haystack(span: ItemSpan) -> Conversation:
    """One question's conversation parsed again from its span (validated when the file was loaded). The last
    one is kept (`lru_cache` of one): a question's stages read it once between them."""
    what = f"{span.path}: question #{span.pos} changed since the file was loaded ({{}}); load it again"
    try:
        if os.path.getsize(span.path) != span.file_size:
            raise LongMemEvalFormatError(what.format("its size differs"))
        with open(span.path, "rb") as f:
            f.seek(span.start)
            item = json.loads(f.read(span.end - span.start))
    except (OSError, ValueError, RecursionError) as e:
        if isinstance(e, LongMemEvalFormatError):
            raise
        raise LongMemEvalFormatError(what.format(e)) from e
    return _parse_item(item, span.pos, span.path, LongMemEvalReport(path=span.path))


def forget_haystack() -> None:
    """Drop the haystack `haystack` keeps (a streamed run, done with a question, before it reads the next: the
    next one is then parsed with no other alive)."""
    haystack.cache_clear()


def load_longmemeval(path: str | Path) -> LongMemEval:
    """Load and validate a LongMemEval-format file (S, M or oracle; the cleaned release or the original).

    One pass over the file validates every item (the first defect stops it, named by question, session and
    turn) and computes the file's sha256; the dataset then holds each question and its haystack's place in the
    file (`Haystack`), not the haystacks."""
    p = Path(path)
    if not p.is_file():
        from memlab.data.fetch import DataNotFoundError

        raise DataNotFoundError(f"no LongMemEval file at {p}; `memlab data fetch longmemeval-s` gets one")
    spath = str(p)
    size = p.stat().st_size
    report = LongMemEvalReport(path=spath)
    convs: list[Conversation] = []
    ids: dict[str, int] = {}
    digest = hashlib.sha256()
    try:
        for pos, (item, start, end) in enumerate(scan_items(p, digest=digest, error=LongMemEvalFormatError)):
            conv = _parse_item(item, pos, spath, report)
            if conv.sample_id in ids:
                raise LongMemEvalFormatError(f"{spath}: question {conv.sample_id} (#{pos}): key 'question_id': "
                                             f"expected unique ids (also #{ids[conv.sample_id]})")
            ids[conv.sample_id] = pos
            convs.append(Haystack(conv, ItemSpan(spath, start, end, pos, size)))
            del item, conv
    except UnicodeDecodeError as e:
        raise LongMemEvalFormatError(f"{spath}: not UTF-8 text ({e})") from e
    if not convs:
        raise LongMemEvalFormatError(f"{spath}: expected at least one question, the list is empty")
    return LongMemEval(conversations=tuple(convs), report=report, category_labels=dict(LONGMEMEVAL_LABELS),
                       sha256=digest.hexdigest())
