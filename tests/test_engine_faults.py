"""The fault x executor matrix of the stage engine (`memlab.run.engine`): the same fault ends the same way whether
the units run in this process, in forked processes or as Ray tasks — the same exception class, the same run status
in run.json, the same errors counted, and nothing partial cached.

Executors: ``local`` (``run.threads: 1``: every unit here), ``forked`` (``run.threads: 2``: answering that calls no
model goes to two forked processes; a unit that calls a model runs here, by design: `memlab.run.forked`), ``ray``
(`check_cell` run by tests/test_ray_executor.py on that module's Ray instance, so the suite starts Ray once per
file that needs it, not twice). Faults come from the scripted server (`memlab.testing`).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
from pathlib import Path

import pytest

from memlab.run import ExperimentConfig
from memlab.run.answering import RecordLog
from memlab.run.executors import run_grid
from memlab.testing import Reply, ScriptedServer, closed_port_api_base
from memlab.testing.models import scripted_model

ROOT = Path(__file__).resolve().parents[1]
EXECUTORS = ("local", "forked", "ray")
#: The columns this module runs; the ``ray`` column is tests/test_ray_executor.py's.
HERE = ("local", "forked")
FAULTS = ("unreachable", "failed-extraction", "malformed-reply", "sigterm")

#: Each fault's outcome, the same under every executor: what is raised, run.json's status and errors, the questions
#: in the resume log (how many; for SIGTERM: some, not all) and the model replies cached.
EXPECTED = {
    "unreachable": {"raised": "EndpointUnreachable", "status": "failed", "errors": 0, "logged": 0, "cached": 0},
    "failed-extraction": {"raised": "ExtractionFailed", "status": "failed", "errors": 0, "logged": 0, "cached": 0,
                          "cursors": 0},
    "malformed-reply": {"raised": None, "status": "complete-with-errors", "errors": 7, "logged": 7, "cached": 0},
    "sigterm": {"raised": "Terminated", "status": "interrupted", "errors": 0, "logged": "some", "cached": 0},
}


def _config(data_path: Path, executor: str, **over) -> ExperimentConfig:
    base = {"name": "m", "dataset": {"path": str(data_path)}, "extraction": {"name": "turns+observations"},
            "models": {"max_retries": 0}, "run": {"threads": 2 if executor == "forked" else 1}}
    return ExperimentConfig.from_dict(base).with_overrides(over)


def _run(cfg: ExperimentConfig, root: Path, executor: str) -> str | None:
    """Run ``cfg`` on ``executor``; the name of what it raised (None: it finished)."""
    try:
        run_grid(cfg, results=root, executor="ray" if executor == "ray" else "local", progress=False)
    except BaseException as e:  # noqa: BLE001 - the class is the outcome under test
        return type(e).__name__
    return None


def _outcome(root: Path, raised: str | None) -> dict:
    (run_dir,) = [p for p in root.iterdir() if p.name != ".cache"]
    info = json.loads((run_dir / "run.json").read_text())
    logged = [json.loads(x) for x in (run_dir / "predictions.jsonl").read_text().splitlines()]
    traced = [json.loads(x)["qid"] for x in (run_dir / "traces" / "answers.jsonl").read_text().splitlines()] \
        if (run_dir / "traces" / "answers.jsonl").is_file() else []
    assert [r["qid"] for r in logged] == traced or sorted(r["qid"] for r in logged) == sorted(traced)  # no half
    cached = 0
    if (root / ".cache" / "responses.sqlite").is_file():
        with sqlite3.connect(root / ".cache" / "responses.sqlite") as c:
            cached = c.execute("SELECT count(*) FROM responses").fetchone()[0]
    out = {"raised": raised, "status": info["status"],
           "errors": info.get("errors", sum(r["error"] is not None for r in logged)), "logged": len(logged),
           "cached": cached}
    stores = list((root / ".cache" / "extract").glob("*/store.db"))
    if stores and info["config"]["extraction"]["name"] == "llm":
        with sqlite3.connect(stores[0]) as c:  # a conversation recorded as done has its cursor saved
            out["cursors"] = sum("memory:last_extract_at" in json.loads(s or "{}")
                                 for (s,) in c.execute("SELECT state FROM extraction_state"))
    return out


def _fault(fault: str, executor: str, data_path: Path, root: Path, monkeypatch) -> str | None:
    if fault == "unreachable":  # no up-front check: the first model call finds the endpoint down
        cfg = _config(data_path, executor, **{"answer.name": "original", "answer.model": "openai/reader",
                                              "models.api_base": closed_port_api_base(),
                                              "run.check_endpoint": False})
        return _run(cfg, root, executor)
    if fault == "sigterm":  # SIGTERM arrives after the first unit's questions are logged (model-free answering)
        write, write_lines = RecordLog.write, RecordLog.write_lines

        def then_term(original):
            def wrapped(self, recs):
                original(self, recs)
                os.kill(os.getpid(), signal.SIGTERM)
            return wrapped

        monkeypatch.setattr(RecordLog, "write", then_term(write))
        monkeypatch.setattr(RecordLog, "write_lines", then_term(write_lines))
        try:
            return _run(_config(data_path, executor), root, executor)
        finally:
            monkeypatch.setattr(RecordLog, "write", write)
            monkeypatch.setattr(RecordLog, "write_lines", write_lines)

    def replies(body: dict) -> Reply | dict:
        extracting = any(t["function"]["name"] == "add_memory" for t in body.get("tools", []))
        if fault == "failed-extraction" and extracting:
            return Reply(status=400, text="extractor refused")
        if fault == "malformed-reply" and not extracting:
            return Reply(malformed=True)
        return scripted_model(body)

    with ScriptedServer(responder=replies) as srv:
        over = {"answer.name": "original", "answer.model": "openai/reader", "models.api_base": srv.api_base}
        if fault == "failed-extraction":
            over |= {"extraction.name": "llm", "extraction.model": "openai/extractor"}
        return _run(_config(data_path, executor, **over), root, executor)


@pytest.mark.parametrize("executor", HERE)
@pytest.mark.parametrize("fault", FAULTS)
def test_a_fault_ends_the_same_way_under_every_executor(fault, executor, data_path, tmp_path, monkeypatch):
    check_cell(fault, executor, data_path, tmp_path, monkeypatch)


def check_cell(fault: str, executor: str, data_path: Path, tmp_path: Path, monkeypatch) -> None:
    """One cell of the matrix: ``fault`` under ``executor`` ends as `EXPECTED` says (and a SIGTERM'd run resumes)."""
    if executor == "forked":  # units of two questions, so that seven fork (24 a unit otherwise)
        monkeypatch.setattr("memlab.run.answering.ANSWER_CHUNK", 2)
    raised = _fault(fault, executor, data_path, tmp_path, monkeypatch)
    got = _outcome(tmp_path, raised)
    want = dict(EXPECTED[fault])
    if want["logged"] == "some":
        assert 0 < got["logged"] < 7, got
        want["logged"] = got["logged"]  # a unit's questions are logged together: how many depends on its size
    assert got == want, f"{fault} x {executor}"
    if fault == "sigterm":  # the interrupted run resumes on the same executor and finishes
        (run_dir,) = [p for p in tmp_path.iterdir() if p.name != ".cache"]
        if executor == "forked":  # this column did answer in forked processes
            assert json.loads((run_dir / "run.json").read_text())["executor"]["answer_processes"] == 2
        (run,) = run_grid(resume=run_dir, executor="ray" if executor == "ray" else "local", progress=False)
        assert run.status == "complete" and len(run.predictions) == 7 and run.predictions.error.isna().all()
        assert run.info["resumed_skipped"] == got["logged"]


def test_the_effective_executor_meets_the_configs_checks_before_ray_starts(data_path, tmp_path, monkeypatch):
    """``--executor ray`` (not only ``run.executor``) meets the rule that a memory system runs locally, before any
    folder exists or Ray is asked for; run_experiment and run_ablation run on ``run.executor`` (or refuse what it
    cannot do), never silently locally."""
    from memlab.run import ConfigError, ray_cluster, run_ablation, run_experiment

    def no_ray(*a, **k):
        raise AssertionError("Ray was started")

    monkeypatch.setattr(ray_cluster, "connect", no_ray)
    cfg = _config(data_path, "local", **{"system.name": "mem0"})
    with pytest.raises(ConfigError, match="system.name = 'mem0' runs on the local executor only"):
        run_grid(cfg, results=tmp_path, executor="ray", progress=False)
    with pytest.raises(ConfigError, match="system.name = 'mem0' runs on the local executor only"):
        run_experiment(cfg, results=tmp_path, executor="ray", progress=False)
    assert not [p for p in tmp_path.glob("*") if p.name != ".cache"]
    on_ray = _config(data_path, "local", **{"run.executor": "ray"})
    with pytest.raises(ConfigError, match="the ray executor runs the configured components only"):
        run_experiment(on_ray, results=tmp_path, progress=False, answerer=object())
    called: list[tuple] = []
    import memlab.run.ray_executor as rx

    monkeypatch.setattr(rx, "run_grid_ray", lambda cfg=None, **k: called.append((cfg, k)) or ["ran on ray"])
    assert run_experiment(on_ray, results=tmp_path, progress=False) == "ran on ray"
    assert run_ablation(on_ray.with_overrides({"grid": {"retrieval.top_k": [1, 2]}}), results=tmp_path,
                        progress=False) == ["ran on ray"]
    assert len(called) == 2 and called[1][0].grid  # the whole grid, to the Ray driver
    (local,) = run_grid(on_ray, results=tmp_path, executor="local", progress=False)  # --executor local: here
    assert local.info["executor"]["kind"] == "local" and len(called) == 2


def test_joining_ray_keeps_the_runs_sigterm_handler(monkeypatch):
    """``ray.init`` installs its own SIGTERM handler (a SystemExit): the driver keeps the run's, so a SIGTERM'd Ray
    run ends ``interrupted`` as a local one does."""
    from memlab.run import ray_cluster

    class FakeRay:
        def is_initialized(self):
            return False

        def init(self, **kw):  # what ray.init does to the driver's SIGTERM handler
            signal.signal(signal.SIGTERM, lambda s, f: (_ for _ in ()).throw(SystemExit(s)))

    def runs_handler(signum, frame):
        pass

    old = signal.signal(signal.SIGTERM, runs_handler)
    try:
        monkeypatch.setattr(ray_cluster, "import_ray", FakeRay)
        ray_cluster.connect(None)
        assert signal.getsignal(signal.SIGTERM) is runs_handler
    finally:
        signal.signal(signal.SIGTERM, old)
