"""An example extractor in one file, with a setting: every delta turn's first ``sentences`` sentences become
a fact.

Importing this module registers it as ``extraction.extractor: example-first-sentence``;
``extraction.params: {sentences: 2}`` sets its setting (the extraction cache key names it).
"""

from __future__ import annotations

import re
from typing import Annotated

from memlab.extract import ExtractionRequest, ExtractionResult, Extractor, MemoryOp
from memlab.extract.extractors import EXTRACTORS
from memlab.params import Range


@EXTRACTORS.register("example-first-sentence")
class FirstSentenceExtractor(Extractor):
    name = "example-first-sentence"
    reconciles = False
    reads_old_memories = False

    def __init__(self, sentences: Annotated[int, Range(1, 10)] = 1):
        self.sentences = sentences

    def extract(self, request: ExtractionRequest) -> ExtractionResult:
        ops = []
        for m in request.delta:
            first = " ".join(re.split(r"(?<=[.!?])\s+", m.text.strip())[:self.sentences])
            if first:
                ops.append(MemoryOp(action="add", text=f"{m.speaker}: {first}", kind="fact",
                                    participants=(m.speaker,) if m.speaker else (),
                                    source_ids=(m.id,) if m.id else ()))
        return ExtractionResult(ops=ops)
