"""A completed run's output files and their sha256 (run.json ``outputs``): recorded when the run completes,
verified before its numbers are served again (`memlab.run.results.load_run` for the tables it reads, a reuse for
every file), and the only files a reuse copies.

A run folder may come from elsewhere, so a file is opened without following a link at any step of its path, and
only a regular file is read: a crafted ``traces/x -> /etc/passwd`` or ``traces/zero -> /dev/zero`` is an error
naming it, never read, copied or hashed.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from memlab.run.records import RunFileError
from memlab.rundir import LOCK_FILE

#: Files of a run folder that are no output: run.json holds the digests, the lock is the folder's.
NOT_OUTPUTS = frozenset({"run.json", LOCK_FILE})
_CHUNK = 1 << 20


def open_regular(root: Path, rel: str) -> int:
    """A read-only descriptor of ``root/rel``: a path inside ``root`` whose every step is a real folder (no link)
    and whose file is a regular one (no link, device or pipe); else a `RunFileError` naming it."""
    parts = PurePosixPath(rel).parts
    where = root / rel
    if not parts or PurePosixPath(rel).is_absolute() or any(p in ("..", ".") for p in parts):
        raise RunFileError(f"{where}: not a path inside the run folder")
    nofollow = os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    dfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            try:
                nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | nofollow, dir_fd=dfd)
            except OSError as e:
                raise _refused(e, where) from None
            os.close(dfd)
            dfd = nfd
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NONBLOCK | nofollow, dir_fd=dfd)
        except OSError as e:
            raise _refused(e, where) from None
    finally:
        os.close(dfd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise RunFileError(f"{where}: not a regular file (a device, pipe or folder); a run's files are never read "
                           f"from one")
    return fd


def _refused(e: OSError, where: Path) -> Exception:
    if e.errno in (errno.ELOOP, errno.ENOTDIR):
        return RunFileError(f"{where}: a symbolic link (or a path through one); a run's files are never read "
                            f"through a link")
    if e.errno == errno.ENOENT:
        return RunFileError(f"{where}: missing")
    return e


def digest(root: Path, rel: str) -> str:
    """The sha256 of a run's file (`open_regular`)."""
    h = hashlib.sha256()
    with os.fdopen(open_regular(root, rel), "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def record_outputs(run_dir: Path) -> dict[str, str]:
    """sha256 of every regular file under ``run_dir`` (links and anything else left out), by relative path."""
    out: dict[str, str] = {}
    for here, dirs, files in os.walk(run_dir, followlinks=False):
        dirs.sort()
        for name in sorted(files):
            p = Path(here) / name
            rel = p.relative_to(run_dir).as_posix()
            if rel not in NOT_OUTPUTS and stat.S_ISREG(os.lstat(p).st_mode):
                out[rel] = digest(run_dir, rel)
    return out


def verify_outputs(run_dir: Path, outputs: dict[str, str] | None, names: Iterable[str] | None = None) -> None:
    """Each recorded output (or those of ``names`` that were recorded) still has its sha256; else a `RunFileError`
    naming the file (a table edited after the run completed must never be served as its result)."""
    if not outputs:
        return  # a run written before memlab recorded its outputs: nothing to compare with
    for rel in (outputs if names is None else [n for n in names if n in outputs]):
        now = digest(run_dir, rel)
        if now != outputs[rel]:
            raise RunFileError(f"{run_dir / rel}: changed since the run completed (sha256 {now[:12]}…, recorded "
                               f"{outputs[rel][:12]}…); its numbers are not the run's: rerun it (or resume it after "
                               f"deleting the file)")


def copy_outputs(src: Path, dst: Path, outputs: dict[str, str], skip: Iterable[str] = ()) -> None:
    """Copy ``src``'s recorded outputs (not those in ``skip``) into ``dst``, each read as `open_regular` reads it
    and checked against its recorded sha256 as it is copied (a file changed since is an error naming it)."""
    skipped = set(skip)
    for rel, want in outputs.items():
        if rel in skipped:
            continue
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        h = hashlib.sha256()
        with os.fdopen(open_regular(src, rel), "rb") as f, open(target, "xb") as out:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
                out.write(chunk)
        if h.hexdigest() != want:
            raise RunFileError(f"{src / rel}: changed since the run completed (sha256 {h.hexdigest()[:12]}…, "
                               f"recorded {want[:12]}…); not copied")
