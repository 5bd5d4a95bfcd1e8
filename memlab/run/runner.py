"""``run_experiment``: one run as a short sequence of stages, each in its own module.

1. config + data validated, questions selected (`selection`) — before any folder exists;
2. components built from the registries, or the user's own (`components`);
3. extraction into the cached store, traces, warm indexes (`extraction`);
4. the model endpoints checked (`clients`), then answering with the resume log (`answering`);
5. scoring and the summary (`results`), and ``run.json`` (status, counts, timings, provenance).

Results under ``results/<run_id>/``: ``config.yaml`` (as run), ``environment.json``, ``predictions.jsonl``
(the resume log: one `PredictionRecord` per finished question), ``predictions.parquet`` /
``summary.parquet`` (what `load_run` reads) with CSV exports, ``traces/*.jsonl`` and ``run.json``.
Caches live under ``<results root>/.cache/`` (see `memlab.run.extraction` and `memlab.llm`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import sys
import time
from pathlib import Path
from typing import Any

from memlab import __version__, cache_integrity
from memlab.answer import Answerer
from memlab.atomic import write_json, write_text
from memlab.data import load_locomo, sha256_file
from memlab.eval import cost as costs
from memlab.eval.errata import errata_columns, errata_counts, load_errata
from memlab.eval.profiles import apply_scoring
from memlab.extract.extractors import EXTRACTORS, Extractor
from memlab.run.answering import StopFlag, Terminated, answer_all, load_done, read_log, remembered_interrupts
from memlab.run.checks import inert_knobs
from memlab.run.clients import Clients, check_endpoints
from memlab.run.components import build_answerer, build_extractor, build_judge, component_label
from memlab.run.config import ConfigError, ExperimentConfig, parse_sets
from memlab.run.extraction import run_extraction
from memlab.run.records import RunStatus
from memlab.run.results import (
    RECALL_KS,
    Run,
    add_costs,
    load_run,
    read_config,
    read_run_json,
    score_records,
    summarize,
    write_results,
)
from memlab.run.selection import select_questions
from memlab.run.systems import build_system, run_system
from memlab.rundir import RunLock, environment, open_run_dir, remember_settings, remembered_settings, results_root
from memlab.systems import MemorySystem

__all__ = ["Run", "load_run", "run_ablation", "run_experiment"]


def _resolve(config: ExperimentConfig | str | Path | None, resume: str | Path | None,
             overrides: dict[str, Any] | list[str] | None, force_config: bool,
             trust_run_config: bool = False) -> tuple[ExperimentConfig, dict]:
    """The run's config, and for a resume the run.json it left (refusing silent config changes, and endpoints,
    key variables or prompt files the user did not start the run with)."""
    if resume is None:
        if config is None:
            raise ConfigError("run_experiment: give a config (or resume=RUN_DIR)")
        cfg = config if isinstance(config, ExperimentConfig) else ExperimentConfig.from_yaml(config)
        if overrides:
            cfg = cfg.with_overrides(overrides)
        if cfg.grid:
            raise ConfigError("this config is an ablation (it has a grid): use run_ablation, or expand() it")
        return cfg, {}
    run_dir = Path(resume)
    if not (run_dir / "config.yaml").is_file():
        raise FileNotFoundError(f"{run_dir}: not a run folder (no config.yaml)")
    cfg = read_config(run_dir / "config.yaml")
    if overrides:
        if not force_config:
            raise ConfigError(f"--resume {run_dir}: refusing --set {overrides!r}: a resumed run keeps its config "
                              f"(add --force-config to apply the overrides to the remaining questions)")
        cfg = cfg.with_overrides(overrides)
    _check_trust(run_dir, cfg, parse_sets(overrides) if isinstance(overrides, list) else overrides or {},
                 trust_run_config)
    prev = read_run_json(run_dir / "run.json") if (run_dir / "run.json").is_file() else {}
    return cfg, prev


def _check_trust(run_dir: Path, cfg: ExperimentConfig, named: dict[str, Any], trusted: bool) -> None:
    """Refuse a resume whose folder names an endpoint, key variable or prompt file that this user neither started
    the run with (`memlab.rundir.remembered_settings`) nor names now (``--set``), unless ``trusted``: a crafted
    folder must not send the user's secrets or files to a server of its choosing."""
    settings = cfg.trust_settings()
    mine = remembered_settings(run_dir)
    said = {(k.rsplit(".", 1)[-1], repr(v)) for k, v in named.items()}
    strange = {k: v for k, v in settings.items() if mine.get(k) != v and (k.rsplit(".", 1)[-1], repr(v)) not in said}
    if strange and not trusted:
        listed = "; ".join(f"{k} = {v!r}" for k, v in strange.items())
        raise ConfigError(f"--resume {run_dir}: its config.yaml names endpoints, key variables or prompt files this "
                          f"user did not start the run with: {listed}. Check them, then add --trust-run-config to "
                          f"use them (or --force-config --set KEY=VALUE to replace them)")
    if settings != mine:
        remember_settings(run_dir, settings)


def run_experiment(config: ExperimentConfig | str | Path | None = None, results: str | Path | None = None,
                   resume: str | Path | None = None, progress: bool = True, *,
                   overrides: dict[str, Any] | list[str] | None = None, force_config: bool = False,
                   trust_run_config: bool = False, extractor: Extractor | None = None,
                   answerer: Answerer | None = None, system: MemorySystem | None = None) -> Run:
    """Run one experiment (a config without a grid) and return its `Run`.

    ``resume`` finishes a killed or errored run (its errored questions are answered again) while holding the
    folder's lock (a second process on it is refused, `RunFolderBusy`); ``trust_run_config`` lets a resume use
    endpoints, key variables and prompt files from the folder that this user did not start it with;
    ``extractor`` / ``answerer`` replace the configured components with the caller's own objects; ``system`` (a
    `memlab.systems.MemorySystem`) replaces the memory pipeline the arms search (as ``system.name`` does). Ctrl-C and
    SIGTERM stop the run as ``interrupted``; a storage error (disk full, read-only folder) marks it ``failed``
    and is raised as `RunStorageError` naming the path.
    """
    t_start = time.perf_counter()
    cfg, prev = _resolve(config, resume, overrides, force_config, trust_run_config)
    with contextlib.ExitStack() as held:
        if resume is not None:  # before any work: a second resume of this folder stops here
            held.enter_context(RunLock(resume))
        stop = held.enter_context(remembered_interrupts())
        return _run(cfg, prev, results, resume, progress, extractor, answerer, held, stop, t_start, system)


def _run(cfg: ExperimentConfig, prev: dict[str, Any], results: str | Path | None, resume: str | Path | None,
         progress: bool, extractor: Extractor | None, answerer: Answerer | None, held: contextlib.ExitStack,
         stop: StopFlag, t_start: float, system: MemorySystem | None = None) -> Run:
    # -- 1. validate everything before a run folder exists
    t0 = time.perf_counter()
    data = load_locomo(cfg.dataset.path)
    dataset_sha = sha256_file(data.report.path)
    if prev.get("dataset_sha256") and prev["dataset_sha256"] != dataset_sha:
        raise ConfigError(f"--resume {resume}: the dataset changed since the run started "
                          f"({data.report.path}: sha256 {dataset_sha[:12]}…, the run used "
                          f"{prev['dataset_sha256'][:12]}…); start a new run")
    picks = select_questions(cfg, data)
    errata = load_errata(cfg.scoring.errata) if cfg.scoring.errata else None
    if errata is not None:  # a bad errata file or an unknown qid fails before anything runs
        errata.check_known(q.qid for c in data for q in c.questions)
    convs = list({c.sample_id: c for c, _ in picks}.values())
    load_s = time.perf_counter() - t0
    # -- 2. components
    root = Path(resume).parent if resume is not None else Path(results) if results is not None else results_root()
    root = root.resolve()
    cache_root = root / ".cache"
    cache_root.mkdir(parents=True, exist_ok=True)
    integrity_mark = cache_integrity.mark()
    clients = Clients(cfg, cache_root / "responses.sqlite")
    custom = {"extractor": extractor is not None, "answerer": answerer is not None, "system": system is not None}
    on_system = system is not None or cfg.system.name != "memlab"  # an adapter's store, not the extraction stage
    answerer = answerer if answerer is not None else build_answerer(cfg, clients)
    if answerer.needs_memory and extractor is None and not on_system:
        extractor = build_extractor(cfg, clients)
    judge = build_judge(cfg, clients)
    if errata is not None and hasattr(judge, "errata"):
        judge.errata = errata  # the judge sees corrected gold answers and skips invalid ones
    notes = inert_knobs(cfg, RECALL_KS)
    # -- the run folder
    run_dir = open_run_dir(cfg.name, cfg.to_yaml(), root, resume)
    if resume is None:
        held.enter_context(RunLock(run_dir))
    info: dict[str, Any] = {
        "run_id": run_dir.name, "status": RunStatus.RUNNING.value, "memlab_version": __version__,
        "dataset": data.report.path, "dataset_sha256": dataset_sha, "questions": len(picks),
        "config": cfg.to_dict(), "environment": environment(),
        "components": {"answerer": component_label(answerer),
                       "extractor": component_label(extractor) if extractor is not None else None, "custom": custom},
        "sessions": prev.get("sessions", []), "notes": notes,
    }
    timings: dict[str, float] = {"load_s": load_s}
    svc = None
    try:
        write_json(run_dir / "run.json", {**info, "timings": timings})
        # -- 3. extraction
        ext_info: dict[str, Any] = {}
        if answerer.needs_memory and on_system:
            if system is None:
                system = build_system(cfg, clients, run_dir)
            out = run_system(cfg, convs, system, run_dir)
            svc, info["system"] = out.service, out.info
            info["components"]["system"] = component_label(system)
            timings.update(out.timings)
        elif answerer.needs_memory:
            assert extractor is not None
            extractor_id = extractor.cache_id()
            if custom["extractor"] and type(extractor) not in {EXTRACTORS.get(n) for n in EXTRACTORS}:
                # a user's class: its module and name key the cache, so two classes never share one
                extractor_id = f"{type(extractor).__module__}.{type(extractor).__qualname__}:{extractor_id}"
            out = run_extraction(cfg, data, convs, extractor, clients, cache_root, run_dir, dataset_sha,
                                 extractor_id=extractor_id)
            svc, ext_info = out.service, out.info
            timings.update(out.timings)
            if ext_info.get("ops_failed"):
                print(f"memlab: {ext_info['ops_failed']} extraction op(s) failed to write (see "
                      f"{run_dir / 'traces' / 'extraction.jsonl'})")
        info["extraction"] = ext_info
        stop.stop()  # a signal swallowed during extraction still stops the run here
        # -- 4. answering
        if cfg.run.check_endpoint:
            check_endpoints(cfg, clients, roles=("reader", "judge"))
        done = load_done(run_dir)
        done_ids = {r.qid for r in done}
        todo = [(c, q) for c, q in picks if q.qid not in done_ids]
        t0 = time.perf_counter()
        try:
            answered = answer_all(cfg, answerer, judge, svc, todo, run_dir, progress=progress, stop=stop)
        finally:
            timings["answering_s"] = time.perf_counter() - t0
        if hasattr(answerer, "build_texts"):  # an arm that indexes raw turns itself: its embedding cost
            rows = costs.index_usage({c.sample_id: answerer.build_texts(c) for c in convs})
            write_text(run_dir / "traces" / "build_cost.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
        # -- 5. scoring
        t0 = time.perf_counter()
        order = {q.qid: i for i, (_, q) in enumerate(picks)}
        records = sorted(read_log(run_dir), key=lambda r: order.get(r.qid, len(order)))
        pred = score_records(records, top_k=cfg.retrieval.top_k if answerer.uses_top_k else None)
        pred = apply_scoring(pred, cfg.scoring.profile, errata)  # errata, then the profile's scores
        pred, info["cost"] = add_costs(run_dir, cfg, pred, {c.sample_id: len(c.questions) for c in convs},
                                       expect_build=(answerer.needs_memory and not on_system)
                                       or hasattr(answerer, "build_texts"))
        if info["cost"].get("build_unknown"):
            print(f"memlab: {info['cost']['build_unknown']}")
        summ = summarize(pred, cfg)
        info["scoring"] = {"profile": cfg.scoring.profile, "errata": cfg.scoring.errata, **errata_counts(pred)}
        if errata is not None:
            summ = summ.join(errata_columns(pred, summ.index))
        write_results(run_dir, pred, summ)
        timings["scoring_s"] = time.perf_counter() - t0
        errors = int(pred["error"].notna().sum())
        info.update({
            "status": (RunStatus.COMPLETE_WITH_ERRORS if errors else RunStatus.COMPLETE).value,
            "errors": errors, "judge_errors": int(pred["judge_error"].notna().sum()),
            "error_rate": errors / max(len(pred), 1), "resumed_skipped": len(done), "answered_now": answered,
            "models": clients.totals(), "model_roles": cfg.describe_models(),
        })
        return Run(run_dir=run_dir, config=cfg, predictions=pred, summary=summ, info=info)
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM, in any stage
        info["status"] = RunStatus.INTERRUPTED.value
        info["resume"] = f"memlab run --resume {run_dir}"
        why = "terminated (SIGTERM)" if isinstance(e, Terminated) else "interrupted"
        print(f"\nmemlab: {why}; every finished question is kept. Resume with:\n"
              f"  memlab run --resume {run_dir}", file=sys.stderr)
        raise
    except BaseException as e:
        if info["status"] == RunStatus.RUNNING.value:
            info["status"] = RunStatus.FAILED.value
            info["failure"] = f"{type(e).__name__}: {e}"
        info["resume"] = f"memlab run --resume {run_dir}"
        if is_storage_error(e):
            raise RunStorageError(storage_message(e, run_dir)) from e
        raise
    finally:
        timings["total_s"] = time.perf_counter() - t_start
        info["sessions"] = info["sessions"] + [{"timings": timings, "status": info["status"]}]
        info["timings"] = _total_timings(info["sessions"])
        # every cache found corrupt (and rebuilt) while this run used it, by path
        info["cache_integrity"] = [e.to_dict() for e in cache_integrity.since(integrity_mark)]
        try:
            write_json(run_dir / "run.json", info)
        except OSError as e:  # the disk is full or the folder read-only: say so, without hiding the first error
            print(f"memlab: could not record the run's status in {run_dir / 'run.json'}: {e.strerror or e}",
                  file=sys.stderr)
            if info["status"] not in (RunStatus.FAILED.value, RunStatus.INTERRUPTED.value):
                raise RunStorageError(storage_message(e, run_dir)) from e
        if svc is not None:
            svc.close()


class RunStorageError(OSError):
    """The run could not write or read its folder or caches (disk full, read-only, name too long): marked failed."""


_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG, errno.ENAMETOOLONG}
_STORAGE_ERRNOS = _WRITE_ERRNOS | {errno.EACCES, errno.EPERM, errno.EIO, errno.ENOTDIR, errno.EISDIR}
#: SQLite's words for the same causes (the caches are SQLite files; it raises its own error type).
_SQLITE_STORAGE = ("disk is full", "readonly database", "disk i/o error", "unable to open database file")


def is_storage_error(e: BaseException) -> bool:
    """Whether ``e`` is a failure to write or read a file (not a network error, which has its own message)."""
    import sqlite3

    if isinstance(e, sqlite3.Error):
        return any(w in str(e).lower() for w in _SQLITE_STORAGE)
    return isinstance(e, OSError) and not isinstance(e, (ConnectionError, TimeoutError, RunStorageError)) and \
        (e.filename is not None or e.errno in _STORAGE_ERRNOS)


def storage_message(e: BaseException, run_dir: Path | None = None) -> str:
    """One line: the path, the cause, and (in a run) what happens next."""
    if isinstance(e, OSError):
        where = f"{e.filename}" + (f" -> {e.filename2}" if e.filename2 else "") if e.filename else "a file"
        name = errno.errorcode.get(e.errno or 0)
        verb = "cannot write" if e.errno in _WRITE_ERRNOS else "cannot use"
        text = f"{verb} {where}: {e.strerror or e}" + (f" ({name})" if name else "")
    else:  # SQLite names no file: the caches are under the results root's .cache/
        where = f" under {run_dir.parent / '.cache'}" if run_dir is not None else ""
        text = f"cannot write a cache database{where}: {e}"
    if run_dir is not None:
        text += f"; the run is marked failed. Fix the cause, then: memlab run --resume {run_dir}"
    return text


def _total_timings(sessions: list[dict[str, Any]]) -> dict[str, float]:
    """Stage timings summed over the sessions of a run (a resumed run keeps the original's)."""
    out: dict[str, float] = {}
    for s in sessions:
        for k, v in s.get("timings", {}).items():
            out[k] = out.get(k, 0.0) + float(v)
    return out


def run_ablation(config: ExperimentConfig | str | Path, results: str | Path | None = None,
                 progress: bool = True) -> list[Run]:
    """Every run of an ablation grid, in order (each its own folder, sharing the caches)."""
    cfg = config if isinstance(config, ExperimentConfig) else ExperimentConfig.from_yaml(config)
    return [run_experiment(c, results=results, progress=progress) for c in cfg.expand()]
