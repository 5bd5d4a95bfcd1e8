"""Executors: where the units of a run execute (`memlab.run.engine` plans and collects them). An executor is a
``map`` over units: `Local` runs them in this process (answering that calls no model in forked processes,
`memlab.run.forked`), `memlab.run.ray_executor.RayExecutor` as Ray tasks. ``run.executor`` picks one for a run or
a grid, the CLI's ``--executor`` overrides it; both write the same run folders, and the same fault ends the same way
under each (`Guarded`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from memlab.llm import EndpointUnreachable, SpendCapReached
from memlab.memory import MemoryService, PlansBuilds
from memlab.run.answering import error_text
from memlab.run.config import EXECUTORS, ConfigError, ExperimentConfig
from memlab.run.forked import fork_map, fork_workers
from memlab.run.results import Run
from memlab.run.steps import is_storage_error

T = TypeVar("T")


@dataclass
class Failure:
    """A unit that failed without stopping the run: what its records and run.json say."""

    error: str


def is_fatal(e: BaseException) -> bool:
    """Whether a unit's error stops the run under every executor rather than failing the unit alone."""
    return isinstance(e, (EndpointUnreachable, SpendCapReached)) or is_storage_error(e)


class Guarded:
    """``fn`` as a unit runs it under every executor: a fatal error is raised (`is_fatal`), any other exception is
    returned as a `Failure` (so Ray does not retry what would fail again; a lost worker is retried, then failed)."""

    def __init__(self, fn: Callable[[Any], Any]):
        self.fn = fn

    def __call__(self, unit: Any) -> Any:
        try:
            return self.fn(unit)
        except Exception as e:
            if is_fatal(e):
                raise
            return Failure(error_text(e))


class Executor(Protocol):
    """Where units run: ``map`` yields ``(unit, fn(prepare(unit)))`` for each unit as it finishes (a `Failure`
    where it failed); ``prepare`` is called just before a unit is handed over (a Ray executor ships its state
    then); ``in_child``: given only for units that call no model, which ``map`` may then run in forked processes
    (it runs first in each). ``ships``: units run where the driver's memory is not (they are sent the rows they
    read and return what they wrote); ``width``: keys per wave of a streamed plan."""

    kind: str
    ships: bool
    width: int

    def map(self, fn: Callable[[Any], Any], units: list[T], prepare: Callable[[T], Any] | None = None,
            in_child: Callable[[], None] | None = None) -> Iterator[tuple[T, Any]]: ...


class Local:
    """Units in this process, one after the other (a unit's questions ``run.concurrency`` at a time); units that call
    no model spread over up to ``run.threads`` forked processes (`memlab.run.forked`: they start from this process's
    memory, its built indexes, copy-on-write)."""

    kind = "local"
    ships = False
    width = 1

    def __init__(self, threads: int | None = None):
        self.threads = threads
        self.processes = 1
        """How many processes the last forked ``map`` used (run.json ``executor.answer_processes``)."""

    def map(self, fn: Callable[[Any], Any], units: list[T], prepare: Callable[[T], Any] | None = None,
            in_child: Callable[[], None] | None = None) -> Iterator[tuple[T, Any]]:
        workers = fork_workers(self.threads, len(units)) if in_child is not None else 1
        self.processes = max(self.processes, workers)
        call = fn if prepare is None else (lambda u: fn(prepare(u)))
        yield from zip(units, fork_map(call, units, workers, in_child))


def add_counts(into: dict[str, Any], counts: dict[str, Any]) -> None:
    """Sum ``counts`` into ``into``: numbers added, nested mappings (``by_role``) summed alike, names kept."""
    for k, v in counts.items():
        if isinstance(v, dict):
            add_counts(into.setdefault(k, {}), v)
        elif isinstance(v, str):
            into[k] = v
        else:
            into[k] = into.get(k, 0) + int(v)



def answers_without_model(clients: Any, answerer: Any, svc: Any) -> bool:
    """Whether answering calls no model: an arm and judge that ask no client, over an index that searches without
    one (`memlab.memory.PlansBuilds.model_free`) or no store; only then may forked processes answer
    (`memlab.run.forked`)."""
    forkable = svc is None or (isinstance(svc, MemoryService) and isinstance(svc.searcher, PlansBuilds)
                               and svc.searcher.model_free)
    return forkable and not clients.roles_in_use(answerer)


def run_grid(config: ExperimentConfig | str | Path | None = None, results: str | Path | None = None,
             progress: bool = True, *, executor: str | None = None, address: str | None = None,
             resume: str | Path | None = None, overrides: dict[str, Any] | list[str] | None = None,
             force_config: bool = False, trust_run_config: bool = False, reuse: bool = False) -> list[Run]:
    """Every run of a config (each grid point; a config without a grid is one run), or ``resume`` one run,
    on the chosen executor (default: the config's ``run.executor``); ``trust_run_config`` and ``reuse`` (local
    executor only) as in `run_experiment`. The config is checked with the executor that will run it (``executor``
    overrides ``run.executor`` before the check, so a rule such as "a memory system runs locally" sees it), before
    any run folder exists or Ray starts."""
    from memlab.run.runner import resolve_run_config, run_experiment

    if resume is not None:
        cfg, _ = resolve_run_config(None, resume, overrides, force_config, trust_run_config)
    else:
        cfg = ExperimentConfig.of(config, overrides, caller="run_grid")
    kind = executor or cfg.run.executor
    if kind not in EXECUTORS:
        raise ConfigError(f"executor = {kind!r}; allowed: {', '.join(EXECUTORS)}")
    cfg.with_overrides({"run.executor": kind})  # the config's own checks, with the executor that will run it
    if kind == "ray":
        from memlab.run.ray_executor import run_grid_ray

        if reuse:
            raise ConfigError("reuse: the local executor only (the ray executor runs every grid point)")
        if resume is not None:
            return run_grid_ray(resume=resume, progress=progress, address=address, overrides=overrides,
                                force_config=force_config, trust_run_config=trust_run_config)
        return run_grid_ray(cfg, results=results, progress=progress, address=address)
    if resume is not None:
        return [run_experiment(None, resume=resume, progress=progress, overrides=overrides, force_config=force_config,
                               trust_run_config=trust_run_config, executor=kind)]
    return [run_experiment(c, results=results, progress=progress, reuse=reuse, executor=kind) for c in cfg.expand()]
