"""Your own memory system, in one file: it keeps every message of a session as one memory and searches them by
BM25, with the session window around each hit (``window`` messages either side) in the memory's text.

A memory system replaces memlab's whole memory pipeline (extraction, store, index): it ``ingest``s a user key's
sessions, message by message, and answers ``search(key, query, k)`` with hits. The answer arms search it through
the same seam as memlab's own store, with the same ``retrieval.top_k``, so two runs differ only in the system.
A hit that says which dialog turns it came from (``source_ids``) gets exact evidence recall and attribution; one
that does not gets provenance recovered by aligning it to the session's turns, marked ``recovered``. Registered
under a name, it is ``system.name`` in a config and its settings are ``system.params``. Run it from the
repository root:

    python examples/my_memory_system.py

It runs offline, in seconds, on the tiny LoCoMo-format file beside it (``examples/data/tiny_locomo.json``).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

from rank_bm25 import BM25Okapi

from memlab.index.text import analyze
from memlab.memory import UserKey
from memlab.params import Range
from memlab.run import ExperimentConfig, run_experiment
from memlab.systems import SYSTEMS, MemorySystem, Message, SystemHit

DATA = Path(__file__).resolve().parent / "data" / "tiny_locomo.json"


# --8<-- [start:system]
@SYSTEMS.register("my-windowed-bm25")
class WindowedBM25(MemorySystem):
    """Each message with its ``window`` neighbours as one memory, ranked by BM25 over the message alone."""

    name = "my-windowed-bm25"

    def __init__(self, window: Annotated[int, Range(0, 5)] = 1):
        self.window = window
        self._hits: dict[UserKey, list[SystemHit]] = {}
        self._index: dict[UserKey, BM25Okapi] = {}

    def ingest(self, key: UserKey, session: str, messages: list[Message]) -> None:
        hits = self._hits.setdefault(key, [])
        for i, m in enumerate(messages):
            around = messages[max(0, i - self.window):i + self.window + 1]
            text = " ".join(f"{n.speaker}: {n.text}" for n in around)
            hits.append(SystemHit(memory_id=f"{session}/{m.turn_id}", text=text, session=session, time=m.time,
                                  source_ids=(m.turn_id,), participants=(m.speaker,),
                                  metadata={"message": m.text}))
        self._index.pop(key, None)  # rebuilt on the next search

    def search(self, key: UserKey, query: str, k: int) -> list[SystemHit]:
        hits = self._hits.get(key, [])
        if not hits:
            return []
        if key not in self._index:
            self._index[key] = BM25Okapi([list(analyze(h.metadata["message"])) or ["_"] for h in hits])
        scores = self._index[key].get_scores(list(analyze(query)))
        order = sorted(range(len(hits)), key=lambda i: (-scores[i], i))[:k]
        return [SystemHit(**{**h.__dict__, "score": float(scores[i])}) for i in order for h in [hits[i]]]

    def memories(self, key: UserKey) -> list[SystemHit]:
        return list(self._hits.get(key, []))  # what it stored: the memory trace and attribution read it

    def features(self) -> dict[str, object]:
        return {"ranking": "bm25 over the message", "window": self.window}  # recorded in run.json

# --8<-- [end:system]

def main() -> None:
    cfg = ExperimentConfig.from_dict({
        "name": "my-system", "dataset": {"path": str(DATA)},
        "system": {"name": "my-windowed-bm25", "params": {"window": 1}}, "retrieval": {"top_k": 3},
    })
    with tempfile.TemporaryDirectory() as results:
        run = run_experiment(cfg, results=results, progress=False)
        row = run.summary.loc["overall 1-5"]
        print(f"{cfg.system.name} (window 1, top-3): F1 {row['f1']:.3f} [{row['f1_lo']:.3f}, {row['f1_hi']:.3f}], "
              f"evidence recall in the context {row['context_recall']:.3f}, n {int(row['n'])}; "
              f"provenance {run.info['system']['provenance']}")


if __name__ == "__main__":
    main()
