"""The saved-index format of `memlab.index.hybrid.HybridIndex`: what is kept of a key (embedder fit, vectors),
the file (NumPy ``.npz`` with a JSON manifest, every part checksummed; no pickle) and its checks.

FAISS and keyword structures are rebuilt from the vectors on load (milliseconds at LoCoMo size); what is kept
is what costs: the embedder fit and the embeddings. A key's saved state is used only for exactly the rows it
was built from (`entries_fingerprint`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from memlab.atomic import write_with
from memlab.index.ranking import KeyState
from memlab.memory.entry import MemoryEntry, UserKey

#: Version of the saved-index format; a file of another version is ignored and rebuilt.
INDEX_FORMAT = 4
#: The `HybridIndex` settings format 4 was fixed with, written into every manifest under these names (the factory
#: string was then called ``index``); a setting added since is written only when it is not at its default, so an
#: index saved before it still matches. Frozen: the settings themselves are the constructor's (`memlab.params`).
MANIFEST_FIRST = ("embedder", "factory", "keyword", "embedder_params", "date_in_text", "append_citing", "ef_search",
                  "ef_construction")
MANIFEST_NAMES = {"factory": "index"}
#: The same for a run's index file name (`memlab.run.config_sections.IndexConfig.file_key`): the config keys
#: hashed into it before any setting was added (embedder, keyword and sparse by name, their settings apart).
FILE_FIRST = ("embedder", "factory", "keyword", "date_in_text", "append_citing", "ef_search", "ef_construction")


@dataclass
class SavedKey:
    """A key as read from a saved index, used once the store's rows are known to match it."""

    fingerprint: str
    fit_n: int
    fit_version: int
    ids: list[str]
    hashes: list[str]
    vfit: list[int]
    vectors: np.ndarray
    embedder_meta: dict[str, Any] | None
    embedder_arrays: dict[str, np.ndarray]


class BadIndexFile(Exception):
    """A saved index that cannot be used (unreadable, truncated, another version, a failed checksum)."""


def entries_fingerprint(entries: list[MemoryEntry]) -> str:
    """sha256 over a key's memories (every field): a saved index is used only for exactly these rows."""
    h = hashlib.sha256()
    for e in sorted(entries, key=lambda e: e.id):
        h.update(json.dumps([e.id, e.text, e.kind, list(e.topics), str(e.event_time), list(e.participants),
                             e.location, list(e.source_ids), str(e.created_at), str(e.updated_at)]
                            ).encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def text_hash(text: str) -> str:
    """What a key's saved vector records of the text it embeds (a changed text is embedded again)."""
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def frozen_key(settings: Mapping[str, Any], defaults: Mapping[str, Any], first: tuple[str, ...],
               names: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``settings`` as a saved format names them: those in ``first`` always, any other only when it is not at its
    default (an index written before that setting existed still matches), renamed by ``names``."""
    names = names or {}
    return {names.get(k, k): v for k, v in settings.items() if k in first or v != defaults.get(k)}


def manifest_settings(index: Any) -> dict[str, Any]:
    """The settings a saved index must have been written with: the index's `cache_params` (its constructor's
    settings, paths left out) in the format's names, the embedder by its id; never a credential."""
    from memlab.params import param_specs

    params = index.cache_params()
    if not isinstance(params["embedder"], str):
        params["embedder"] = params["embedder"].embedder_id
    params["embedder_params"] = {k: v for k, v in (params["embedder_params"] or {}).items()
                                 if k != "api_key"}  # never written to disk
    defaults = {n: s.default for n, s in param_specs(type(index)).items()}
    return frozen_key(params, defaults, MANIFEST_FIRST, MANIFEST_NAMES)


def saved_key(st: KeyState) -> SavedKey | None:
    """What is kept of a built key; None when it is not built from the store's current rows, or its
    corpus-fitted embedder cannot give its fit (nothing trustworthy to save)."""
    if st.dirty or st.stale:
        return None
    fitted = st.embedder.fitted_state() if st.embedder is not None and st.embedder.needs_fit else None
    if st.embedder is not None and st.embedder.needs_fit and fitted is None and st.rows:
        return None
    ids = [e.id for e in st.rows]
    mat = st.matrix if st.matrix is not None and ids else np.zeros((0, 0))
    return SavedKey(
        fingerprint=entries_fingerprint(list(st.entries.values())), fit_n=st.fit_n,
        fit_version=st.fit_version, ids=ids, hashes=[st.vectors[i][0] for i in ids],
        vfit=[int(st.vectors[i][1]) for i in ids],
        vectors=np.asarray(mat, dtype=np.float32), embedder_meta=None if fitted is None else fitted[0],
        embedder_arrays={} if fitted is None else fitted[1])


def write_index(target: Path, config: dict[str, Any], saved: Mapping[UserKey, SavedKey]) -> Path:
    """Write ``saved`` under the index settings ``config`` (atomic): a JSON manifest (format version,
    settings, per-key fingerprint of the store's rows) and a sha256 of the manifest and of every array."""
    target.parent.mkdir(parents=True, exist_ok=True)
    keys: list[dict[str, Any]] = []
    arrays: dict[str, np.ndarray] = {}
    in_order = sorted(saved.items(), key=lambda kv: (kv[0].app_name, kv[0].user_id))  # whatever order keys built in
    for i, (key, sk) in enumerate(in_order):
        prefix = f"k{i}"
        arrays[f"{prefix}.vectors"] = sk.vectors
        for name, arr in sk.embedder_arrays.items():
            arrays[f"{prefix}.emb.{name}"] = np.asarray(arr)
        keys.append({"app_name": key.app_name, "user_id": key.user_id, "prefix": prefix,
                     "fingerprint": sk.fingerprint, "fit_n": sk.fit_n, "fit_version": sk.fit_version,
                     "ids": sk.ids, "hashes": sk.hashes, "vfit": sk.vfit, "embedder_meta": sk.embedder_meta,
                     "embedder_arrays": sorted(sk.embedder_arrays)})
    manifest = {"format": "memlab-index", "version": INDEX_FORMAT, "config": config, "keys": keys,
                "sha256": {name: array_sha(arr) for name, arr in arrays.items()}}
    mbytes = json.dumps(manifest, sort_keys=True).encode("utf-8", "surrogatepass")
    arrays["manifest"] = np.frombuffer(mbytes, dtype=np.uint8)
    arrays["manifest_sha256"] = np.frombuffer(hashlib.sha256(mbytes).hexdigest().encode("ascii"), dtype=np.uint8)
    write_with(target, lambda f: np.savez(f, **arrays), binary=True)
    return target


def read_index(path: str | os.PathLike[str], config: dict[str, Any]) -> dict[UserKey, SavedKey] | None:
    """The keys of a saved index written with the settings ``config``; None when it was written with others
    (not corrupt, just not this index). A bad file raises `BadIndexFile`."""
    manifest, arrays = read_index_file(path)
    if manifest.get("config") != config:
        return None
    out = {}
    for k in manifest["keys"]:
        pre = k["prefix"]
        out[UserKey(k["app_name"], k["user_id"])] = SavedKey(
            fingerprint=k["fingerprint"], fit_n=int(k["fit_n"]), fit_version=int(k["fit_version"]),
            ids=list(k["ids"]), hashes=list(k["hashes"]), vfit=[int(x) for x in k["vfit"]],
            vectors=arrays[f"{pre}.vectors"], embedder_meta=k["embedder_meta"],
            embedder_arrays={n: arrays[f"{pre}.emb.{n}"] for n in k["embedder_arrays"]})
    return out


def array_sha(arr: np.ndarray) -> str:
    a = np.ascontiguousarray(arr)
    return hashlib.sha256(f"{a.dtype.str}{a.shape}".encode() + a.tobytes()).hexdigest()


def read_index_file(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The manifest and arrays of a saved index, every checksum verified (`BadIndexFile` says what is wrong)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {name: z[name] for name in z.files}
    except Exception as e:  # zipfile.BadZipFile, CRC errors, truncation, ValueError on object arrays
        raise BadIndexFile(f"unreadable ({type(e).__name__}: {str(e)[:120]})") from None
    if "manifest" not in arrays or "manifest_sha256" not in arrays:
        raise BadIndexFile("no manifest (not a memlab index file)")
    mbytes = arrays.pop("manifest").tobytes()
    if hashlib.sha256(mbytes).hexdigest().encode("ascii") != arrays.pop("manifest_sha256").tobytes():
        raise BadIndexFile("manifest fails its sha256")
    try:
        manifest = json.loads(mbytes)
    except ValueError as e:
        raise BadIndexFile(f"manifest is not JSON ({e})") from None
    if manifest.get("format") != "memlab-index" or manifest.get("version") != INDEX_FORMAT:
        raise BadIndexFile(f"format {manifest.get('format')!r} version {manifest.get('version')!r}, "
                           f"this memlab reads memlab-index version {INDEX_FORMAT}")
    sums = manifest.get("sha256", {})
    if set(sums) != set(arrays):
        raise BadIndexFile("arrays do not match the manifest")
    for name, arr in arrays.items():
        if array_sha(arr) != sums[name]:
            raise BadIndexFile(f"array {name} fails its sha256")
    return manifest, arrays
