"""What the index reads of a memory: its index text, whether it is a verbatim dialog-turn record, and the
session documents the optional ``session`` list scores."""

from __future__ import annotations

from typing import Any

import numpy as np

from memlab.data.locomo import format_day
from memlab.memory.entry import MemoryEntry


def index_text(entry: MemoryEntry, with_date: bool = True) -> str:
    """What the retrievers see of a memory: ``[8 May 2023]`` from its event_time, its text, its topics.

    The date makes "when did ..." questions and month/year words match (measured in
    ``benchmarks/retrieval_recall.py``); reconcile and dedupe compare the bare texts.
    """
    text = entry.text
    if with_date and entry.event_time is not None:
        text = f"[{format_day(entry.event_time)}] {text}"
    if entry.topics:
        text = f"{text} ({', '.join(entry.topics)})"
    return text


def is_turn_record(entry: MemoryEntry) -> bool:
    """A verbatim dialog turn (the ``turns`` extractor's records): one source id, one participant, and a
    text that starts ``"<participant>: "`` (every speaker turn style of `memlab.extract.memory_sets`).

    Everything else (LoCoMo observations, extracted memories) is a *note*: what observation-aware
    indexing folds into the turns a note cites.
    """
    return (len(entry.source_ids) == 1 and len(entry.participants) == 1
            and entry.text.startswith(f"{entry.participants[0]}: "))


def session_documents(rows: list[MemoryEntry], is_record: np.ndarray, texts: list[str]
                      ) -> tuple[np.ndarray, list[str]]:
    """Each dialog-turn record's session number (-1 for other rows) and each session's records' texts joined.

    A session is the records sharing an event time (every turn of a LoCoMo session carries its date); a
    record without one is a session of its own.
    """
    of = np.full(len(rows), -1, dtype=np.int64)
    groups: dict[Any, int] = {}
    for r, e in enumerate(rows):
        if is_record[r]:
            of[r] = groups.setdefault(e.event_time if e.event_time is not None else ("row", r), len(groups))
    parts: list[list[str]] = [[] for _ in groups]
    for r in np.flatnonzero(of >= 0):
        parts[of[r]].append(texts[r])
    return of, [" ".join(p) for p in parts]


def citing_pairs(rows: list[MemoryEntry], is_record: Any) -> list[tuple[int, int]]:
    """(note row, record row) for each note citing a dialog-turn record by its source id, sorted."""
    rec_of_source = {e.source_ids[0]: r for r, e in enumerate(rows) if is_record[r]}
    return sorted({(r, rec_of_source[s]) for r, e in enumerate(rows) if not is_record[r]
                   for s in e.source_ids if s in rec_of_source})


def with_citing_notes(rows: list[MemoryEntry], texts: list[str], pairs: list[tuple[int, int]]) -> list[str]:
    """Each record's text with the texts of the notes citing it appended (``index.params.append_citing``: what the
    keyword scorers read); ``texts`` itself where no note cites a record."""
    if not pairs:
        return texts
    extra: dict[int, list[str]] = {}
    for note, rec in pairs:
        extra.setdefault(rec, []).append(rows[note].text)
    return [t if r not in extra else t + " " + " ".join(extra[r]) for r, t in enumerate(texts)]
