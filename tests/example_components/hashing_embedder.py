"""An example embedder in one file, with a setting: words hashed into ``dim`` buckets (no fit, no model).

Importing this module registers it as ``index.embedder: example-hashing``; ``index.embedder_params: {dim: 32}``
sets its one setting, checked against the range declared beside the parameter.
"""

from __future__ import annotations

import zlib
from typing import Annotated

import numpy as np

from memlab.index.embedders import EMBEDDERS, Embedder, l2_normalize
from memlab.index.text import analyze
from memlab.params import Range


@EMBEDDERS.register("example-hashing")
class HashingEmbedder(Embedder):
    name = "example-hashing"

    def __init__(self, dim: Annotated[int, Range(8, 4096)] = 64):
        self.dim = dim

    def embed(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in analyze(text):
                out[i, zlib.crc32(word.encode()) % self.dim] += 1.0
        return l2_normalize(out)
