"""The steps of one run, called by both executors (`memlab.run.runner` in this process, `memlab.run.ray_executor`
on a cluster): validate it, build its components, open its ``run.json``, score and finish it, record a failure
and close the session. An executor only decides where the extraction and answering units run; what a run is,
and what its folder holds, is decided here once, so the two cannot drift.
"""

from __future__ import annotations

import errno
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from memlab import __version__
from memlab.atomic import write_json, write_text
from memlab.data import Conversation, LoCoMo, Question, dataset_name, dataset_sha256, load_dataset
from memlab.eval import cost as costs
from memlab.eval.errata import errata_columns, errata_counts, load_errata
from memlab.eval.profiles import apply_scoring, judge_rule_columns
from memlab.extract.extractors import EXTRACTORS, Extractor
from memlab.run.answering import read_log
from memlab.run.checks import inert_knobs
from memlab.run.clients import Clients
from memlab.run.components import build_answerer, build_extractor, build_judge, component_label, component_params
from memlab.run.config import ConfigError, ExperimentConfig
from memlab.run.records import RunInfo, RunStatus
from memlab.run.results import RECALL_KS, Run, add_costs, score_records, summarize, write_results
from memlab.run.reuse import input_files
from memlab.run.selection import run_profile, select_questions
from memlab.rundir import environment


@dataclass
class Prepared:
    """A run validated before any folder exists: its data, questions and errata."""

    cfg: ExperimentConfig
    prev: dict[str, Any]
    data: LoCoMo
    dataset_sha: str
    picks: list[tuple[Conversation, Question]]
    convs: list[Conversation]
    errata: Any
    load_s: float
    notes: list[str]
    """What loading said (a scoring profile chosen for the dataset, a profile's caveat): run.json ``notes``."""


def prepare(cfg: ExperimentConfig, prev: dict[str, Any], resume: str | Path | None,
            loaded: tuple[LoCoMo, str] | None = None) -> Prepared:
    """Load and check the data (a resumed run refuses a changed dataset), apply the dataset's scoring profile
    (``Prepared.cfg`` is the run's config from here on), select the questions, check the errata; ``loaded`` is
    a (dataset, sha256) pair the caller already read (a grid reads it once)."""
    t0 = time.perf_counter()
    if loaded is None:
        data = load_dataset(cfg.dataset.path)  # LoCoMo or LongMemEval, told by the file's fields
        loaded = (data, dataset_sha256(data))
    data, dataset_sha = loaded
    cfg, notes = run_profile(cfg, data)  # the dataset's scoring profile
    if prev.get("dataset_sha256") and prev["dataset_sha256"] != dataset_sha:
        raise ConfigError(f"--resume {resume}: the dataset changed since the run started "
                          f"({data.report.path}: sha256 {dataset_sha[:12]}…, the run used "
                          f"{prev['dataset_sha256'][:12]}…); start a new run")
    picks = select_questions(cfg, data)
    errata = load_errata(cfg.scoring.errata) if cfg.scoring.errata else None
    if errata is not None:  # a bad errata file or an unknown qid fails before anything runs
        errata.check_known(q.qid for c in data for q in c.questions)
    convs = list({c.sample_id: c for c, _ in picks}.values())
    return Prepared(cfg, prev, data, dataset_sha, picks, convs, errata, time.perf_counter() - t0, notes)


@dataclass
class Components:
    """A run's answer arm, extractor (None when the arm reads no memory) and judge; ``custom`` says which
    the caller gave as objects."""

    answerer: Any
    extractor: Extractor | None
    judge: Any
    custom: dict[str, bool]
    on_system: bool = False
    """Memories come from a memory system's store (`memlab.systems`), not from memlab's extraction stage."""
    searcher: Any = None
    """The caller's own `memlab.memory.Searcher` (None: the configured `HybridIndex`)."""
    embedder: Any = None
    """The caller's own `memlab.index.Embedder` for the configured index (None: ``index.embedder``)."""

    @property
    def extractor_id(self) -> str | None:
        """The extractor's name in the extraction cache key: a user's own class adds its module and name, so
        two classes never share one cache."""
        if self.extractor is None:
            return None
        eid = self.extractor.cache_id()
        if self.custom["extractor"] and type(self.extractor) not in {EXTRACTORS.get(n) for n in EXTRACTORS}:
            eid = f"{type(self.extractor).__module__}.{type(self.extractor).__qualname__}:{eid}"
        return eid


def attach_errata(judge: Any, errata: Any) -> Any:
    """The judge sees corrected gold answers and skips invalid ones (`memlab.answer.Judge.errata`)."""
    if errata is not None and judge is not None:
        judge.errata = errata
    return judge


def build_components(cfg: ExperimentConfig, clients: Clients, errata: Any = None, extractor: Extractor | None = None,
                     answerer: Any = None, system: Any = None, judge: Any = None, searcher: Any = None,
                     embedder: Any = None) -> Components:
    """The configured components, or the caller's own ``extractor`` / ``answerer`` / ``system`` / ``judge`` /
    ``searcher`` / ``embedder`` objects. A run on a memory system other than memlab's own pipeline builds no
    extractor: the system stores the memories."""
    given = {"extractor": extractor, "answerer": answerer, "system": system, "judge": judge, "searcher": searcher,
             "embedder": embedder}
    custom = {name: obj is not None for name, obj in given.items()}
    if searcher is not None and embedder is not None:
        raise ValueError("run_experiment: give a searcher or an embedder for the configured index, not both "
                         "(a searcher brings its own)")
    on_system = system is not None or cfg.system.name != "memlab"
    answerer = answerer if answerer is not None else build_answerer(cfg, clients)
    if answerer.needs_memory and extractor is None and not on_system:
        extractor = build_extractor(cfg, clients)
    judge = attach_errata(judge if judge is not None else build_judge(cfg, clients), errata)
    return Components(answerer, extractor, judge, custom, on_system, searcher, embedder)


def open_info(p: Prepared, run_dir: Path, comps: Components, executor: dict[str, Any]) -> dict[str, Any]:
    """The run.json of a run that has started (status running); the caller writes it before any work."""
    info: dict[str, Any] = {
        "run_id": run_dir.name, "status": RunStatus.RUNNING.value, "memlab_version": __version__,
        "dataset": p.data.report.path, "dataset_format": dataset_name(p.data), "dataset_sha256": p.dataset_sha,
        "questions": len(p.picks),
        "config": p.cfg.to_dict(), "environment": environment(),
        "components": {"answerer": component_label(comps.answerer),
                       "extractor": component_label(comps.extractor) if comps.extractor is not None else None,
                       **{name: component_label(getattr(comps, name)) for name in ("judge", "searcher", "embedder")
                          if comps.custom[name] or (name == "judge" and comps.judge is not None)},
                       "custom": comps.custom,
                       "params": component_params(p.cfg, comps.extractor, comps.answerer, comps.judge)},
        "sessions": p.prev.get("sessions", []), "notes": inert_knobs(p.cfg, RECALL_KS) + p.notes,
        "executor": executor, "input_files": input_files(p.cfg.to_dict()),  # what reuse compares beyond the config
    }
    if any(p.cfg.role_in_use(r) for r in ("extractor", "reader", "judge")):  # what it will ask, beside what it did
        from memlab.run.plan import make_plan

        info["plan"] = make_plan(p.cfg, p.picks, p.convs, comps, None).to_dict()
    return info


def finish_run(p: Prepared, run_dir: Path, answerer: Any, info: dict[str, Any], timings: dict[str, float],
               resumed_skipped: int, answered_now: int, models: dict[str, int], on_system: bool = False) -> Run:
    """Score the resume log, write the predictions and summary, and complete ``info`` (run.json's content)."""
    cfg = p.cfg
    t0 = time.perf_counter()
    if answerer.own_index:  # an arm that indexes raw turns itself: its embedding cost
        import json

        rows = costs.index_usage({c.sample_id: answerer.build_texts(c) for c in p.convs})
        (run_dir / "traces").mkdir(exist_ok=True)
        write_text(run_dir / "traces" / "build_cost.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    order = {q.qid: i for i, (_, q) in enumerate(p.picks)}
    records = sorted(read_log(run_dir), key=lambda r: order.get(r.qid, len(order)))
    pred = score_records(records, top_k=cfg.retrieval.top_k if answerer.uses_top_k else None)
    pred = apply_scoring(pred, cfg.scoring.profile, p.errata)  # errata, then the profile's scores
    if cfg.judge.model:  # J under each verdict rule the profile names (LongMemEval: strict and official)
        pred = judge_rule_columns(pred, cfg.scoring.profile, cfg.judge.repeats)
    pred, info["cost"] = add_costs(run_dir, cfg, pred, {c.sample_id: len(c.questions) for c in p.convs},
                                   expect_build=(answerer.needs_memory and not on_system) or answerer.own_index)
    if info["cost"].get("build_unknown"):
        print(f"memlab: {info['cost']['build_unknown']}")
    summ = summarize(pred, cfg)
    info["scoring"] = {"profile": cfg.scoring.profile, "errata": cfg.scoring.errata, **errata_counts(pred)}
    if p.errata is not None:
        summ = summ.join(errata_columns(pred, summ.index))
    write_results(run_dir, pred, summ)
    timings["scoring_s"] = time.perf_counter() - t0
    errors = int(pred["error"].notna().sum())
    info["role_errors"] = role_errors(pred, info.get("extraction") or {}, judged=cfg.judge.model is not None)
    info.update({
        "status": (RunStatus.COMPLETE_WITH_ERRORS if any(r["errors"] for r in info["role_errors"].values())
                   else RunStatus.COMPLETE).value,
        "errors": errors, "judge_errors": int(pred["judge_error"].notna().sum()),
        "error_rate": errors / max(len(pred), 1), "resumed_skipped": resumed_skipped, "answered_now": answered_now,
        "models": {"model_calls": 0, "cache_hits": 0, "failures": 0, **models}, "model_roles": cfg.describe_models(),
    })
    return Run(run_dir=run_dir, config=cfg, predictions=pred, summary=summ, info=info)


def role_errors(pred: Any, extraction: dict[str, Any], judged: bool) -> dict[str, dict[str, int]]:
    """Per model role, how many of its units ended in an error: the reader's questions, the judge's verdicts (of the
    questions answered), the extractor's jobs (failed ones the run went on without, ``run.allow_failed_extraction``).
    Each counts against ``run.max_error_rate`` on its own (`over_budget`)."""
    out = {"reader": {"errors": int(pred["error"].notna().sum()), "of": len(pred)}}
    if judged:
        out["judge"] = {"errors": int(pred["judge_error"].notna().sum()), "of": int(pred["error"].isna().sum())}
    jobs = int(extraction.get("jobs_run") or 0) + int(extraction.get("jobs_failed") or 0)
    if jobs:
        out["extractor"] = {"errors": int(extraction.get("jobs_failed") or 0), "of": jobs}
    return out


def over_budget(info: dict[str, Any], limit: float) -> list[str]:
    """The roles whose share of errors is over ``limit`` (``run.max_error_rate``), each as a sentence."""
    out = []
    for role, r in (info.get("role_errors") or {"reader": {"errors": info.get("errors") or 0,
                                                           "of": info.get("questions") or 0}}).items():
        rate = r["errors"] / max(r["of"], 1)
        if rate > limit:
            unit = {"judge": "verdicts", "extractor": "extraction jobs"}.get(role, "questions")
            out.append(f"{role}: {r['errors']} of {r['of']} {unit} ended in an error ({rate:.1%} > "
                       f"run.max_error_rate {limit:.1%})")
    return out


def record_interrupt(info: dict[str, Any], resume_cmd: str, why: str = "interrupted") -> None:
    """Ctrl-C or SIGTERM in any stage: the run is ``interrupted``, every finished question kept."""
    info["status"] = RunStatus.INTERRUPTED.value
    info["resume"] = resume_cmd
    print(f"\nmemlab: {why}; every finished question is kept. Resume with:\n  {resume_cmd}", file=sys.stderr)


def interrupted_on_signal(run_dir: Path, info: dict[str, Any], resume_cmd: str) -> Callable[[], None]:
    """What a signal handler records first (`memlab.run.answering.StopFlag.on_signal`): a running run's status
    ``interrupted``, in ``info`` and in run.json, before the signal is raised; whatever else arrives meanwhile, the
    run never claims to be running."""

    def record() -> None:
        if info["status"] == RunStatus.RUNNING.value:
            info["status"] = RunStatus.INTERRUPTED.value
            info["resume"] = resume_cmd
        write_run_json(run_dir, info)

    return record


def record_failure(info: dict[str, Any], e: BaseException, resume_cmd: str) -> None:
    """An error in any stage: a running run is marked ``failed`` with its cause."""
    if info["status"] == RunStatus.RUNNING.value:
        info["status"] = RunStatus.FAILED.value
        info["failure"] = f"{type(e).__name__}: {e}"
    info["resume"] = resume_cmd


def close_session(run_dir: Path, info: dict[str, Any], timings: dict[str, float], integrity_mark: Any,
                  session: dict[str, Any] | None = None) -> None:
    """Append this session (timings, status) to run.json's sessions, total the timings, list the caches found
    corrupt meanwhile, record a completed run's output files with their sha256 and its completion time
    (`memlab.run.outputs`), and write run.json. A storage error writing it is raised as `RunStorageError` unless
    the run already failed or was interrupted (the first error is not hidden)."""
    from memlab import cache_integrity
    from memlab.run.outputs import record_outputs

    info["sessions"] = info["sessions"] + [{"timings": timings, "status": info["status"], **(session or {})}]
    info["timings"] = total_timings(info["sessions"])
    info["cache_integrity"] = [e.to_dict() for e in cache_integrity.since(integrity_mark)]
    info.pop("outputs", None)  # an earlier session's: this one may have changed the files
    info.pop("completed_utc", None)
    try:
        if info["status"] in (RunStatus.COMPLETE.value, RunStatus.COMPLETE_WITH_ERRORS.value):
            info["outputs"] = record_outputs(run_dir)
            info["completed_utc"] = datetime.now(timezone.utc).isoformat(timespec="microseconds")
        write_run_json(run_dir, info)
    except OSError as e:  # the disk is full or the folder read-only: say so, without hiding the first error
        print(f"memlab: could not record the run's status in {run_dir / 'run.json'}: {e.strerror or e}",
              file=sys.stderr)
        if info["status"] not in (RunStatus.FAILED.value, RunStatus.INTERRUPTED.value, RunStatus.STOPPED.value):
            raise RunStorageError(storage_message(e, run_dir)) from e


def write_run_json(run_dir: Path, info: dict[str, Any]) -> None:
    """Write ``info`` as the run's run.json, through `RunInfo` (the one definition of its fields)."""
    write_json(run_dir / "run.json", RunInfo.from_dict(info, where=str(run_dir / "run.json")).to_dict())


def total_timings(sessions: list[dict[str, Any]]) -> dict[str, float]:
    """Stage timings summed over the sessions of a run (a resumed run keeps the original's)."""
    out: dict[str, float] = {}
    for s in sessions:
        for k, v in s.get("timings", {}).items():
            out[k] = out.get(k, 0.0) + float(v)
    return out


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
