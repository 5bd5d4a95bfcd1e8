"""A smaller LoCoMo file: some conversations, their first sessions, the questions those sessions answer.

A model run on a 135M-parameter CPU model extracts about a session every ten seconds; a test, a notebook or a
first try wants minutes, not the whole benchmark. The cut is a LoCoMo-format file of its own (with its own
sha256, so every cache keyed by the dataset keeps it apart from the full file), written where the caller
says: LoCoMo is CC BY-NC, so a cut is the user's copy, never a file memlab ships.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from memlab.data.locomo import LoCoMoFormatError, recover_evidence_ids

_SESSION_KEY = re.compile(r"^session_(\d+)(_date_time)?$")
_INDEXED = {"observation": re.compile(r"^session_(\d+)_observation$"),
            "session_summary": re.compile(r"^session_(\d+)_summary$"),
            "event_summary": re.compile(r"^events_session_(\d+)$")}


def _session_of(dia_id: str) -> int | None:
    m = re.fullmatch(r"D(\d+):\d+", dia_id)
    return int(m.group(1)) if m else None


def cut_sample(sample: dict[str, Any], sessions: int) -> dict[str, Any]:
    """One LoCoMo sample with only its first ``sessions`` sessions, their annotations, and the questions whose
    every evidence turn lies in them (a question without a usable evidence id is dropped: it cannot be told
    which sessions it needs)."""
    conv = sample["conversation"]
    keep = {k: v for k, v in conv.items()
            if not _SESSION_KEY.match(k) or int(_SESSION_KEY.match(k).group(1)) <= sessions}
    out = dict(sample, conversation=keep)
    for key, pattern in _INDEXED.items():
        if isinstance(sample.get(key), dict):
            out[key] = {k: v for k, v in sample[key].items()
                        if not pattern.match(k) or int(pattern.match(k).group(1)) <= sessions}
    qa = []
    for q in sample.get("qa", []):
        ids = [i for raw in q.get("evidence", []) for i in recover_evidence_ids(str(raw))]
        where = [_session_of(i) for i in ids]
        if ids and all(s is not None and s <= sessions for s in where):
            qa.append(q)
    out["qa"] = qa
    return out


def cut_locomo(src: str | os.PathLike[str], dest: str | os.PathLike[str], conversations: list[str],
               sessions: int) -> Path:
    """Write to ``dest`` the LoCoMo file ``src`` cut to ``conversations`` (sample ids, in the file's order) and
    each one's first ``sessions`` sessions (`cut_sample`); returns ``dest``. An unknown sample id, or a cut that
    leaves a conversation no question, is a `LoCoMoFormatError` naming it."""
    if isinstance(sessions, bool) or not isinstance(sessions, int) or sessions < 1:
        raise ValueError(f"sessions = {sessions!r}; expected an integer >= 1")
    src = Path(src)
    data = json.loads(src.read_text(encoding="utf-8"))
    if not isinstance(data, list):
        raise LoCoMoFormatError(f"{src}: expected a JSON list of LoCoMo samples")
    known = [s.get("sample_id") for s in data if isinstance(s, dict)]
    missing = [c for c in conversations if c not in known]
    if missing:
        raise LoCoMoFormatError(f"{src}: no sample {', '.join(missing)}; samples: {', '.join(map(str, known))}")
    out = [cut_sample(s, sessions) for s in data if isinstance(s, dict) and s.get("sample_id") in conversations]
    empty = [s["sample_id"] for s in out if not s["qa"]]
    if empty:
        raise LoCoMoFormatError(f"{src}: the first {sessions} session(s) of {', '.join(empty)} answer no question; "
                                f"keep more sessions")
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".tmp")
    tmp.write_text(json.dumps(out), encoding="utf-8")
    os.replace(tmp, dest)
    return dest
