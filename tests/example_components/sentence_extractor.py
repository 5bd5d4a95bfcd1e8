"""An example extractor in one file: every delta turn's first sentence becomes a fact.

Importing this module registers it as ``extraction.extractor: example-first-sentence``.
"""

from __future__ import annotations

import re

from memlab.extract import ExtractionRequest, ExtractionResult, Extractor, MemoryOp
from memlab.extract.extractors import EXTRACTORS


@EXTRACTORS.register("example-first-sentence")
class FirstSentenceExtractor(Extractor):
    name = "example-first-sentence"
    reconciles = False
    reads_old_memories = False

    def extract(self, request: ExtractionRequest) -> ExtractionResult:
        ops = []
        for m in request.delta:
            first = re.split(r"(?<=[.!?])\s+", m.text.strip())[0]
            if first:
                ops.append(MemoryOp(action="add", text=f"{m.speaker}: {first}", kind="fact",
                                    participants=(m.speaker,) if m.speaker else (),
                                    source_ids=(m.id,) if m.id else ()))
        return ExtractionResult(ops=ops)
