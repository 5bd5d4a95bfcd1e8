"""One place that sizes every native thread pool memlab drives (``run.threads``).

On a shared machine (a notebook, a grid and a second run on the same cores; Ray workers on one node) native
pools that each take every core and spin while idle fight each other: three runs together cost ×1.8 the CPU of
one for the same work (STACK-NOTES). So:

- idle OpenMP threads sleep instead of spinning (``OMP_WAIT_POLICY=PASSIVE``, ``KMP_BLOCKTIME=0``): only
  read when a library loads its OpenMP runtime, hence `sleep_idle_threads` runs at ``import memlab``, before
  numpy, FAISS or torch are imported (a value the user exported is kept);
- `set_threads` sizes, from one number, OpenMP and BLAS (threadpoolctl over the loaded libraries, plus the
  environment for libraries not loaded yet and for child processes), FAISS and torch (intra-op and inter-op).
"""

from __future__ import annotations

import os
import sys
from typing import Any

#: Read by OpenMP runtimes when they load: idle workers block instead of busy-waiting.
IDLE_ENV = {"OMP_WAIT_POLICY": "PASSIVE", "KMP_BLOCKTIME": "0"}
#: Thread-count variables of the OpenMP / BLAS builds numpy, scipy, FAISS and torch ship with.
COUNT_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
             "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity, which a container or ``taskset`` narrows), not the
    machine's count."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def sleep_idle_threads() -> None:
    """Make idle OpenMP threads sleep (set before any native library loads; a user's own value wins)."""
    for k, v in IDLE_ENV.items():
        os.environ.setdefault(k, v)


def resolve_threads(threads: int | None) -> int:
    """``run.threads`` as a count: None means every core available to the process."""
    return available_cores() if threads is None else int(threads)


def set_threads(threads: int | None) -> dict[str, Any]:
    """Size every native pool to ``threads`` (None: `available_cores`); returns what was set, for run.json.

    Libraries already loaded are resized in place; the environment covers those loaded later (torch reads
    ``OMP_NUM_THREADS`` at import) and child processes.
    """
    n = resolve_threads(threads)
    if n < 1:
        raise ValueError(f"run.threads: {threads!r}; expected an integer >= 1 or null (all available cores)")
    sleep_idle_threads()
    for k in COUNT_ENV:
        os.environ[k] = str(n)
    out: dict[str, Any] = {"threads": n, "available_cores": available_cores(),
                           "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")}
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        out["threadpoolctl"] = False
    else:
        threadpool_limits(limits=n)  # every OpenMP and BLAS runtime loaded so far (numpy, scipy, sklearn)
        out["threadpoolctl"] = True
    if "faiss" in sys.modules or _importable("faiss"):
        import faiss

        faiss.omp_set_num_threads(n)
        out["faiss"] = n
    torch = sys.modules.get("torch")
    if torch is not None:  # imported lazily by the neural scorers, which call `size_torch` on load
        size_torch(n)
        out["torch"] = n
    return out


def size_torch(threads: int | None = None) -> None:
    """Set torch's intra-op and inter-op pools (inter-op can be set once per process, before first use: a later
    call keeps what is there)."""
    import torch

    n = resolve_threads(threads) if threads is not None else int(os.environ.get("OMP_NUM_THREADS") or
                                                                  available_cores())
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    try:
        if torch.get_num_interop_threads() != n:
            torch.set_num_interop_threads(n)
    except RuntimeError:  # inter-op work already ran in this process
        pass


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def worker_threads(threads: int | None) -> int:
    """A Ray task's share: the CPUs Ray assigned it (1 by default), capped by ``run.threads``; outside Ray,
    `resolve_threads`. Each worker taking every core is what makes workers on one node fight."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        try:
            cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
        except Exception:  # the driver, not a task
            cpus = None
        if cpus:
            share = max(1, int(cpus))
            return share if threads is None else min(share, int(threads))
    return resolve_threads(threads)


def peak_rss_mb(children: bool = False) -> float:
    """The process's peak resident memory so far, in MB (what run.json records after each stage); ``children``:
    the largest of its finished child processes' instead (forked answering, `memlab.run.forked`)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (1024 * 1024 if sys.platform == "darwin" else 1024), 1)  # bytes on macOS, KiB on Linux


#: A model pass over this many texts or more hands its freed activations back (`trim_after_pass`): each of a
#: key's batched query passes (100-260 questions on LoCoMo-10) otherwise left 30-140 MB resident, and
#: retrieval-best peaked at 1.36 GB; one query's pass is not worth a trim of the whole heap (13 ms on average).
TRIM_AFTER_TEXTS = 32


def trim_after_pass(n_texts: int) -> bool:
    """`return_free_memory` after a model pass over ``n_texts`` texts, if that is at least `TRIM_AFTER_TEXTS`."""
    return n_texts >= TRIM_AFTER_TEXTS and return_free_memory()


def return_free_memory() -> bool:
    """Give the heap's free pages back to the system (glibc's ``malloc_trim``): a run that releases one key's
    index and haystack before the next would otherwise keep the freed arenas resident, and its resident size
    would grow by a part of every key. False where the C library has no such call (not glibc)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return False
    trim(0)
    return True
