"""Streaming: what a run whose every question has its own haystack (LongMemEval) does differently. The engine
(`memlab.run.engine`) plans such a run in waves of keys, and releases each key's index from memory after its last
question (building every key first would hold 500 haystacks' vectors and fits at once; memory now holds a wave).

The results are those of a staged run: each key's memories, index and answers depend on that key alone. What the
staged run keeps in the one saved index file (`HybridIndex.save` at close) a streamed run keeps per key, beside it
(``index-keys/<digest>.npz``, the saved-index format of `memlab.memory.shipping.export_index`), so that a rerun
on the cached extraction reads back the very fit the extraction built, one key at a time.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from memlab.atomic import write_with
from memlab.data import LoCoMo, dataset_name
from memlab.data.longmemeval import forget_haystack
from memlab.index.text import analyze
from memlab.memory import MemoryService, ReleasesKeys
from memlab.memory.shipping import export_index
from memlab.threads import return_free_memory

KEY_INDEX_DIR = "index-keys"


def streams(data: LoCoMo) -> bool:
    """Whether a run over ``data`` streams its keys: a dataset whose every question has its own haystack
    (LongMemEval). LoCoMo (ten conversations, many questions each) keeps the staged run."""
    return dataset_name(data) == "longmemeval"


def key_index_path(cdir: Path, key: Any) -> Path:
    """Where a streamed run keeps one key's saved index in the extraction cache folder ``cdir``."""
    digest = hashlib.sha256(f"{key.app_name}\x00{key.user_id}".encode()).hexdigest()[:24]
    return cdir / KEY_INDEX_DIR / f"{digest}.npz"


def save_key_index(cdir: Path, key: Any, blob: bytes) -> None:
    """Keep a key's fitted index state (`memlab.memory.shipping.export_index`) in its file (`key_index_path`)."""
    saved = key_index_path(cdir, key)
    saved.parent.mkdir(exist_ok=True)
    write_with(saved, lambda f: f.write(blob), binary=True)


def key_index_blob(svc: MemoryService, cdir: Path, key: Any) -> bytes | None:
    """A key's fitted index state: what a streamed run saved for it (the fit its extraction built), else the live
    one (None: neither). Whoever imports it checks it against the store's rows (`shipping.import_index`), so
    a file saved for other rows is not used (the key is then built from the rows)."""
    saved = key_index_path(cdir, key)
    return saved.read_bytes() if saved.is_file() else export_index(svc, key)


def release_key(svc: MemoryService, key: Any) -> None:
    """Drop a key's index state from memory (its rows stay in the store), and empty the stemming cache
    (`memlab.index.text.analyze` keeps up to 200,000 analysed texts: a released key's texts are not seen again,
    and an M question's 5,000 would otherwise stay, ~20 MB a question until the cache is full) and the parsed
    haystack the dataset keeps (`forget_haystack`: the next is parsed with none alive); the freed heap goes back
    to the system (`return_free_memory`)."""
    if isinstance(svc.searcher, ReleasesKeys):  # a searcher that cannot drop a key keeps it
        svc.searcher.release(key)
    analyze.cache_clear()
    forget_haystack()
    return_free_memory()


def resident_keys(svc: MemoryService) -> int:
    """How many keys the service's index holds in memory now."""
    return len(svc.searcher.keys()) if svc.searcher is not None else 0
