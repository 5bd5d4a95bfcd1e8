"""Atomic file writes (temp file + rename): a kill never leaves half a file behind.

The result has the permissions any file the user creates gets (``0666 & ~umask``, e.g. 0644), not
the temp file's private 0600; a failed write removes its temp file and leaves the old file as it was.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pandas as pd


def _umask() -> int:
    """The process umask (read from /proc where it can be: setting it to read it races other threads)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[str]:
    """Yield a temp path beside ``path``; on success it replaces ``path`` (mode ``0666 & ~umask``),
    on any error it is deleted and ``path`` is untouched."""
    p = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)
    except OSError as e:  # name the file the caller wanted, not the temp name
        raise _naming(e, p) from e
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, p)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.errno is not None and e.filename in (None, tmp):
            raise _naming(e, p) from e  # a full disk mid-write names no file: say which one
        raise


def _naming(e: OSError, path: Path) -> OSError:
    """``e`` again, naming ``path`` (same type, errno and cause)."""
    if e.errno is None:
        return e
    try:
        return type(e)(e.errno, e.strerror, str(path))
    except TypeError:
        return OSError(e.errno, e.strerror, str(path))


def write_with(path: str | os.PathLike[str], writer: Callable[[IO[Any]], None], binary: bool = False) -> None:
    """Write through ``writer(file)`` atomically."""
    with atomic_path(path) as tmp, open(tmp, "wb" if binary else "w", encoding=None if binary else "utf-8") as f:
        writer(f)


def write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write a text file (UTF-8) atomically: a full disk leaves the old file, never half a new one."""
    write_with(path, lambda f: f.write(text))


def write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Write JSON atomically (temp file + rename) so a kill never leaves half a file."""

    def dump(f: IO[str]) -> None:
        json.dump(obj, f, indent=2, default=str)
        f.write("\n")

    write_with(path, dump)


def write_table(path: str | os.PathLike[str], frame: pd.DataFrame) -> None:
    """Write a CSV atomically."""
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=True)


def write_parquet(path: str | os.PathLike[str], frame: pd.DataFrame, index: bool = True) -> None:
    """Write a Parquet file atomically (pyarrow)."""
    with atomic_path(path) as tmp:
        frame.to_parquet(tmp, index=index)
