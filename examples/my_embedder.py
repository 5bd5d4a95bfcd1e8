"""Your own embedder, in one file: character trigrams hashed into ``dim`` buckets (no model, no fit).

An embedder turns texts into one row of floats each; memlab's hybrid index puts those rows in FAISS for the
dense list and fuses it with the keyword list. Registered under a name, it is ``index.embedder`` in a config and
its settings are ``index.embedder.params``; its `embedder_id` (class and settings, by default) names its vectors
in the embedding cache, so two settings never share cached vectors. Run it from the repository root:

    python examples/my_embedder.py

It runs offline, in seconds, on the tiny LoCoMo-format file beside it (``examples/data/tiny_locomo.json``).
"""

from __future__ import annotations

import tempfile
import zlib
from pathlib import Path
from typing import Annotated

import numpy as np

from memlab.index.embedders import EMBEDDERS, Embedder, l2_normalize
from memlab.params import Range
from memlab.run import ExperimentConfig, run_experiment

DATA = Path(__file__).resolve().parent / "data" / "tiny_locomo.json"


# --8<-- [start:embedder]
@EMBEDDERS.register("my-trigrams")
class TrigramEmbedder(Embedder):
    """Counts of each text's lower-cased character trigrams, hashed into ``dim`` buckets, L2-normalised."""

    name = "my-trigrams"

    def __init__(self, dim: Annotated[int, Range(16, 8192)] = 256):
        self.dim = dim

    def embed(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            t = f"  {text.lower()} "
            for j in range(len(t) - 2):
                out[i, zlib.crc32(t[j:j + 3].encode()) % self.dim] += 1.0
        return l2_normalize(out)  # cosine similarity = inner product, as the FAISS index expects

# --8<-- [end:embedder]

def main() -> None:
    cfg = ExperimentConfig.from_dict({
        "name": "my-embedder", "dataset": {"path": str(DATA)}, "extraction": {"name": "turns"},
        "index": {"embedder": {"name": "my-trigrams", "params": {"dim": 512}}}, "retrieval": {"top_k": 3},
    })
    with tempfile.TemporaryDirectory() as results:
        run = run_experiment(cfg, results=results, progress=False)
        row = run.summary.loc["overall 1-5"]
        print(f"{cfg.index.embedder.name} (dim 512, top-3): F1 {row['f1']:.3f} [{row['f1_lo']:.3f}, "
              f"{row['f1_hi']:.3f}], "
              f"n {int(row['n'])}")


if __name__ == "__main__":
    main()
