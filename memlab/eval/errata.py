"""Errata: a user's list of known wrong gold answers, corrected or excluded before scoring.

LoCoMo-10 has gold answers that are publicly reported wrong (about 99 in categories 1-4). An
errata file is a CSV with a header and two columns::

    qid,answer
    conv-26/q12,7 May 2023
    conv-30/q4,invalid

``answer`` is the corrected gold answer, or ``invalid`` (any case) to exclude the question from
every score. Applied by `apply_errata`: the question keeps its original gold in ``answer_original``,
``errata`` says ``corrected`` / ``invalid`` (empty otherwise), and scoring and the per-category
summary leave ``invalid`` questions out (their counts are reported, never silently dropped).
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from memlab.eval.scoring import score_answer

INVALID = "invalid"
COLUMNS = ("qid", "answer")


class ErrataError(ValueError):
    """An errata file is malformed (the message names the file, line and field)."""


@dataclass(frozen=True)
class Errata:
    """qid -> corrected answer, or None for an invalid (excluded) question."""

    path: str
    entries: dict[str, str | None] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def invalid(self) -> set[str]:
        return {q for q, a in self.entries.items() if a is None}

    @property
    def corrected(self) -> dict[str, str]:
        return {q: a for q, a in self.entries.items() if a is not None}

    def check_known(self, qids: Iterable[str]) -> None:
        """Fail on an errata qid the dataset does not have (a typo would otherwise correct nothing)."""
        known = set(qids)
        bad = sorted(q for q in self.entries if q not in known)
        if bad:
            raise ErrataError(f"{self.path}: {len(bad)} qid(s) not in the dataset, e.g. {bad[:5]}; "
                              f"qids look like 'conv-26/q0'")


def load_errata(path: str | Path) -> Errata:
    """Read and validate an errata CSV (see the module doc for the format)."""
    p = Path(path)
    if not p.is_file():
        raise ErrataError(f"{p}: errata file not found (scoring.errata)")
    try:
        text = p.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise ErrataError(f"{p}: not UTF-8 text ({e.reason} at byte {e.start})") from e
    rows = list(csv.reader(text.splitlines()))
    if not rows:
        raise ErrataError(f"{p}: empty; expected a header line 'qid,answer'")
    header = [h.strip().lower() for h in rows[0]]
    if tuple(header) != COLUMNS:
        raise ErrataError(f"{p}: line 1: header {rows[0]!r}; expected exactly 'qid,answer'")
    entries: dict[str, str | None] = {}
    for lineno, row in enumerate(rows[1:], start=2):
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) != 2:
            raise ErrataError(f"{p}: line {lineno}: {len(row)} field(s) {row!r}; expected 2 (qid, answer) - "
                              f"quote an answer that contains a comma")
        qid, answer = row[0].strip(), row[1].strip()
        if "/q" not in qid:
            raise ErrataError(f"{p}: line {lineno}: field qid = {qid!r}; expected '<sample_id>/q<index>'")
        if not answer:
            raise ErrataError(f"{p}: line {lineno}: field answer is empty for {qid}; give the corrected "
                              f"answer or 'invalid'")
        if qid in entries:
            raise ErrataError(f"{p}: line {lineno}: qid {qid} listed twice")
        entries[qid] = None if answer.lower() == INVALID else answer
    return Errata(path=str(p), entries=entries)


def apply_errata(frame: pd.DataFrame, errata: Errata | None) -> pd.DataFrame:
    """A copy with corrected gold answers and an ``errata`` column (``corrected`` / ``invalid`` / "")."""
    out = frame.copy()
    out["errata"] = ""
    if errata is None or not len(errata):
        return out
    if "answer_original" not in out.columns:
        out["answer_original"] = out["answer"]
    qids = out["qid"].astype(str)
    fixed = errata.corrected
    hit = qids.isin(list(fixed))
    out.loc[hit, "answer"] = qids[hit].map(fixed)
    out.loc[hit, "errata"] = "corrected"
    for col in ("answer_ceiling", "answer_bearing"):  # measured against the old gold: unknown, never stale
        if col in out.columns:
            out.loc[hit, col] = float("nan")
    out.loc[qids.isin(list(errata.invalid)), "errata"] = INVALID
    return out


def errata_counts(frame: pd.DataFrame) -> dict[str, int]:
    """How many questions of a scored frame were corrected / excluded by errata."""
    col = frame["errata"] if "errata" in frame.columns else pd.Series([], dtype=str)
    col = col.fillna("")
    return {"errata_corrected": int((col == "corrected").sum()), "errata_excluded": int((col == INVALID).sum())}


def errata_columns(frame: pd.DataFrame, groups: Iterable[object]) -> pd.DataFrame:
    """``errata_corrected`` / ``errata_excluded`` per summary row (a category number or "overall 1-4/1-5")."""
    rows = {}
    for g in groups:
        if isinstance(g, str) and g.startswith("overall"):
            lo, hi = (int(x) for x in g.split()[-1].split("-"))
            part = frame[frame["category"].between(lo, hi)]
        else:  # a category number (an int, or the summary's string index "1".."5")
            part = frame[frame["category"] == int(g)]
        rows[g] = errata_counts(part)
    return pd.DataFrame.from_dict(rows, orient="index")


def rescored(frame: pd.DataFrame, errata: Errata | str | Path | None) -> pd.DataFrame:
    """``frame`` (predictions) with ``errata`` (a file or `Errata`; None: unchanged) applied on top of any the run
    was scored with, each corrected gold's F1 rescored with the official metric."""
    if errata is None:
        return frame
    e = errata if isinstance(errata, Errata) else load_errata(errata)
    out = apply_errata(frame.drop(columns=["errata"], errors="ignore"), e)
    fixed = out["errata"] == "corrected"
    out.loc[fixed, "f1"] = [score_answer(str(p or ""), a, int(c)) for p, a, c in
                            zip(out.loc[fixed, "prediction"], out.loc[fixed, "answer"], out.loc[fixed, "category"])]
    return out
