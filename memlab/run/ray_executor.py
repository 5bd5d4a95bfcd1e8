"""The Ray executor: an ablation grid (or one run) run by the stage engine (`memlab.run.engine`) with Ray tasks as
its ``map``. Each cell is validated, opened, scored and closed by the local executor's own steps
(`memlab.run.steps`), holds its folder's lock and stops as ``interrupted`` on Ctrl-C or SIGTERM; the engine plans,
skips and collects the units as it does locally. This module only ships state between the driver and the workers
(`RayShip`, through `memlab.memory.shipping` and typed cache rows) and submits tasks in a window (`RayExecutor`).

Units: one extraction task per (extraction cache key, conversation) the cache lacks (cells that share a key share
it), then one answering task per (cell, conversation) with questions still to do. A task whose worker is lost is
retried ``run.ray_max_retries`` times and then fails as a unit; a unit's own error fails it at once, and a fatal one
(an unreachable endpoint) stops the run, as under every executor. Each finished unit is appended to its run's
resume log at once, so a killed driver leaves a run that ``--resume`` finishes (with either executor).

What a worker does: `memlab.run.ray_units`. ray is imported lazily: memlab works without it (``pip install
'memlab[ray]'`` adds it).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from memlab import cache_integrity
from memlab.data import dataset_sha256, load_dataset
from memlab.extract.pipeline import conversation_key
from memlab.index.machine_cache import embeddings_path
from memlab.memory.capabilities import extraction_log
from memlab.memory.shipping import export_rows, import_index, import_rows
from memlab.run.answering import StopFlag, Terminated, remembered_interrupts
from memlab.run.clients import Clients, check_endpoints, role_model
from memlab.run.components import user_component_modules
from memlab.run.config import ExperimentConfig
from memlab.run.config_models import ROLES
from memlab.run.engine import Engine
from memlab.run.executors import Failure, is_fatal
from memlab.run.ray_cluster import connect, in_window, task_error, window_size, workers_know
from memlab.run.ray_units import (  # noqa: F401 - the worker side, public here too
    Task,
    UnitHook,
    answer_task,
    answer_unit,
    cache_snapshot,
    extract_task,
    extract_unit,
    store_cache_rows,
)
from memlab.run.results import Run
from memlab.run.spend import counted_spend
from memlab.run.steps import (
    RunStorageError,
    build_components,
    close_session,
    finish_run,
    interrupted_on_signal,
    is_storage_error,
    open_info,
    prepare,
    record_failure,
    record_interrupt,
    storage_message,
    write_run_json,
)
from memlab.run.streaming import key_index_blob, release_key, save_key_index
from memlab.run.units import AnswerUnit, Cell, ExtractUnit
from memlab.rundir import RunLock, open_run_dir, results_root
from memlab.threads import peak_rss_mb

T = TypeVar("T")


class RayExecutor:
    """Units as Ray tasks, at most ``window`` in flight; a task's fatal error is raised here (`is_fatal`), a lost
    worker past its retries is the unit's `Failure`."""

    kind = "ray"
    ships = True

    def __init__(self, ray: Any, opts: dict[str, Any], retries: int):
        self.ray, self.opts, self.retries = ray, opts, retries
        self.width = window_size(ray)
        self.pending: list[Any] = []

    def put(self, obj: Any) -> Any:
        return self.ray.put(obj)

    def map(self, fn: Callable[[Any], Any], units: list[T], prepare: Callable[[T], Any] | None = None,
            in_child: Callable[[], None] | None = None) -> Iterator[tuple[T, Any]]:
        remote = self.ray.remote(_call)

        def submit(u: T) -> Any:
            arg = prepare(u) if prepare is not None else u
            name = getattr(arg, "unit", type(arg).__name__)
            return remote.options(name=f"memlab {name}", **self.opts).remote(fn, arg)

        for ref, u in in_window(self.ray, [(lambda u=u: submit(u), u) for u in units], self.width, self.pending):
            try:
                res = self.ray.get(ref)
            except Exception as e:
                cause = getattr(e, "cause", None)
                if isinstance(cause, BaseException) and is_fatal(cause):
                    raise cause from None  # the same exception a local run raises
                yield u, Failure(task_error(e, self.retries))
                continue
            yield u, res

    def cancel(self) -> None:
        for ref in self.pending:
            self.ray.cancel(ref, force=True)


def _call(fn: Callable[[Any], Any], arg: Any) -> Any:
    """A task: ``fn(arg)`` on a worker (``fn`` may be any picklable callable, as the engine's `Guarded` units)."""
    return fn(arg)


class RayShip:
    """The driver's side of shipping units (`Engine.ship`): what each task is sent, and where what it returns lands."""

    def __init__(self, ex: RayExecutor, cache_root: Path, snapshot: Any, hook: UnitHook | None,
                 modules: dict[str, list[str]]):
        self.ex, self.cache_root, self.snapshot, self.hook, self.modules = ex, cache_root, snapshot, hook, modules
        self.shared: dict[tuple[str, str], list[Any]] = {}  # (key, conversation) -> [rows ref, index ref, left]

    extract_task = staticmethod(extract_task)
    answer_task = staticmethod(answer_task)

    def extract_args(self, engine: Engine, u: ExtractUnit) -> Task:
        st = engine.stores[u.key]
        ck = conversation_key(u.conv)
        state = extraction_log(st.svc).extraction_state(u.conv.sample_id) if st.durable else None
        rows = export_rows(st.svc, ck) if st.durable else None
        blob = key_index_blob(st.svc, st.cdir, ck) if rows else None
        if st.streamed:
            release_key(st.svc, ck)
        return Task(u.cell.cfg, u.conv, f"extract {u.conv.sample_id} [{u.key[:8]}] for {u.cell.cfg.name}", rows,
                    blob, self.snapshot, self.hook, self.modules, state=state)

    def land(self, engine: Engine, u: ExtractUnit, res: dict[str, Any]) -> dict[str, Any]:
        """Store what an extraction task wrote (rows, index, cursor, trace, cache rows) in the driver's store."""
        st = engine.stores[u.key]
        ck = conversation_key(u.conv)
        import_rows(st.svc, ck, res["rows"])
        if st.streamed:  # the key's fit goes to its file, not into the driver's memory
            if res["index"] is not None:
                save_key_index(st.cdir, ck, res["index"])
            release_key(st.svc, ck)
        else:
            import_index(st.svc, ck, res["index"])
        extraction_log(st.svc).save_extraction(u.conv.sample_id, res["state"] or {}, [tuple(t) for t in res["trace"]])
        store_cache_rows(self.cache_root, res["cache"], embeddings_path(u.cell.cfg.run.cache_dir))
        return {k: res[k] for k in ("table", "failures", "models", "where", "seconds")}

    def land_answer(self, u: AnswerUnit, res: dict[str, Any]) -> None:
        """Store the model responses and vectors an answering task fetched (a rerun then makes no call)."""
        store_cache_rows(self.cache_root, res["cache"], embeddings_path(u.cell.cfg.run.cache_dir))

    def expect(self, engine: Engine, units: list[AnswerUnit]) -> None:
        for u in units:
            if u.cell.comps.answerer.needs_memory:
                self.shared.setdefault((u.cell.ext_key or "", u.conv.sample_id), [None, None, 0])[2] += 1

    def answer_args(self, engine: Engine, u: AnswerUnit) -> Task:
        """A key's rows and index go to the object store once for every cell answering it; the driver drops its
        references when the key's last task is submitted (the tasks in flight hold theirs)."""
        rows = blob = None
        cell = u.cell
        if cell.comps.answerer.needs_memory:
            sk = (cell.ext_key or "", u.conv.sample_id)
            if self.shared[sk][0] is None:
                st = engine.stores[cell.ext_key or ""]
                ck = conversation_key(u.conv)
                self.shared[sk][:2] = [self.ex.put(export_rows(st.svc, ck)),
                                       self.ex.put(key_index_blob(st.svc, st.cdir, ck))]
                if st.streamed:
                    release_key(st.svc, ck)
            rows, blob, _ = self.shared[sk]
            self.shared[sk][2] -= 1
            if self.shared[sk][2] == 0:
                del self.shared[sk]
        unit = (f"answer {u.conv.sample_id} ({len(u.questions)} q) run {cell.index + 1}/{len(engine.cells)} "
                f"{cell.cfg.name}")
        return Task(cell.cfg, u.conv, unit, rows, blob, self.snapshot, self.hook, self.modules,
                    questions=u.questions, errata=cell.p.errata)


def run_grid_ray(config: ExperimentConfig | str | Path | None = None, results: str | Path | None = None,
                 progress: bool = True, *, address: str | None = None, resume: str | Path | None = None,
                 overrides: dict[str, Any] | list[str] | None = None, force_config: bool = False,
                 trust_run_config: bool = False, unit_hook: UnitHook | None = None) -> list[Run]:
    """Run every cell of a grid (or ``resume`` one run) on Ray; returns the `Run` of each cell, in order.

    Each cell is validated, opened, scored and closed by the same steps as `run_experiment`
    (`memlab.run.steps`), holds its folder's lock, and stops as ``interrupted`` on Ctrl-C or SIGTERM.
    ``unit_hook`` is called on the worker with the unit's name before each task (fault injection in
    tests, instrumentation)."""
    from memlab.run.runner import resolve_run_config

    with contextlib.ExitStack() as held:
        if resume is not None:
            cfg0, prev0 = resolve_run_config(None, resume, overrides, force_config, trust_run_config)
            cfg0.with_overrides({"run.executor": "ray"})  # the config's checks, with the executor that runs it
            held.enter_context(RunLock(resume))  # before any work: a second resume of this folder stops here
            cfgs, prevs = [cfg0], [prev0]
        else:
            cfgs = ExperimentConfig.of(config, overrides, caller="run_grid_ray").expand()
            for c in cfgs:
                c.with_overrides({"run.executor": "ray"})  # the config's checks, with the executor that runs it
            prevs = [{} for _ in cfgs]
        stop = held.enter_context(remembered_interrupts())
        return _run_grid(cfgs, prevs, results_root(results, resume), resume, progress, address, unit_hook, held,
                         stop)


def _run_grid(cfgs: list[ExperimentConfig], prevs: list[dict[str, Any]], root: Path, resume: str | Path | None,
              progress: bool, address: str | None, unit_hook: UnitHook | None, held: contextlib.ExitStack,
              stop: StopFlag) -> list[Run]:
    cache_root = root / ".cache"
    cache_root.mkdir(parents=True, exist_ok=True)
    integrity_mark = cache_integrity.mark()
    # -- 1. validate every cell before anything is submitted (or any folder exists)
    datasets: dict[str, Any] = {}
    prepared = []
    for cfg, prev in zip(cfgs, prevs):
        t_start = time.perf_counter()
        path = cfg.dataset.path or ""
        if path not in datasets:
            data = load_dataset(cfg.dataset.path)  # LoCoMo or LongMemEval
            datasets[path] = (data, dataset_sha256(data))
        p = prepare(cfg, prev, resume, loaded=datasets[path])
        clients = Clients(p.cfg, cache_root / "responses.sqlite")
        comps = build_components(p.cfg, clients, p.errata)
        if p.cfg.run.check_endpoint:  # as the local executor does: before any work, before Ray starts
            check_endpoints(p.cfg, clients, clients.roles_in_use(comps.answerer))
        prepared.append((p, comps, clients, t_start))
    modules: dict[str, list[str]] = {}
    for cfg in cfgs:
        for m, what in user_component_modules(cfg).items():
            modules.setdefault(m, []).extend(w for w in what if w not in modules.get(m, []))
    ray = connect(address or cfgs[0].run.ray_address)
    workers_know(ray, modules)
    retries = max(cfg.run.ray_max_retries for cfg in cfgs)
    where = address or cfgs[0].run.ray_address
    cells: list[Cell] = []
    for i, (p, comps, clients, t_start) in enumerate(prepared):
        run_dir = open_run_dir(p.cfg.name, p.cfg.to_yaml(), root, resume)
        if resume is None:
            held.enter_context(RunLock(run_dir))
        info = open_info(p, run_dir, comps, {"kind": "ray", "address": where, "max_retries": retries,
                                             "units": [], "nodes": []})
        # each task sizes its own pools to its share (`worker_threads`); the driver only schedules
        info["threads"] = {"run.threads": p.cfg.run.threads,
                           "per_task": "the CPUs Ray assigns it, capped by run.threads"}
        write_run_json(run_dir, {**info, "timings": {"load_s": p.load_s}})
        cell = Cell(i, p, comps, run_dir, info, clients, timings={"load_s": p.load_s}, t_start=t_start)
        stop.on_signal(interrupted_on_signal(run_dir, info, _resume_cmd(cell)))
        cells.append(cell)
    env_vars = {name: os.environ[name] for cfg in cfgs for role in ROLES
                if (name := cfg.models.resolve(role)["api_key_env"]) and name in os.environ}
    # a unit's own error is its result (`Guarded`), so only a lost worker is retried
    opts: dict[str, Any] = {"max_retries": retries, "retry_exceptions": False}
    if env_vars:
        opts["runtime_env"] = {"env_vars": env_vars}
    models = {m for cfg in cfgs for r in ROLES if r != "embedder" and (m := role_model(cfg, r))}
    ex = RayExecutor(ray, opts, retries)
    snapshot = ray.put(cache_snapshot(cache_root, models, embeddings_path(cfgs[0].run.cache_dir)))
    engine = Engine(cells, ex, cache_root, stop, progress, RayShip(ex, cache_root, snapshot, unit_hook, modules))
    try:
        engine.run()
        runs = [finish_run(c.p, c.run_dir, c.comps.answerer, c.info, c.timings, c.done, c.answered, c.models)
                for c in cells if c.failed is None]
        engine.raise_failed()
        return runs
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM, in any stage: cancel what runs, keep what finished
        ex.cancel()
        why = "terminated (SIGTERM)" if isinstance(e, Terminated) else "interrupted"
        for cell in cells:
            record_interrupt(cell.info, _resume_cmd(cell), why)
        raise
    except BaseException as e:
        for cell in cells:
            record_failure(cell.info, cell.failed or e, _resume_cmd(cell))
        if is_storage_error(e):
            raise RunStorageError(storage_message(e, cells[0].run_dir if len(cells) == 1 else None)) from e
        raise
    finally:
        try:
            for cell in cells:
                cell.timings["total_s"] = time.perf_counter() - cell.t_start
                cell.info["executor"].update(
                    units=cell.units, nodes=sorted({u["node_id"] for u in cell.units if u.get("node_id")}))
                cell.info["peak_rss_mb"] = {"driver": peak_rss_mb()}  # the workers' are their own processes'
                cell.info["spend"] = counted_spend(cell.p.cfg, cell.p.prev, cell.models)  # as the local executor
                close_session(cell.run_dir, cell.info, cell.timings, integrity_mark,
                              {"executor": "ray", "models_by_role": cell.models.get("by_role", {})})
        finally:
            engine.close()


def _resume_cmd(cell: Cell) -> str:
    return f"memlab run --resume {cell.run_dir} --executor ray"
