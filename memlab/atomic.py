"""Atomic file writes (temp file + rename): a kill never leaves half a file behind."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd


def write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Write JSON atomically (temp file + rename) so a kill never leaves half a file."""
    p = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, default=str)
        f.write("\n")
    os.replace(tmp, p)


def write_table(path: str | os.PathLike[str], frame: pd.DataFrame) -> None:
    """Write a CSV atomically."""
    p = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)
    os.close(fd)
    frame.to_csv(tmp, index=True)
    os.replace(tmp, p)


def write_parquet(path: str | os.PathLike[str], frame: pd.DataFrame, index: bool = True) -> None:
    """Write a Parquet file atomically (pyarrow)."""
    p = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)
    os.close(fd)
    try:
        frame.to_parquet(tmp, index=index)
        os.replace(tmp, p)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
