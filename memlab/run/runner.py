"""``run_experiment``: one run as a short sequence of stages, each in its own module.

1. config + data validated, questions selected (`selection`) — before any folder exists;
2. components built from the registries, or the user's own (`components`); in the run folder, every
   model endpoint they use checked at once, before any work (`clients.check_endpoints`);
3. and 4. the stage engine (`engine`): extraction into the cached store, traces, warm indexes (`extraction`),
   answering with the resume log (`answering`), each a batch of units mapped by the executor (`executors`);
5. scoring and the summary (`results`), and ``run.json`` (status, counts, timings, provenance).

Results under ``results/<run_id>/``: ``config.yaml`` (as run), ``environment.json``, ``predictions.jsonl``
(the resume log: one `PredictionRecord` per finished question), ``predictions.parquet`` /
``summary.parquet`` (what `load_run` reads) with CSV exports, ``traces/*.jsonl`` and ``run.json``.
Caches live under ``<results root>/.cache/`` (see `memlab.run.extraction` and `memlab.llm`).
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

from memlab import cache_integrity
from memlab.answer import Answerer, Judge
from memlab.extract.extractors import Extractor
from memlab.index.embedders import Embedder
from memlab.llm.cancel import allow_calls, cancel_calls
from memlab.llm.spend import SpendCapReached, capped
from memlab.memory.search_types import Searcher
from memlab.run.answering import StopFlag, Terminated, remembered_interrupts
from memlab.run.clients import Clients, check_endpoints
from memlab.run.components import component_label
from memlab.run.config import ConfigError, ExperimentConfig, parse_sets
from memlab.run.engine import Engine
from memlab.run.executors import Local
from memlab.run.results import Run, RunFileError, load_run, read_config, read_run_json
from memlab.run.reuse import copy_as, renamed_twin, reusable_run
from memlab.run.spend import SPEND_KEYS, record_stop, spend_cap, spend_overrides
from memlab.run.steps import (  # noqa: F401 - RunStorageError, is_storage_error, storage_message: public here too
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
from memlab.run.systems import build_system, run_system
from memlab.run.trust import check_trust
from memlab.run.units import Cell
from memlab.rundir import RunLock, open_run_dir, results_root
from memlab.systems import MemorySystem
from memlab.threads import peak_rss_mb, set_threads

__all__ = ["Run", "RunStorageError", "load_run", "run_ablation", "run_experiment"]


def resolve_run_config(config: ExperimentConfig | str | Path | None, resume: str | Path | None,
                       overrides: dict[str, Any] | list[str] | None, force_config: bool,
                       trust_run_config: bool = False) -> tuple[ExperimentConfig, dict]:
    """The run's config, and for a resume the run.json it left (refusing silent config changes, and endpoints,
    key variables or prompt files the user did not start the run with); every executor starts with it."""
    if resume is None:
        cfg = ExperimentConfig.of(config, overrides)
        if cfg.grid:
            raise ConfigError("this config is an ablation (it has a grid): use run_ablation, or expand() it")
        return cfg, {}
    run_dir = Path(resume)
    if not (run_dir / "config.yaml").is_file():
        raise FileNotFoundError(f"{run_dir}: not a run folder (no config.yaml)")
    cfg = read_config(run_dir / "config.yaml")
    if overrides:
        if not force_config and not spend_overrides(overrides):
            raise ConfigError(f"--resume {run_dir}: refusing --set {overrides!r}: a resumed run keeps its config "
                              f"(add --force-config to apply the overrides to the remaining questions; "
                              f"{' and '.join(SPEND_KEYS)} need none)")
        cfg = cfg.with_overrides(overrides)
    check_trust(run_dir, cfg, parse_sets(overrides) if isinstance(overrides, list) else overrides or {},
                trust_run_config)
    prev = read_run_json(run_dir / "run.json") if (run_dir / "run.json").is_file() else {}
    return cfg, prev


def _brief(what: object, limit: int = 300) -> str:
    """A cause as one short line (an error listing many files says the first ones and how many more)."""
    text = " ".join(str(what).split())
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text):,} characters)"


def run_experiment(config: ExperimentConfig | str | Path | None = None, results: str | Path | None = None,
                   resume: str | Path | None = None, progress: bool = True, *,
                   overrides: dict[str, Any] | list[str] | None = None, force_config: bool = False,
                   trust_run_config: bool = False, extractor: Extractor | None = None,
                   answerer: Answerer | None = None, system: MemorySystem | None = None, judge: Judge | None = None,
                   searcher: Searcher | None = None, embedder: Embedder | None = None, reuse: bool = False,
                   executor: str | None = None) -> Run:
    """Run one experiment (a config without a grid) and return its `Run`.

    ``resume`` finishes a killed or errored run (its errored questions are answered again) while holding the
    folder's lock (a second process on it is refused, `RunFolderBusy`); ``trust_run_config`` lets a resume use
    endpoints, key variables and prompt files from the folder that this user did not start it with;
    ``extractor`` / ``answerer`` replace the configured components with the caller's own objects; ``system`` (a
    `memlab.systems.MemorySystem`) replaces the memory pipeline the arms search (as ``system.name`` does); ``judge``
    (a `memlab.answer.Judge`) scores instead of ``judge.name``; ``searcher`` (any `memlab.memory.Searcher`) replaces
    the configured index, or ``embedder`` (a `memlab.index.Embedder`) its embedder. Ctrl-C and
    SIGTERM stop the run as ``interrupted``; a storage error (disk full, read-only folder) marks it ``failed``
    and is raised as `RunStorageError` naming the path. ``reuse`` returns the newest complete run of the same
    config, data and code under the results root instead of running it again (`memlab.run.reuse`), and says so.
    ``executor`` (default ``run.executor``) is where it runs: ``ray`` hands it to `memlab.run.ray_executor`.
    """
    t_start = time.perf_counter()
    allow_calls()  # an interrupted run earlier in this process cancelled model calls; this one may call
    cfg, prev = resolve_run_config(config, resume, overrides, force_config, trust_run_config)
    if reuse and resume is not None:
        raise ConfigError("run_experiment: reuse=True with resume=RUN_DIR: a resume finishes its own folder; "
                          "give one of them")
    if reuse and any(x is not None for x in (extractor, answerer, system, judge, searcher, embedder)):
        raise ConfigError("run_experiment: reuse=True with your own component objects (extractor, answerer, "
                          "system, judge, searcher, embedder): a run "
                          "folder cannot tell whether it used the same objects; drop reuse or the objects")
    kind = executor or cfg.run.executor
    if kind != "local":  # honoured, not ignored: that executor's driver runs it (after the config's checks)
        cfg.with_overrides({"run.executor": kind})
        return _on_executor(cfg, results, resume, progress, overrides, force_config, trust_run_config, reuse,
                            extractor, answerer, system, judge, searcher, embedder)
    with contextlib.ExitStack() as held:
        if resume is not None:  # before any work: a second resume of this folder stops here
            held.enter_context(RunLock(resume))
        stop = held.enter_context(remembered_interrupts())
        given = {"extractor": extractor, "answerer": answerer, "system": system, "judge": judge,
                 "searcher": searcher, "embedder": embedder}
        p = None
        if reuse:
            p = prepare(cfg, prev, resume)
            root = results_root(results, resume)
            found, why = reusable_run(root, p)
            if found is not None:
                print(f"memlab: reusing {found.run_dir} (complete; same config, data and code; reuse=False runs "
                      f"it again)")
                return found
            twin = renamed_twin(root, p)
            if twin is not None:
                try:
                    found = copy_as(twin, p, root)
                except (OSError, RunFileError, ValueError) as e:
                    print(f"memlab: not reusing {twin}: copying it under {cfg.name!r} failed ({_brief(e)})")
                else:
                    print(f"memlab: reusing {twin} as {found.run_dir} (complete; same config but its name, same "
                          f"data and code; reuse=False runs it again)")
                    return found
            if why:
                print(f"memlab: not reusing {_brief(why)}")
        return _run(cfg, prev, results, resume, progress, given, held, stop, t_start, p)


def _run(cfg: ExperimentConfig, prev: dict[str, Any], results: str | Path | None, resume: str | Path | None,
         progress: bool, given: dict[str, Any], held: contextlib.ExitStack, stop: StopFlag, t_start: float,
         prepared: Prepared | None = None) -> Run:
    """`run_experiment`'s body; ``given``: the caller's component objects by name (None: configured)."""
    system = given["system"]
    # -- 1. validate everything before a run folder exists
    p = prepared if prepared is not None else prepare(cfg, prev, resume)
    cfg = p.cfg  # with the dataset's scoring profile
    threads = set_threads(cfg.run.threads)  # every native pool sized before a model or index is built
    # -- 2. components
    root = results_root(results, resume)
    cache_root = root / ".cache"
    cache_root.mkdir(parents=True, exist_ok=True)
    integrity_mark = cache_integrity.mark()
    clients = Clients(cfg, cache_root / "responses.sqlite")
    comps = build_components(cfg, clients, p.errata, **given)
    cap = held.enter_context(capped(spend_cap(cfg, p.prev)))  # every model request counted, and capped if asked
    # -- the run folder
    run_dir = open_run_dir(cfg.name, cfg.to_yaml(), root, resume)
    if resume is None:
        held.enter_context(RunLock(run_dir))
    resume_cmd = f"memlab run --resume {run_dir}"
    timings: dict[str, float] = {"load_s": p.load_s}
    info = open_info(p, run_dir, comps, {"kind": "local"})
    info["threads"] = threads
    stop.on_signal(interrupted_on_signal(run_dir, info, resume_cmd))
    cell = Cell(0, p, comps, run_dir, info, clients, timings)
    peak = cell.peak  # the process's peak RSS (MB) after each stage
    ex = Local(cfg.run.threads)
    engine = Engine([cell], ex, cache_root, stop, progress)
    try:
        write_run_json(run_dir, {**info, "timings": timings})
        if cfg.run.check_endpoint:  # every model endpoint this run calls, at once, before any work
            check_endpoints(cfg, clients, clients.roles_in_use(comps.answerer))
        if comps.answerer.needs_memory and comps.on_system:  # a memory system ingests; the engine answers
            if system is None:
                system = build_system(cfg, clients, run_dir)
            out = run_system(cfg, p.convs, system, run_dir)
            cell.service, info["system"] = out.service, out.info
            info["components"]["system"] = component_label(system)
            timings.update(out.timings)
            peak["extraction"] = peak_rss_mb()  # the system's ingest
        # -- 3. and 4. extraction, indexes, answering: the stage engine
        try:
            engine.run()
        finally:
            info["executor"]["answer_processes"] = ex.processes
            if ex.processes > 1:  # each forked process's own (pages shared with this one count in both)
                peak["answer_processes"] = peak_rss_mb(children=True)
        ext_info = info.get("extraction") or {}
        if ext_info.get("ops_failed"):
            print(f"memlab: {ext_info['ops_failed']} extraction op(s) failed to write (see "
                  f"{run_dir / 'traces' / 'extraction.jsonl'})")
        engine.raise_failed()
        stop.stop()  # a signal swallowed by a component still stops the run here
        if cap.reason is not None:  # a refused request whose stop a component swallowed: still not complete
            raise SpendCapReached(cap.reason)
        # -- 5. scoring
        run = finish_run(p, run_dir, comps.answerer, info, timings, cell.done, cell.answered, clients.totals(),
                         on_system=comps.on_system)
        peak["scoring"] = peak_rss_mb()
        return run
    except SpendCapReached as e:  # the cap refused a request: nothing in flight is cut (what it buys is cached)
        record_stop(info, str(e), resume_cmd)
        raise
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM, in any stage
        how = "terminated (SIGTERM)" if isinstance(e, Terminated) else "interrupted"
        cancel_calls(f"the run was {how}")  # calls in flight end now, and their servers stop generating
        record_interrupt(info, resume_cmd, how)
        raise
    except BaseException as e:
        record_failure(info, e, resume_cmd)
        if is_storage_error(e):
            raise RunStorageError(storage_message(e, run_dir)) from e
        raise
    finally:
        timings["total_s"] = time.perf_counter() - t_start
        info["spend"] = cap.record()
        info["peak_rss_mb"] = peak  # this session's, per stage (a process's peak only grows: the last is the run's)
        try:
            close_session(run_dir, info, timings, integrity_mark,  # per session: plan vs actual sums them
                          {"peak_rss_mb": peak, "models_by_role": clients.totals()["by_role"]})
        finally:
            engine.close()
            if cell.service is not None:
                cell.service.close()


def _on_executor(cfg: ExperimentConfig, results: str | Path | None, resume: str | Path | None, progress: bool,
                 overrides: dict[str, Any] | list[str] | None, force_config: bool, trust_run_config: bool,
                 reuse: bool, *objects: Any) -> Run:
    """`run_experiment` of a config whose ``run.executor`` is not ``local``: run there, or refuse what it cannot do."""
    from memlab.run.ray_executor import run_grid_ray

    if reuse or any(o is not None for o in objects):
        raise ConfigError("run_experiment: the ray executor runs the configured components only "
                          "(no reuse=True, no extractor/answerer/system/judge/searcher/embedder objects: they "
                          "would not reach its workers); run it with executor='local' to use them")
    if resume is not None:
        return run_grid_ray(resume=resume, progress=progress, overrides=overrides, force_config=force_config,
                            trust_run_config=trust_run_config)[0]
    return run_grid_ray(cfg, results=results, progress=progress)[0]


def run_ablation(config: ExperimentConfig | str | Path, results: str | Path | None = None,
                 progress: bool = True, *, reuse: bool = False) -> list[Run]:
    """Every run of an ablation grid, in order (each its own folder, sharing the caches; ``reuse`` as in
    `run_experiment`, per grid point), on the config's ``run.executor`` (`memlab.run.executors.run_grid`)."""
    from memlab.run.executors import run_grid

    return run_grid(ExperimentConfig.of(config, caller="run_ablation"), results=results, progress=progress,
                    reuse=reuse)
