"""Reaching a Ray cluster and keeping it busy: importing ray lazily, joining or starting a cluster, checking
that the workers know the grid's user components, and submitting tasks in a bounded window. What runs on a
worker is `memlab.run.ray_units`; what a grid does is `memlab.run.ray_executor`."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from typing import Any

from memlab.run.components import ComponentNotOnWorkers, import_component_modules


class RayNotInstalled(ImportError):
    """``run.executor: ray`` without ray installed."""


def import_ray() -> Any:
    try:
        import ray
    except ImportError as e:
        raise RayNotInstalled("run.executor = 'ray' needs ray: pip install 'memlab[ray]' (or 'ray>=2.9,<2.53')") from e
    return ray


def task_error(e: BaseException, retries: int) -> str:
    first = str(e).strip().splitlines()
    reason = next((ln for ln in reversed(first) if ln.strip()), type(e).__name__)[:300]
    return f"RayTaskFailed: the task failed after {retries + 1} attempt(s): {type(e).__name__}: {reason}"


def window_size(ray: Any) -> int:
    """Tasks kept in flight: twice the cluster's CPUs, so every worker has a next task ready while the object
    store holds the arguments (a conversation, its rows and index) of those tasks only."""
    return max(2, 2 * int(ray.cluster_resources().get("CPU", 1)))


def in_window(ray: Any, jobs: list[tuple[Any, Any]], window: int, pending: list[Any]) -> Iterator[tuple[Any, Any]]:
    """Submit ``jobs`` ((submit function, what it is) pairs, in order) keeping at most ``window`` in flight;
    yields (ref, what) as each finishes. ``pending`` is the caller's list of the refs in flight (what Ctrl-C
    cancels)."""
    todo = iter(jobs)
    what: dict[Any, Any] = {}

    def fill() -> None:
        while len(pending) < window and (job := next(todo, None)) is not None:
            ref = job[0]()
            what[ref] = job[1]
            pending.append(ref)

    fill()
    while pending:
        ready, rest = ray.wait(pending, num_returns=1)
        pending[:] = rest
        yield ready[0], what.pop(ready[0])
        fill()


def connect(address: str | None) -> Any:
    """Join the Ray cluster at ``address`` (``auto``, ``ray://host:port``), or start a local instance."""
    ray = import_ray()
    if not ray.is_initialized():
        kept = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(include_dashboard=False, log_to_driver=False)
        if kept is not None:  # ray.init makes SIGTERM a SystemExit: the run's own handler stops it as interrupted
            signal.signal(signal.SIGTERM, kept)
    return ray


def workers_know(ray: Any, modules: dict[str, list[str]]) -> None:
    """Refuse to start unless a worker imports every user module that registered a component of the grid."""
    if not modules:
        return
    import_component_modules({m: w for m, w in modules.items() if m == "__main__"})  # refused without asking
    try:
        ray.get(ray.remote(import_component_modules).options(max_retries=0).remote(modules))
    except Exception as e:
        cause = getattr(e, "cause", None)
        if isinstance(cause, ComponentNotOnWorkers):
            raise ComponentNotOnWorkers(str(cause)) from None
        raise ComponentNotOnWorkers(f"the Ray workers could not import the modules that register this run's "
                                    f"components ({', '.join(modules)}): {e}") from None
