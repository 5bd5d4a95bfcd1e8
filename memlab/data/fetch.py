"""Where the LoCoMo file lives and how memlab gets it (download verified by sha256)."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

LOCOMO_URL = "https://raw.githubusercontent.com/snap-research/locomo/main/data/locomo10.json"
LOCOMO_SHA256 = "79fa87e90f04081343b8c8debecb80a9a6842b76a7aa537dc9fdf651ea698ff4"
ENV_VAR = "MEMLAB_LOCOMO"

HOW_TO_GET = (
    "LoCoMo-10 (CC BY-NC 4.0) is not bundled with memlab. Get it with one of:\n"
    "  memlab data fetch                      # downloads to ~/.cache/memlab/locomo10.json, checks sha256\n"
    f"  export {ENV_VAR}=/path/to/locomo10.json  # a copy you already have\n"
    f"Source: {LOCOMO_URL}"
)


class DataNotFoundError(FileNotFoundError):
    """No LoCoMo file at any of the places memlab looks."""


class ChecksumMismatchError(ValueError):
    """A downloaded file does not have the expected sha256; nothing was written."""


def default_cache_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "memlab" / "locomo10.json"


def resolve_locomo_path(path: str | os.PathLike[str] | None = None) -> Path:
    """An explicit path, else ``$MEMLAB_LOCOMO``, else the user cache; the first that is given wins."""
    if path is not None:
        p, origin = Path(path), "the path given"
    elif os.environ.get(ENV_VAR):
        p, origin = Path(os.environ[ENV_VAR]), f"${ENV_VAR}"
    else:
        p, origin = default_cache_path(), "the user cache"
    if not p.is_file():
        raise DataNotFoundError(f"no LoCoMo file at {p} ({origin}).\n{HOW_TO_GET}")
    return p


def sha256_file(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_locomo(
    dest: str | os.PathLike[str] | None = None,
    url: str = LOCOMO_URL,
    sha256: str = LOCOMO_SHA256,
    timeout: float = 60.0,
    force: bool = False,
) -> Path:
    """Download LoCoMo-10 to ``dest`` atomically; refuse (and keep any existing file) on a hash mismatch."""
    target = Path(dest) if dest is not None else default_cache_path()
    return _download(url, target, sha256, timeout, force, HOW_TO_GET)


def _download(url: str, target: Path, sha256: str | None, timeout: float, force: bool, how: str) -> Path:
    """``url`` to ``target`` atomically, checked against ``sha256`` (None: not checked)."""
    import urllib.error  # here, not at the top: urllib.request pulls in http.client and email (~0.1 s of every
    import urllib.request  # CLI start-up, which imports this module through memlab.data)

    if target.is_file() and not force and sha256 is not None and sha256_file(target) == sha256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(prefix=f".{target.stem}.", suffix=".part", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            try:
                with urllib.request.urlopen(url, timeout=timeout) as resp:
                    for chunk in iter(lambda: resp.read(1 << 16), b""):
                        h.update(chunk)
                        out.write(chunk)
            except (urllib.error.URLError, OSError) as e:
                raise ConnectionError(f"could not download {url}: {e}.\n{how}") from e
            out.flush()
            os.fsync(out.fileno())
        got = h.hexdigest()
        if sha256 is not None and got != sha256:
            raise ChecksumMismatchError(
                f"refusing {url}: sha256 {got} does not match the expected {sha256}; "
                f"{target} was left as it was.\n{how}"
            )
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target

# ------------------------------------------------------------------------------ LongMemEval
#: The cleaned release on Hugging Face, at the revision whose files the digests below describe.
LONGMEMEVAL_REVISION = "98d7416c24c778c2fee6e6f3006e7a073259d48f"
LONGMEMEVAL_BASE = f"https://huggingface.co/datasets/xiaowu0162/longmemeval-cleaned/resolve/{LONGMEMEVAL_REVISION}/"
#: variant -> (file name in the cleaned release, sha256, size in bytes). The digests are not from Hugging Face
#: itself (no network here): they were read from many independent public projects that pin the same files
#: (several citing the Hugging Face file pages' LFS metadata at this revision), all agreeing. A download that
#: does not match is refused (nothing written), naming both digests.
LONGMEMEVAL_FILES: dict[str, tuple[str, str | None, int | None]] = {
    "longmemeval-s": ("longmemeval_s_cleaned.json",
                      "d6f21ea9d60a0d56f34a05b609c79c88a451d2ae03597821ea3d5a9678c3a442", 277_383_467),
    "longmemeval-m": ("longmemeval_m_cleaned.json",
                      "9d79e5524794a2e6900a3aa9cb7d9152c5a3e8319c9a87c25494ba1eacee495f", 2_737_100_077),
    "longmemeval-oracle": ("longmemeval_oracle.json",
                           "821a2034d219ab45846873dd14c14f12cfe7776e73527a483f9dac095d38620c", 15_388_478),
}
LONGMEMEVAL_HOW = (
    "LongMemEval (MIT licence, xiaowu0162/LongMemEval; the cleaned release on Hugging Face) is not bundled.\n"
    "  memlab data fetch longmemeval-s                  # verified against the pinned sha256\n"
    "  memlab data fetch longmemeval-s --sha256 <hex>   # verify against a checksum you trust instead\n"
    "  memlab data fetch longmemeval-s --unpinned       # another release or mirror: download, print its sha256\n"
    "then run with  --set dataset.path=<file>  (run.json records the file's sha256)."
)


class ChecksumNotPinnedError(ValueError):
    """No sha256 is pinned for a download and the caller did not accept an unverified one."""


def longmemeval_cache_path(variant: str) -> Path:
    return default_cache_path().parent / LONGMEMEVAL_FILES[variant][0]


def fetch_longmemeval(variant: str, dest: str | os.PathLike[str] | None = None, sha256: str | None = None,
                      unpinned: bool = False, timeout: float = 600.0, force: bool = False,
                      base_url: str = LONGMEMEVAL_BASE) -> Path:
    """Download one LongMemEval variant (``longmemeval-s|-m|-oracle``), verified by ``sha256`` (given) or else
    the digest pinned in `LONGMEMEVAL_FILES`; ``unpinned=True`` downloads without either (another release, or
    a mirror's own copy: the caller prints and records the file's sha256). Nothing is written on a mismatch.
    ``base_url``: a mirror of the release."""
    if variant not in LONGMEMEVAL_FILES:
        raise ValueError(f"LongMemEval variant {variant!r}: expected one of {', '.join(LONGMEMEVAL_FILES)}")
    name, pinned, _ = LONGMEMEVAL_FILES[variant]
    want = sha256 or (None if unpinned else pinned)
    if want is None and not unpinned:
        raise ChecksumNotPinnedError(f"{variant}: no sha256 is pinned for {base_url}{name} in this memlab.\n"
                                     f"{LONGMEMEVAL_HOW}")
    target = Path(dest) if dest is not None else longmemeval_cache_path(variant)
    return _download(base_url + name, target, want, timeout, force, LONGMEMEVAL_HOW)
