"""Run folders under ``results/<run_id>/``: ids, environment capture and atomic table writes."""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd

TRACKED_PACKAGES = (
    "memlab", "numpy", "scipy", "scikit-learn", "faiss-cpu", "pandas", "litellm", "nltk", "regex", "pyyaml",
)


def results_root() -> Path:
    return Path(os.environ.get("MEMLAB_RESULTS", "results"))


def new_run_dir(name: str, root: str | os.PathLike[str] | None = None) -> Path:
    """A fresh ``<root>/<name>-<UTC timestamp>`` folder (a suffix is added if that exists)."""
    base = Path(root) if root is not None else results_root()
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    path = base / f"{name}-{stamp}"
    n = 1
    while path.exists():
        n += 1
        path = base / f"{name}-{stamp}-{n}"
    path.mkdir(parents=True)
    return path


def environment() -> dict[str, Any]:
    versions = {}
    for pkg in TRACKED_PACKAGES:
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "packages": versions,
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


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
