"""The Ray executor: an ablation grid (or one run) as (grid cell x conversation) tasks on a Ray cluster,
written by the driver exactly as the local executor writes it: each cell is validated, opened, scored and
closed by the local executor's own steps (`memlab.run.steps`), holds its folder's lock and stops as
``interrupted`` on Ctrl-C or SIGTERM. This module only schedules units and ships state between the driver and
the workers, through `memlab.memory.shipping` (`export_rows` / `import_rows` / `export_index` / `import_index`).

Units of work: one *extraction* task per (extraction cache key, conversation) that the cache lacks (cells
that share an extraction key share it), then one *answering* task per (cell, conversation) with its
questions still to do; inside a task the run's ``run.concurrency`` bounds the model calls in flight.

What a worker does and is sent: `memlab.run.ray_units`.

A task that raises or loses its worker is retried ``run.ray_max_retries`` times; after that its questions
are recorded as errors (never dropped), so ``memlab run --resume RUN_DIR`` answers them again. Each
finished task is appended to the run's resume log at once, so a killed driver leaves a run that
``--resume`` finishes (with either executor).

ray is imported lazily: memlab works without it (``pip install 'memlab[ray]'`` adds it).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from memlab import cache_integrity
from memlab.data import Conversation, Question, dataset_sha256, load_dataset
from memlab.extract.pipeline import conversation_key
from memlab.index.machine_cache import embeddings_path
from memlab.memory import MemoryService
from memlab.memory.shipping import export_rows, import_index, import_rows
from memlab.progress import progress_bar
from memlab.run.answering import (
    RecordLog,
    Records,
    StopFlag,
    Terminated,
    error_records,
    load_done,
    remembered_interrupts,
)
from memlab.run.clients import Clients, check_endpoints, role_model
from memlab.run.components import (
    user_component_modules,
)
from memlab.run.config import ExperimentConfig
from memlab.run.extraction import (
    BUILD_LOG,
    ExtractionFailed,
    ExtractionOutcome,
    extraction_cache_key,
    extraction_info,
    extraction_row,
    extraction_table,
    finish_extraction,
    open_store,
)
from memlab.run.ray_cluster import (
    connect,
    in_window,
    task_error,
    window_size,
    workers_know,
)
from memlab.run.ray_units import (  # noqa: F401 - the worker side; cache_snapshot is public here too
    UnitHook,
    answer_unit,
    cache_snapshot,
    extract_unit,
    extraction_done,
    store_cache_rows,
)
from memlab.run.results import Run
from memlab.run.spend import counted_spend
from memlab.run.steps import (
    Components,
    Prepared,
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
from memlab.run.streaming import key_index_blob, release_key, save_key_index, streams
from memlab.rundir import RunLock, open_run_dir, results_root
from memlab.threads import peak_rss_mb


# ============================================================================ caches as rows
# ============================================================================ driver side
@dataclass
class _Cell:
    """One run of the grid, as the driver tracks it (its steps are `memlab.run.steps`, as locally)."""

    index: int
    p: Prepared
    comps: Components
    run_dir: Path
    info: dict[str, Any]
    t_start: float
    done: int = 0
    todo: dict[str, list[Question]] = field(default_factory=dict)
    ext_key: str | None = None
    failed: BaseException | None = None
    units: list[dict[str, Any]] = field(default_factory=list)
    models: dict[str, int] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    answered: int = 0

    @property
    def cfg(self) -> ExperimentConfig:
        return self.p.cfg

    @property
    def resume_cmd(self) -> str:
        return f"memlab run --resume {self.run_dir} --executor ray"


def _add_models(cell: _Cell, totals: dict[str, Any]) -> None:
    _add_counts(cell.models, totals)


def _add_counts(into: dict[str, Any], counts: dict[str, Any]) -> None:
    """Sum ``counts`` into ``into``: numbers added, nested mappings (``by_role``) summed alike, names kept."""
    for k, v in counts.items():
        if isinstance(v, dict):
            _add_counts(into.setdefault(k, {}), v)
        elif isinstance(v, str):
            into[k] = v
        else:
            into[k] = into.get(k, 0) + int(v)


def _append_records(run_dir: Path, recs: list[Records]) -> None:
    with RecordLog(run_dir) as log:
        log.write(recs)


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
            held.enter_context(RunLock(resume))  # before any work: a second resume of this folder stops here
            cfgs, prevs = [cfg0], [prev0]
        else:
            cfgs = ExperimentConfig.of(config, overrides, caller="run_grid_ray").expand()
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
        cfg = p.cfg  # with the dataset's scoring profile
        clients = Clients(cfg, cache_root / "responses.sqlite")
        comps = build_components(cfg, clients, p.errata)
        if cfg.run.check_endpoint:  # as the local executor does: before any work, before Ray starts
            check_endpoints(cfg, clients, clients.roles_in_use(comps.answerer))
        prepared.append((p, comps, t_start))
    modules: dict[str, list[str]] = {}
    for cfg in cfgs:
        for m, what in user_component_modules(cfg).items():
            modules.setdefault(m, []).extend(w for w in what if w not in modules.get(m, []))
    ray = connect(address or cfgs[0].run.ray_address)
    workers_know(ray, modules)
    retries = max(cfg.run.ray_max_retries for cfg in cfgs)
    where = address or cfgs[0].run.ray_address
    cells: list[_Cell] = []
    for i, (p, comps, t_start) in enumerate(prepared):
        run_dir = open_run_dir(p.cfg.name, p.cfg.to_yaml(), root, resume)
        if resume is None:
            held.enter_context(RunLock(run_dir))
        info = open_info(p, run_dir, comps, {"kind": "ray", "address": where, "max_retries": retries,
                                             "units": [], "nodes": []})
        # each task sizes its own pools to its share (`worker_threads`); the driver only schedules
        info["threads"] = {"run.threads": p.cfg.run.threads,
                           "per_task": "the CPUs Ray assigns it, capped by run.threads"}
        write_run_json(run_dir, {**info, "timings": {"load_s": p.load_s}})
        cell = _Cell(i, p, comps, run_dir, info, t_start, timings={"load_s": p.load_s})
        stop.on_signal(interrupted_on_signal(run_dir, info, cell.resume_cmd))
        done = load_done(run_dir) if resume is not None else []
        cell.done = len(done)
        done_ids = {r.qid for r in done}
        for c, q in p.picks:
            if q.qid not in done_ids:
                cell.todo.setdefault(c.sample_id, []).append(q)
        cells.append(cell)
    env_vars = {}
    for cfg in cfgs:
        for role in ("extractor", "reader", "judge", "embedder"):
            name = cfg.models.resolve(role)["api_key_env"]
            if name and name in os.environ:
                env_vars[name] = os.environ[name]
    opts: dict[str, Any] = {"max_retries": retries, "retry_exceptions": True}
    if env_vars:
        opts["runtime_env"] = {"env_vars": env_vars}
    models = {m for cfg in cfgs for r in ("extractor", "reader", "judge") if (m := role_model(cfg, r))}
    snapshot = ray.put(cache_snapshot(cache_root, models, embeddings_path(cfgs[0].run.cache_dir)))
    remote_extract = ray.remote(extract_unit)
    remote_answer = ray.remote(answer_unit)
    stores: dict[str, tuple[MemoryService, Path]] = {}
    per_key: dict[str, bool] = {}  # extraction key -> its dataset streams (one key's index in memory at a time)
    pending: list[Any] = []
    bar = progress_bar(total=0, desc=f"grid ({len(cells)} run(s), ray)", disable=not progress)
    try:
        # -- 2. extraction: one task per (cache key, conversation) the cache lacks
        t0 = time.perf_counter()
        window = window_size(ray)
        ext_jobs: list[tuple[Any, tuple[str, Conversation, _Cell]]] = []
        ext_seen: set[tuple[str, str]] = set()
        ext_results: dict[tuple[str, str], dict[str, Any]] = {}
        ext_failed: dict[tuple[str, str], str] = {}
        for cell in cells:
            if not cell.comps.answerer.needs_memory or not cell.todo:
                continue
            assert cell.comps.extractor_id is not None
            key = extraction_cache_key(cell.cfg, cell.p.dataset_sha, cell.comps.extractor_id,
                                       cell.comps.extractor)
            cell.ext_key = key
            if key not in stores:
                cdir = cache_root / "extract" / key
                cdir.mkdir(parents=True, exist_ok=True)
                if cell.cfg.store.backend != "sqlite":
                    (cdir / BUILD_LOG).unlink(missing_ok=True)  # an in-memory store is extracted afresh every run
                svc = open_store(cell.cfg, cdir, cache_root, Clients(cell.cfg, cache_root / "responses.sqlite"))
                stores[key] = (svc, cdir)
                per_key[key] = streams(cell.p.data)
            svc, cdir = stores[key]
            durable = cell.cfg.store.backend == "sqlite"
            for conv in cell.p.convs:
                if (key, conv.sample_id) in ext_seen:
                    continue
                st = svc.extraction_state(conv.sample_id) if durable else None
                if durable and extraction_done(conv, st) and svc.count(conversation_key(conv)) > 0:
                    continue
                ext_seen.add((key, conv.sample_id))

                def submit(cell: _Cell = cell, conv: Conversation = conv, key: str = key, st: Any = st,
                           durable: bool = durable) -> Any:  # called when the window has room
                    svc, cdir = stores[key]
                    ck = conversation_key(conv)
                    rows = export_rows(svc, ck) if durable else None
                    blob = key_index_blob(svc, cdir, ck) if rows else None
                    if per_key[key]:
                        release_key(svc, ck)
                    unit = f"extract {conv.sample_id} [{key[:8]}] for {cell.cfg.name}"
                    return remote_extract.options(name=f"memlab {unit}", **opts).remote(
                        cell.cfg, conv, rows, st if durable else None, blob, snapshot, unit, unit_hook, modules)
                ext_jobs.append((submit, (key, conv, cell)))
        bar.total += len(ext_jobs)
        bar.refresh()
        for ref, (key, conv, owner) in in_window(ray, ext_jobs, window, pending):
            try:
                res = ray.get(ref)
            except Exception as e:  # retries exhausted: this conversation's questions become errors
                ext_failed[(key, conv.sample_id)] = task_error(e, retries)
                owner.units.append({"unit": f"extract {conv.sample_id}", "error": ext_failed[(key, conv.sample_id)]})
                bar.update()
                continue
            svc, cdir = stores[key]
            ck = conversation_key(conv)
            import_rows(svc, ck, res["rows"])
            if per_key[key]:  # a streamed dataset: the key's fit goes to its file, not into the driver's memory
                if res["index"] is not None:
                    save_key_index(cdir, ck, res["index"])
                release_key(svc, ck)
            else:
                import_index(svc, ck, res["index"])
            svc.save_extraction(conv.sample_id, res["state"] or {}, [tuple(t) for t in res["trace"]])
            store_cache_rows(cache_root, res["cache"], embeddings_path(owner.cfg.run.cache_dir))
            # only what the extraction tables use is kept (the rows and index are in the store and its files now)
            ext_results[(key, conv.sample_id)] = {"table": res["table"], "failures": res.get("failures", []),
                                                  "owner": owner.index}
            _add_models(owner, res["models"])  # the first cell using an extraction pays for it, as locally
            owner.units.append({"unit": f"extract {conv.sample_id}", **res["where"], "seconds": res["seconds"]})
            del res
            bar.update()
        for svc, _ in stores.values():  # persist the merged index now: a killed driver keeps the extraction
            svc.searcher.close()
        ext_s = time.perf_counter() - t0
        stop.stop()  # a signal swallowed during extraction still stops the run here
        # -- 3. per cell: traces of the extraction, the failure rule, then answering tasks
        ans_jobs: list[tuple[Any, tuple[_Cell, Conversation, list[Question]]]] = []
        for cell in cells:
            ext_info: dict[str, Any] = {}
            lost: set[str] = set()
            if cell.comps.answerer.needs_memory and cell.ext_key is not None:
                key = cell.ext_key
                svc, cdir = stores[key]
                lost = {c for (k, c) in ext_failed if k == key}
                ok = [c for c in cell.p.convs if c.sample_id not in lost]
                # the cell that caused an extraction reports its jobs; later cells see the cache, as locally
                mine = {k: r for k, r in ext_results.items() if r["owner"] == cell.index}
                table = pd.DataFrame([r["table"][0] if (r := mine.get((key, c.sample_id))) else
                                      extraction_row(c, svc.count(conversation_key(c))) for c in ok])
                table = table.set_index("conversation") if len(table) else extraction_table([])
                failures = [f for c in ok for f in (ext_results.get((key, c.sample_id)) or {}).get("failures", [])]
                failures = list({(f["conversation"], f["reason"]): f for f in failures}.values())
                info = extraction_info(table, failures, ok, key, cdir, cell.comps.extractor_id or "",
                                       cell.cfg.extraction.policy)
                info["tasks_failed"] = sorted(lost)
                try:
                    done = finish_extraction(cell.cfg, ok, ExtractionOutcome(svc, info), cell.run_dir,
                                             close_on_failure=False)
                    cell.timings.update(done.timings)
                except ExtractionFailed as e:
                    cell.failed = e
                ext_info = info
            cell.info["extraction"] = ext_info
            cell.timings["extraction_s"] = ext_s
            if cell.failed is not None:
                continue
            by_id = {c.sample_id: c for c in cell.p.convs}
            for conv_id, qs in cell.todo.items():
                conv = by_id[conv_id]
                if conv_id in lost:
                    _append_records(cell.run_dir, [error_records(q, ext_failed[(cell.ext_key, conv_id)]) for q in qs])
                    continue
                ans_jobs.append((None, (cell, conv, qs)))
        # a key's rows and index are put in the object store once for every cell answering it, while one of its
        # tasks is in flight (jobs ordered key by key, so the cells sharing an extraction share them)
        order = {c.sample_id: i for cell in cells for i, c in enumerate(cell.p.convs)}
        ans_jobs.sort(key=lambda j: (order[j[1][1].sample_id], j[1][0].index))
        shared: dict[tuple[str, str], list[Any]] = {}  # (key, conversation) -> [rows ref, index ref, tasks left]
        for _, (cell, conv, _qs) in ans_jobs:
            if cell.comps.answerer.needs_memory:
                shared.setdefault((cell.ext_key or "", conv.sample_id), [None, None, 0])[2] += 1

        def submit_answer(cell: _Cell, conv: Conversation, qs: list[Question]) -> Any:
            rows_ref = blob_ref = None
            if cell.comps.answerer.needs_memory:
                sk = (cell.ext_key or "", conv.sample_id)
                if shared[sk][0] is None:
                    svc, cdir = stores[cell.ext_key or ""]
                    ck = conversation_key(conv)
                    blob = key_index_blob(svc, cdir, ck)  # a streamed run's too
                    shared[sk][:2] = [ray.put(export_rows(svc, ck)), ray.put(blob)]
                    if per_key[cell.ext_key or ""]:
                        release_key(svc, ck)
                rows_ref, blob_ref = shared[sk][:2]
            unit = f"answer {conv.sample_id} ({len(qs)} q) run {cell.index + 1}/{len(cells)} {cell.cfg.name}"
            return remote_answer.options(name=f"memlab {unit}", **opts).remote(
                cell.cfg, conv, qs, rows_ref, blob_ref, snapshot, unit, unit_hook, cell.p.errata, modules)
        ans_jobs = [(lambda w=what: submit_answer(*w), what) for _, what in ans_jobs]
        bar.total += len(ans_jobs)
        bar.refresh()
        # -- 4. collect the answers, each unit written to its run's resume log as it arrives
        t0 = time.perf_counter()
        for ref, (cell, conv, qs) in in_window(ray, ans_jobs, window, pending):
            try:
                res = ray.get(ref)
            except Exception as e:
                msg = task_error(e, retries)
                _append_records(cell.run_dir, [error_records(q, msg) for q in qs])
                cell.units.append({"unit": f"answer {conv.sample_id}", "questions": len(qs), "error": msg})
            else:
                _append_records(cell.run_dir, res["records"])
                store_cache_rows(cache_root, res["cache"], embeddings_path(cell.cfg.run.cache_dir))
                _add_models(cell, res["models"])
                cell.units.append({"unit": f"answer {conv.sample_id}", "questions": len(qs), **res["where"],
                                   "seconds": res["seconds"]})
            sk = (cell.ext_key or "", conv.sample_id)
            if sk in shared:
                shared[sk][2] -= 1
                if shared[sk][2] == 0:  # no task left for this key: its refs go, and the object store frees them
                    del shared[sk]
            cell.answered += len(qs)
            bar.update()
            stop.stop()
        ans_s = time.perf_counter() - t0
        # -- 5. scoring, by the local executor's step
        runs = []
        for cell in cells:
            cell.timings["answering_s"] = ans_s
            if cell.failed is None:
                runs.append(finish_run(cell.p, cell.run_dir, cell.comps.answerer, cell.info, cell.timings, cell.done,
                                       cell.answered, cell.models))
        failed = [c for c in cells if c.failed is not None]
        if failed:
            raise ExtractionFailed("\n".join(f"{c.run_dir}: {c.failed}" for c in failed))
        return runs
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM, in any stage: cancel what runs, keep what finished
        for ref in pending:
            ray.cancel(ref, force=True)
        why = "terminated (SIGTERM)" if isinstance(e, Terminated) else "interrupted"
        for cell in cells:
            record_interrupt(cell.info, cell.resume_cmd, why)
        raise
    except BaseException as e:
        for cell in cells:
            record_failure(cell.info, cell.failed or e, cell.resume_cmd)
        if is_storage_error(e):
            raise RunStorageError(storage_message(e, cells[0].run_dir if len(cells) == 1 else None)) from e
        raise
    finally:
        bar.close()
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
            for svc, _ in stores.values():
                svc.close()
