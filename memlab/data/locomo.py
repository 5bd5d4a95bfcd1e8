"""LoCoMo-10 records and a validating loader.

The file is a JSON list of samples (see ``shared/data/locomo/README.md`` for the format facts).
Structure errors are fatal with one message naming file, sample, key and expectation; evidence
defects (malformed or dangling dialog ids) are data-quality facts, collected in a `LoadReport`.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

#: Default category labels (official scorer, mem0 and tRPC-Agent-Go reports). Scoring keys on the
#: number; labels are for display and can be overridden per load.
CATEGORY_LABELS: dict[int, str] = {
    1: "multi-hop",
    2: "temporal",
    3: "open-domain",
    4: "single-hop",
    5: "adversarial",
}

SESSION_DATE_FORMAT = "%I:%M %p on %d %B, %Y"
_DIA_ID = re.compile(r"D(\d+):(\d+)")
_SESSION_KEY = re.compile(r"session_(\d+)")


class LoCoMoFormatError(ValueError):
    """A LoCoMo file is structurally broken (the message names file, sample, key, expectation)."""


@dataclass(frozen=True, slots=True)
class Turn:
    dia_id: str
    speaker: str
    text: str
    session_index: int
    image_caption: str | None = None
    image_query: str | None = None

    @property
    def searchable_text(self) -> str:
        """Text a retriever sees: a shared photo's caption is part of what was said."""
        if self.image_caption:
            return f"{self.text} [shared a photo: {self.image_caption}]"
        return self.text


@dataclass(frozen=True, slots=True)
class Session:
    index: int
    date_time: datetime
    date_time_raw: str
    turns: tuple[Turn, ...]


@dataclass(frozen=True, slots=True)
class Observation:
    """One annotated fact of the dataset, with the dialog ids it came from."""

    session_index: int
    speaker: str
    text: str
    dia_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Question:
    conversation_id: str
    index: int
    question: str
    answer: str | None
    adversarial_answer: str | None
    evidence: tuple[str, ...]
    """Evidence ids exactly as written in the file (some are malformed)."""
    evidence_ids: tuple[str, ...]
    """Well-formed evidence ids naming existing turns, recovered from ``evidence`` where possible."""
    category: int
    category_label: str

    @property
    def qid(self) -> str:
        return f"{self.conversation_id}/q{self.index}"


@dataclass(frozen=True)
class Conversation:
    sample_id: str
    speakers: tuple[str, str]
    sessions: tuple[Session, ...]
    questions: tuple[Question, ...] = ()
    observations: tuple[Observation, ...] = ()
    session_summaries: Mapping[int, str] = field(default_factory=dict)

    @cached_property
    def turns(self) -> tuple[Turn, ...]:
        return tuple(t for s in self.sessions for t in s.turns)

    @cached_property
    def turn_index(self) -> dict[str, Turn]:
        return {t.dia_id: t for t in self.turns}

    @cached_property
    def session_by_index(self) -> dict[int, Session]:
        return {s.index: s for s in self.sessions}

    def turn(self, dia_id: str) -> Turn:
        return self.turn_index[dia_id]


@dataclass(frozen=True, slots=True)
class EvidenceIssue:
    sample_id: str
    question_index: int
    raw: str
    kind: str  # "malformed" | "dangling"
    recovered: tuple[str, ...]


@dataclass
class LoadReport:
    """What the loader found wrong but did not reject."""

    path: str
    evidence_issues: list[EvidenceIssue] = field(default_factory=list)
    dates_without_session: list[tuple[str, str]] = field(default_factory=list)
    samples_without_questions: list[str] = field(default_factory=list)

    @property
    def malformed_evidence(self) -> list[EvidenceIssue]:
        return [i for i in self.evidence_issues if i.kind == "malformed"]

    @property
    def dangling_evidence(self) -> list[EvidenceIssue]:
        return [i for i in self.evidence_issues if i.kind == "dangling"]

    def summary(self) -> str:
        return (
            f"{len(self.malformed_evidence)} malformed and {len(self.dangling_evidence)} dangling evidence ids; "
            f"{len(self.dates_without_session)} session dates without turns; "
            f"{len(self.samples_without_questions)} samples without questions"
        )


@dataclass(frozen=True)
class Dataset:
    """A loaded benchmark: conversations (LoCoMo's dialogues or LongMemEval's haystacks) plus the load report.
    Every stage takes a `Dataset`; the two formats are its subclasses `LoCoMo` and
    `memlab.data.longmemeval.LongMemEval`, neither a kind of the other."""

    conversations: tuple[Conversation, ...]
    report: LoadReport
    category_labels: Mapping[int, str]
    name: str = "locomo"
    """The benchmark's name (`memlab.data.dataset.FORMATS`), recorded in run.json as ``dataset_format``."""
    sha256: str | None = None
    """The file's sha256 when the loading pass computed it (else `dataset_sha256` reads the file)."""

    def __iter__(self) -> Iterator[Conversation]:
        return iter(self.conversations)

    def __len__(self) -> int:
        return len(self.conversations)

    def __getitem__(self, sample_id: str) -> Conversation:
        for c in self.conversations:
            if c.sample_id == sample_id:
                return c
        known = ", ".join(c.sample_id for c in self.conversations)
        raise KeyError(f"no conversation {sample_id!r}; known: {known}")

    @property
    def questions(self) -> list[Question]:
        return [q for c in self.conversations for q in c.questions]

    def questions_frame(self):
        """One row per question (pandas), the table scoring and runs join on."""
        import pandas as pd

        return pd.DataFrame([{"qid": q.qid, "conversation_id": q.conversation_id, "q_index": q.index,
                              "category": q.category, "category_label": q.category_label, "question": q.question,
                              "answer": q.answer, "adversarial_answer": q.adversarial_answer,
                              "evidence": list(q.evidence_ids), "n_evidence": len(q.evidence_ids)}
                             for q in self.questions])

    def category_stats(self) -> list[dict[str, Any]]:
        """Per-category counts and shapes, one dict per category number in order (no pandas: ``memlab data
        info`` prints it without paying the import)."""
        by: dict[int, list[Question]] = {}
        for q in self.questions:
            by.setdefault(q.category, []).append(q)
        return [{"category": c, "label": qs[0].category_label, "questions": len(qs),
                 "mean_evidence": round(sum(len(q.evidence_ids) for q in qs) / len(qs), 2),
                 "no_evidence": sum(1 for q in qs if not q.evidence_ids)} for c, qs in sorted(by.items())]

    def stats(self):
        """`category_stats` as a DataFrame indexed by category number."""
        import pandas as pd

        return pd.DataFrame(self.category_stats()).set_index("category")

    def counts(self) -> dict[str, int]:
        return {
            "conversations": len(self.conversations),
            "sessions": sum(len(c.sessions) for c in self.conversations),
            "turns": sum(len(c.turns) for c in self.conversations),
            "questions": sum(len(c.questions) for c in self.conversations),
            "observations": sum(len(c.observations) for c in self.conversations),
        }


@dataclass(frozen=True)
class LoCoMo(Dataset):
    """A loaded LoCoMo file: one conversation per sample, with its questions and observations."""


def format_day(d: datetime) -> str:
    """A date the way LoCoMo's answers write it: ``7 May 2023``."""
    return f"{d.day} {d.strftime('%B %Y')}"


def parse_session_date(raw: str) -> datetime:
    """Parse LoCoMo's ``1:56 pm on 8 May, 2023`` form (naive, local to the conversation)."""
    return datetime.strptime(raw.strip(), SESSION_DATE_FORMAT)


def recover_evidence_ids(raw: str) -> tuple[str, ...]:
    """Well-formed ids hidden in a malformed entry: ``"D8:6; D9:17"``, ``"D:11:26"``, ``"D30:05"``."""
    fixed = re.sub(r"D:(\d+):", r"D\1:", raw)
    return tuple(f"D{int(s)}:{int(t)}" for s, t in _DIA_ID.findall(fixed))


def _fail(path: str, sample: str, key: str, expected: str, got: Any = None) -> LoCoMoFormatError:
    got_s = "" if got is None else f"; got {type(got).__name__} {str(got)[:60]!r}"
    return LoCoMoFormatError(f"{path}: sample {sample}: key {key!r}: expected {expected}{got_s}")


def _require(obj: Any, key: str, typ: type | tuple[type, ...], path: str, sample: str, expected: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise _fail(path, sample, key, f"{expected} (key missing)")
    val = obj[key]
    # bool is a subclass of int: ``"category": true`` would otherwise be read as category 1
    if not isinstance(val, typ) or (isinstance(val, bool) and bool not in (typ if isinstance(typ, tuple) else (typ,))):
        raise _fail(path, sample, key, expected, val)
    return val


def _check_encodable(text: str, path: str, sample: str, key: str) -> str:
    """Refuse text that cannot be written as UTF-8 (JSON ``\\ud800`` escapes decode to lone surrogates,
    which every later stage -- hashing, SQLite, the model -- would fail on or drop)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise _fail(path, sample, key, f"text encodable as UTF-8 (a lone surrogate {text[e.start]!r} "
                                       f"at character {e.start})", text) from None
    return text


def load_locomo(
    path: str | Path | None = None, category_labels: Mapping[int, str] | None = None
) -> LoCoMo:
    """Load and validate a LoCoMo-format file (``path`` resolved by `memlab.data.resolve_locomo_path`)."""
    from memlab.data.fetch import resolve_locomo_path

    p = resolve_locomo_path(path)
    labels = dict(CATEGORY_LABELS)
    if category_labels:
        labels.update(category_labels)
    spath = str(p)
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise LoCoMoFormatError(f"{spath}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from e
    except RecursionError:  # Python's JSON reader recurses once per level of nesting
        raise LoCoMoFormatError(f"{spath}: nested too deeply to read (more than about "
                                f"{sys.getrecursionlimit():,} levels of lists or objects); expected LoCoMo's "
                                f"samples") from None
    except UnicodeDecodeError as e:
        raise LoCoMoFormatError(f"{spath}: not UTF-8 text ({e})") from e
    if not isinstance(raw, list):
        raise LoCoMoFormatError(f"{spath}: expected a JSON list of samples, got {type(raw).__name__}")
    report = LoadReport(path=spath)
    convs = tuple(_parse_sample(s, i, spath, labels, report) for i, s in enumerate(raw))
    ids = [c.sample_id for c in convs]
    dup = {x for x in ids if ids.count(x) > 1}
    if dup:
        raise LoCoMoFormatError(f"{spath}: duplicate sample_id values {sorted(dup)}; expected unique ids")
    return LoCoMo(conversations=convs, report=report, category_labels=labels)


def _parse_sample(s: Any, pos: int, path: str, labels: dict[int, str], report: LoadReport) -> Conversation:
    where = f"#{pos}"
    if not isinstance(s, dict):
        raise LoCoMoFormatError(f"{path}: sample {where}: expected a JSON object, got {type(s).__name__}")
    sid = _require(s, "sample_id", str, path, where, "a string id like 'conv-26'")
    where = f"{sid} (#{pos})"
    conv = _require(s, "conversation", dict, path, where, "an object with speakers and sessions")
    spk_a = _require(conv, "speaker_a", str, path, where, "the first speaker's name")
    spk_b = _require(conv, "speaker_b", str, path, where, "the second speaker's name")

    sessions: list[Session] = []
    seen_dia: dict[str, str] = {}
    for key in sorted((k for k in conv if _SESSION_KEY.fullmatch(k)), key=lambda k: int(k.split("_")[1])):
        idx = int(key.split("_")[1])
        turns_raw = conv[key]
        if not isinstance(turns_raw, list):
            raise _fail(path, where, f"conversation.{key}", "a list of turns", turns_raw)
        dkey = f"{key}_date_time"
        draw = _require(conv, dkey, str, path, where, "a session date like '1:56 pm on 8 May, 2023'")
        try:
            when = parse_session_date(draw)
        except ValueError as e:
            raise _fail(path, where, f"conversation.{dkey}", "a date like '1:56 pm on 8 May, 2023'", draw) from e
        turns = []
        for j, t in enumerate(turns_raw):
            tkey = f"conversation.{key}[{j}]"
            if not isinstance(t, dict):
                raise _fail(path, where, tkey, "a turn object", t)
            dia = _require(t, "dia_id", str, path, where, f"{tkey}.dia_id as 'D<session>:<turn>'")
            spk = _require(t, "speaker", str, path, where, f"{tkey}.speaker")
            text = _require(t, "text", str, path, where, f"{tkey}.text")
            for field_name, v in (("dia_id", dia), ("speaker", spk), ("text", text)):
                _check_encodable(v, path, where, f"{tkey}.{field_name}")
            if dia in seen_dia:
                raise _fail(path, where, f"{tkey}.dia_id", f"a dialog id used once (also at {seen_dia[dia]})", dia)
            seen_dia[dia] = f"session {idx}, turn {j}"
            cap = t.get("blip_caption")
            q = t.get("query")
            for extra, v in (("blip_caption", cap), ("query", q)):
                if isinstance(v, str):
                    _check_encodable(v, path, where, f"{tkey}.{extra}")
            turns.append(
                Turn(
                    dia_id=dia,
                    speaker=spk,
                    text=text,
                    session_index=idx,
                    image_caption=cap if isinstance(cap, str) and cap else None,
                    image_query=q if isinstance(q, str) and q else None,
                )
            )
        sessions.append(Session(index=idx, date_time=when, date_time_raw=draw, turns=tuple(turns)))
    if not sessions:
        raise _fail(path, where, "conversation", "at least one 'session_N' list of turns")
    have = {s.index for s in sessions}
    for k in conv:
        m = re.fullmatch(r"session_(\d+)_date_time", k)
        if m and int(m.group(1)) not in have:
            report.dates_without_session.append((sid, k))

    turn_ids = {t.dia_id for se in sessions for t in se.turns}
    questions = []
    qa = s.get("qa")
    if qa is not None and not isinstance(qa, list):
        raise _fail(path, where, "qa", "a list of questions", qa)
    if not qa:
        report.samples_without_questions.append(sid)
    for qi, q in enumerate(qa or []):
        qkey = f"qa[{qi}]"
        if not isinstance(q, dict):
            raise _fail(path, where, qkey, "a question object", q)
        text = _check_encodable(_require(q, "question", str, path, where, f"{qkey}.question text"),
                                path, where, f"{qkey}.question")
        cat = _require(q, "category", int, path, where, f"{qkey}.category as an integer 1-5")
        if cat not in labels:
            raise _fail(path, where, f"{qkey}.category", f"one of {sorted(labels)}", cat)
        ans = q.get("answer")
        for k in ("answer", "adversarial_answer"):  # JSON's NaN / Infinity would become the gold text "nan"
            v = q.get(k)
            if v is not None and (not isinstance(v, (str, int, float)) or isinstance(v, bool) or
                                  (isinstance(v, float) and not math.isfinite(v))):
                raise _fail(path, where, f"{qkey}.{k}", "a string or a finite number", v)
        for k in ("answer", "adversarial_answer"):
            if isinstance(q.get(k), str):
                _check_encodable(q[k], path, where, f"{qkey}.{k}")
        if ans is None and cat != 5:
            raise _fail(path, where, f"{qkey}.answer", f"an answer (category {cat} questions need one)")
        ev_raw = q.get("evidence", [])
        if not isinstance(ev_raw, list):
            raise _fail(path, where, f"{qkey}.evidence", "a list of dialog ids", ev_raw)
        ev_ids: list[str] = []
        for e in ev_raw:
            e = str(e)
            if recover_evidence_ids(e) == (e,):  # canonical 'D<s>:<t>'
                if e in turn_ids:
                    ev_ids.append(e)
                else:
                    report.evidence_issues.append(EvidenceIssue(sid, qi, e, "dangling", ()))
                continue
            rec = tuple(x for x in recover_evidence_ids(e) if x in turn_ids)
            report.evidence_issues.append(EvidenceIssue(sid, qi, e, "malformed", rec))
            ev_ids.extend(rec)
        adv = q.get("adversarial_answer")
        questions.append(
            Question(
                conversation_id=sid,
                index=qi,
                question=text,
                answer=None if ans is None else str(ans),
                adversarial_answer=None if adv is None else str(adv),
                evidence=tuple(str(e) for e in ev_raw),
                evidence_ids=tuple(dict.fromkeys(ev_ids)),
                category=cat,
                category_label=labels[cat],
            )
        )

    observations = []
    obs = s.get("observation") or {}
    if not isinstance(obs, dict):
        raise _fail(path, where, "observation", "an object of per-session observations", obs)
    for okey, per_speaker in obs.items():
        m = re.fullmatch(r"session_(\d+)_observation", okey)
        if not m or not isinstance(per_speaker, dict):
            raise _fail(path, where, f"observation.{okey}", "'session_N_observation': {speaker: [[fact, dia_id]]}")
        sidx = int(m.group(1))
        for spk, facts in per_speaker.items():
            for fi, item in enumerate(facts or []):
                if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
                    raise _fail(path, where, f"observation.{okey}.{spk}[{fi}]", "[fact text, dia_id or ids]", item)
                _check_encodable(item[0], path, where, f"observation.{okey}.{spk}[{fi}]")
                ids = item[1] if isinstance(item[1], list) else [item[1]]
                rec = tuple(dict.fromkeys(x for i in ids for x in recover_evidence_ids(str(i))))
                observations.append(Observation(sidx, spk, item[0], rec))

    summaries: dict[int, str] = {}
    for skey, text in (s.get("session_summary") or {}).items():
        m = re.fullmatch(r"session_(\d+)_summary", skey)
        if m and isinstance(text, str):
            _check_encodable(text, path, where, f"session_summary.{skey}")
            summaries[int(m.group(1))] = text

    return Conversation(
        sample_id=sid,
        speakers=(spk_a, spk_b),
        sessions=tuple(sessions),
        questions=tuple(questions),
        observations=tuple(observations),
        session_summaries=summaries,
    )
