"""Forked worker processes for the Python-bound answering stage of a local run.

Answering with an arm that calls no model is Python work that threads cannot share (the GIL); forked processes
can, and they start from the parent's memory (the built indexes, the arms) copy-on-write in milliseconds, where
a spawned one would import everything again. Each child runs one native thread, so it computes exactly what the
parent would; the parent writes every record, in order, so a run folder is the same however it was made. (Index
fits need no process: their SVD releases the GIL, so keys build side by side in threads,
`memlab.run.extraction.build_indexes`.)

Forking is used on Linux only (elsewhere it is not the default start method, and unsafe with some system
libraries), never from a child or a daemonic process, and only for work with no model pass: a model's own
threads already use the cores, and each child would load the model again.
"""

from __future__ import annotations

import multiprocessing
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

from memlab.threads import resolve_threads, set_threads

T = TypeVar("T")
R = TypeVar("R")

#: What the children run, set before they fork (so ``fn`` and the items are inherited, never pickled).
_JOB: tuple[Callable[[Any], Any], Sequence[Any], Callable[[], None] | None] | None = None


def fork_workers(threads: int | None, units: int) -> int:
    """Processes to spread ``units`` independent pieces of work over: ``run.threads`` (null: every available
    core), at most one per unit; 1 (work here) where forking is unsafe."""
    if (_JOB is not None or not sys.platform.startswith("linux") or multiprocessing.current_process().daemon
            or multiprocessing.parent_process() is not None):
        return 1
    return max(1, min(resolve_threads(threads), units))


def _start_child() -> None:
    # Ctrl-C reaches the whole process group: the parent stops the pool, the children finish their unit
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    set_threads(1)
    assert _JOB is not None
    if _JOB[2] is not None:
        _JOB[2]()


def _run_unit(i: int) -> Any:
    assert _JOB is not None
    return _JOB[0](_JOB[1][i])


def fork_map(fn: Callable[[T], R], items: Sequence[T], workers: int,
             in_child: Callable[[], None] | None = None) -> Iterator[R]:
    """``fn(item)`` for every item in ``workers`` forked processes (here, in order, when ``workers`` is 1),
    yielded in order as they finish; ``in_child`` runs first in each child (to reopen what must not cross a fork, as
    `memlab.memory.MemoryService.after_fork`). What ``fn`` returns is pickled back. A child's exception is
    raised here; a child that dies (killed, out of memory) raises ``BrokenProcessPool``. Leaving the loop
    early (Ctrl-C) cancels the units not started and waits for the running ones."""
    global _JOB
    if workers <= 1:
        yield from (fn(x) for x in items)
        return
    if _JOB is not None:
        raise RuntimeError("fork_map: already running a pool in this process (one at a time)")
    _JOB = (fn, items, in_child)
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"), initializer=_start_child)
    try:
        futures = [pool.submit(_run_unit, i) for i in range(len(items))]
        for f in futures:  # in order: the processes run ahead, the caller writes what a serial loop would
            yield f.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        _JOB = None

