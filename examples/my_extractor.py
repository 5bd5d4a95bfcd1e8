"""Your own extractor, in one file: every turn's sentences of at least ``min_words`` words become one memory.

Registering the class under a name is all memlab needs: the config names it (``extraction.name``) and gives
its settings (``extraction.params``), which are checked against the constructor's declaration before any work,
become part of the extraction cache key, and are recorded in run.json. Run it from the repository root:

    python examples/my_extractor.py

It runs offline, in seconds, on the tiny LoCoMo-format file beside it (``examples/data/tiny_locomo.json``).
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Annotated

from memlab.extract import ExtractionRequest, ExtractionResult, Extractor, MemoryOp
from memlab.extract.extractors import EXTRACTORS
from memlab.params import Range
from memlab.run import ExperimentConfig, run_experiment

DATA = Path(__file__).resolve().parent / "data" / "tiny_locomo.json"


# --8<-- [start:extractor]
@EXTRACTORS.register("my-long-sentences")
class LongSentences(Extractor):
    """One fact per turn: its sentences of at least ``min_words`` words (short chit-chat is left out)."""

    name = "my-long-sentences"
    reconciles = False  # it only adds: reconcile (merging near-duplicates against old memories) is not asked for
    reads_old_memories = False  # it does not need the key's existing memories in its request

    def __init__(self, min_words: Annotated[int, Range(1, 50)] = 4):
        self.min_words = min_words  # the constructor only stores its settings, each under its own name

    def extract(self, request: ExtractionRequest) -> ExtractionResult:
        ops = []
        for m in request.delta:  # the messages not yet extracted, oldest first
            kept = [s for s in re.split(r"(?<=[.!?])\s+", m.text.strip()) if len(s.split()) >= self.min_words]
            if kept:
                ops.append(MemoryOp(action="add", text=f"{m.speaker}: {' '.join(kept)}", kind="fact",
                                    participants=(m.speaker,) if m.speaker else (),
                                    source_ids=(m.id,) if m.id else ()))  # provenance: which turn it came from
        return ExtractionResult(ops=ops)

# --8<-- [end:extractor]

def main() -> None:
    cfg = ExperimentConfig.from_dict({
        "name": "my-extractor", "dataset": {"path": str(DATA)},
        "extraction": {"name": "my-long-sentences", "params": {"min_words": 5}},
    })
    with tempfile.TemporaryDirectory() as results:
        run = run_experiment(cfg, results=results, progress=False)
        row = run.summary.loc["overall 1-5"]
        print(f"{cfg.extraction.name} (min_words 5): F1 {row['f1']:.3f} [{row['f1_lo']:.3f}, "
              f"{row['f1_hi']:.3f}], n {int(row['n'])}; memories written: {run.info['extraction']['ops_applied']}")


if __name__ == "__main__":
    main()
