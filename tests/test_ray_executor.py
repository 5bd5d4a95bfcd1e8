"""The Ray executor against the local one: same predictions, summaries and traces; retries; caches.

One in-process Ray instance (loopback only) serves the module. Workers get no path of the driver's
results root: everything they need travels with the tasks, and what they computed comes back.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pandas as pd
import pytest

from memlab.run import ExperimentConfig
from memlab.run.executors import run_grid
from memlab.testing import ScriptedServer
from tests import test_engine_faults as engine_matrix
from tests.scripted_model import responder

ROOT = Path(__file__).resolve().parents[1]
#: Columns that measure time, not outcome.
TIMING = ["latency_s"]


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray", reason="ray is not installed: pip install 'memlab[ray]' for the Ray executor")
    old = os.environ.get("PYTHONPATH")
    # the workers inherit this environment: the repository on their path (the hook below is a test function)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    os.environ.setdefault("RAY_worker_register_timeout_seconds", "300")  # slow worker start on a loaded machine
    os.environ.setdefault("RAY_agent_register_timeout_ms", "300000")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    yield ray
    ray.shutdown()
    if old is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = old


def offline_grid(path: Path) -> ExperimentConfig:
    return ExperimentConfig.from_dict({
        "name": "off", "dataset": {"path": str(path)}, "extraction": {"name": "turns+observations"},
        "retrieval": {"participant_boost": True}, "grid": {"retrieval.top_k": [1, 3]}})


def model_grid(path: Path, srv: ScriptedServer, **over) -> ExperimentConfig:
    cfg = ExperimentConfig.from_dict({
        "name": "llm", "dataset": {"path": str(path)},
        "extraction": {"name": "llm", "model": "openai/scripted-extractor"},
        "answer": {"name": "original", "model": "openai/scripted-reader"},
        "models": {"api_base": srv.api_base, "max_retries": 0}, "run": {"concurrency": 2},
        # top-k 1 and 2 give every question a different prompt in each cell: with identical requests in two
        # cells, the local executor (cells in sequence) serves the second from the cache while Ray (cells at
        # once) calls twice; predictions agree either way, the calls/cached_calls accounting then does not
        "grid": {"retrieval.top_k": [1, 2]}})
    return cfg.with_overrides(over) if over else cfg


def jsonl(path: Path, drop: tuple[str, ...] = ()) -> list[dict]:
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    return sorted(({k: v for k, v in r.items() if k not in drop} for r in rows), key=json.dumps)


def assert_same_runs(local, remote) -> None:
    assert len(local) == len(remote) == 2
    for a, b in zip(local, remote):
        assert a.config.retrieval.top_k == b.config.retrieval.top_k
        pa, pb = a.predictions.drop(columns=TIMING), b.predictions.drop(columns=TIMING)
        pd.testing.assert_frame_equal(pa, pb)
        keep = [c for c in a.summary.columns if not c.startswith("latency")]
        pd.testing.assert_frame_equal(a.summary[keep], b.summary[keep])
        for name, drop in (("retrieval", ()), ("answers", ("latency_s",)), ("memories", ()), ("extraction", ()),
                           ("build_cost", ())):
            assert jsonl(a.run_dir / "traces" / f"{name}.jsonl", drop) == \
                jsonl(b.run_dir / "traces" / f"{name}.jsonl", drop), name
        assert a.status == b.status == "complete"
        assert a.info["cost"] == b.info["cost"] and a.info["extraction"]["policy"] == b.info["extraction"]["policy"]
        assert_same_run_json(a.run_dir, b.run_dir)


def assert_same_run_json(local: Path, remote: Path) -> None:
    """Both executors write run.json by the same steps: the same fields, equal where they are not about where
    and when the run executed."""
    ja, jb = (json.loads((d / "run.json").read_text()) for d in (local, remote))
    assert set(ja) == set(jb)
    assert {"notes", "model_roles", "cache_integrity", "scoring", "cost"} <= set(jb)
    assert ja["executor"]["kind"] == "local" and jb["executor"]["kind"] == "ray"
    for k in ("status", "questions", "errors", "judge_errors", "notes", "model_roles", "cache_integrity", "scoring",
              "cost", "components", "config", "dataset_sha256", "resumed_skipped", "answered_now"):
        assert ja[k] == jb[k], k
    where = ("cache_dir", "tasks_failed")  # the results root, and Ray's own list of lost tasks
    assert {k: v for k, v in ja["extraction"].items() if k not in where} == \
        {k: v for k, v in jb["extraction"].items() if k not in where}
    assert set(ja["timings"]) == set(jb["timings"])


def test_units_run_anywhere_from_what_they_are_sent(data_path, tmp_path):
    """The task bodies, called here without Ray: a private temp folder, nothing of the driver's root."""
    from memlab.data import load_locomo
    from memlab.extract.pipeline import conversation_key
    from memlab.run.ray_executor import answer_unit, cache_snapshot, extract_unit

    (cfg, _) = offline_grid(data_path).expand()
    (local,) = run_grid(cfg, results=tmp_path, executor="local", progress=False)
    conv = list(load_locomo(data_path))[0]
    snap = cache_snapshot(tmp_path / ".cache", set(), tmp_path / "no-embeddings.sqlite")
    ext = extract_unit(cfg, conv, None, None, None, snap, "extract syn-1")
    assert ext["where"]["node_id"] is None and ext["failures"] == [] and ext["state"]
    mems = [json.loads(x) for x in (local.run_dir / "traces" / "memories.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in ext["rows"]) == sorted(m["id"] for m in mems if m["conversation"] == "syn-1")
    ans = answer_unit(cfg, conv, list(conv.questions), ext["rows"], ext["index"], snap, "answer syn-1")
    got = {row.qid: row for row, _, _ in ans["records"]}
    p = local.predictions.set_index("qid")
    assert {q: r.prediction for q, r in got.items()} == p.loc[list(got), "prediction"].to_dict()
    assert {q: r.retrieved_ids for q, r in got.items()} == p.loc[list(got), "retrieved_ids"].to_dict()
    from memlab.index import open_service
    from memlab.memory.shipping import import_index

    bare = open_service("memory", keyword="bm25")
    assert import_index(bare, conversation_key(conv), ext["index"]) is False  # other settings: refused


def test_offline_grid_on_ray_equals_local(ray_local, data_path, tmp_path):
    cfg = offline_grid(data_path)
    local = run_grid(cfg, results=tmp_path / "local", executor="local", progress=False)
    remote = run_grid(cfg, results=tmp_path / "ray", executor="ray", progress=False)
    assert_same_runs(local, remote)
    assert local[0].predictions.f1.notna().all() and len(local[0].predictions) == 7
    info = json.loads((remote[0].run_dir / "run.json").read_text())
    units = info["executor"]["units"]
    assert {u["unit"] for u in units} == {"extract syn-1", "extract syn-2", "answer syn-1", "answer syn-2"}
    assert all(u["node_id"] and u["pid"] != os.getpid() for u in units)  # each unit ran in a Ray worker
    # the second cell shares the first one's extraction: answering units only
    assert {u["unit"] for u in json.loads((remote[1].run_dir / "run.json").read_text())["executor"]["units"]} == \
        {"answer syn-1", "answer syn-2"}


def test_model_grid_on_ray_equals_local_and_cached_rerun_makes_no_call(ray_local, data_path, tmp_path):
    with ScriptedServer(responder=responder) as srv:
        cfg = model_grid(data_path, srv)
        local = run_grid(cfg, results=tmp_path / "local", executor="local", progress=False)
        n_local = len(srv.requests)
        remote = run_grid(cfg, results=tmp_path / "ray", executor="ray", progress=False)
        n_remote = len(srv.requests) - n_local
        assert n_local == n_remote > 0  # the same calls, made by the workers
        assert_same_runs(local, remote)
        for a, b in zip(local, remote):  # run.json: the first cell paid for the extraction, the second reused it
            assert a.info["extraction"]["jobs_run"] == b.info["extraction"]["jobs_run"]
        calls = sum(r.info["models"]["model_calls"] for r in remote)
        assert calls == n_remote  # the workers' counts reach run.json
        # the driver stored what the workers fetched: a rerun makes no call, on Ray or locally
        again = run_grid(cfg, results=tmp_path / "ray", executor="ray", progress=False)
        assert len(srv.requests) == n_local + n_remote
        assert all(r.info["models"]["model_calls"] == 0 and r.info["models"]["cache_hits"] > 0 for r in again)
        pd.testing.assert_series_equal(again[1].predictions.prediction, remote[1].predictions.prediction)
        here = run_grid(cfg, results=tmp_path / "ray", executor="local", progress=False)
        assert len(srv.requests) == n_local + n_remote
        pd.testing.assert_series_equal(here[0].predictions.prediction, remote[0].predictions.prediction)


def test_lost_worker_is_retried_and_a_failing_task_becomes_errors_that_resume_finishes(ray_local, data_path,
                                                                                       tmp_path):
    from memlab.run.ray_executor import run_grid_ray

    marker = tmp_path / "crashed-once"

    def crash_once(unit: str, marker: str = str(marker)) -> None:  # runs on the worker
        import os

        if unit.startswith("answer syn-1") and not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(1)  # the worker process dies mid-task
        if unit.startswith("answer syn-2"):
            raise RuntimeError("scripted task failure")

    cfg = offline_grid(data_path).with_overrides({"grid": {}, "run.ray_max_retries": 1})
    (run,) = run_grid_ray(cfg, results=tmp_path / "ray", progress=False, unit_hook=crash_once)
    assert marker.exists()  # the first attempt died ...
    p = run.predictions.set_index("qid")
    ok = p[p.conversation_id == "syn-1"]
    assert ok.error.isna().all() and len(ok) == 5  # ... and the retry answered every question
    bad = p[p.conversation_id == "syn-2"]
    # a unit's own error fails the unit at once, as under every executor (a lost worker is what Ray retries)
    assert len(bad) == 2 and bad.error.eq("RuntimeError: scripted task failure").all() and bad.f1.isna().all()
    assert run.status == "complete-with-errors" and run.summary.loc["overall 1-5", "errors"] == 2
    (done,) = run_grid(resume=run.run_dir, executor="ray", progress=False)  # the errored questions again
    assert done.status == "complete" and done.predictions.error.isna().all()
    (local,) = run_grid(cfg, results=tmp_path / "local", executor="local", progress=False)
    pd.testing.assert_frame_equal(done.predictions.drop(columns=TIMING), local.predictions.drop(columns=TIMING))
    assert json.loads((run.run_dir / "run.json").read_text())["resumed_skipped"] == 5


def test_a_component_registered_in_the_driver_runs_on_the_workers(ray_local, data_path, tmp_path):
    """The driver imported the module that registers the extractor; the workers import it too."""
    import tests.example_components.sentence_extractor  # noqa: F401 - registers example-first-sentence

    cfg = offline_grid(data_path).with_overrides({"grid": {}, "extraction.name": "example-first-sentence"})
    (local,) = run_grid(cfg, results=tmp_path / "local", executor="local", progress=False)
    (remote,) = run_grid(cfg, results=tmp_path / "ray", executor="ray", progress=False)
    assert remote.status == "complete" and remote.predictions.error.isna().all()
    pd.testing.assert_frame_equal(local.predictions.drop(columns=TIMING), remote.predictions.drop(columns=TIMING))
    assert_same_run_json(local.run_dir, remote.run_dir)


def test_a_component_the_workers_cannot_import_refuses_the_run(ray_local, data_path, tmp_path, monkeypatch):
    import sys

    from memlab.extract.extractors import EXTRACTORS
    from memlab.run.components import ComponentNotOnWorkers

    mods = tmp_path / "driver_only"
    mods.mkdir()
    (mods / "h22_driver_only_extractor.py").write_text(
        "from memlab.extract.extractors import EXTRACTORS, TurnsExtractor\n\n\n"
        "@EXTRACTORS.register('driver-only-turns')\nclass DriverOnly(TurnsExtractor):\n    pass\n")
    monkeypatch.syspath_prepend(str(mods))  # the driver's path only: the workers were started without it
    monkeypatch.delitem(sys.modules, "h22_driver_only_extractor", raising=False)
    with EXTRACTORS.scoped():
        __import__("h22_driver_only_extractor")
        cfg = offline_grid(data_path).with_overrides({"grid": {}, "extraction.name": "driver-only-turns"})
        with pytest.raises(ComponentNotOnWorkers, match="h22_driver_only_extractor.*worker"):
            run_grid(cfg, results=tmp_path / "ray", executor="ray", progress=False)
    assert not [p for p in (tmp_path / "ray").glob("*") if p.name != ".cache"]  # refused before any run folder
    sys.modules.pop("h22_driver_only_extractor", None)


def test_a_ray_resume_takes_the_run_folders_lock(data_path, tmp_path):
    """A folder another process holds is refused before Ray starts, as a local resume is."""
    from memlab.rundir import RunFolderBusy, RunLock

    (cfg, _) = offline_grid(data_path).expand()
    (run,) = run_grid(cfg, results=tmp_path, executor="local", progress=False)
    lock = RunLock(run.run_dir).acquire()
    try:
        with pytest.raises(RunFolderBusy, match="in use by another memlab process"):
            run_grid(resume=run.run_dir, executor="ray", progress=False)
    finally:
        lock.release()


def test_longmemeval_m_like_grid_on_ray_equals_local_streamed_run(ray_local, tmp_path):
    """A few questions with many sessions each (an M-like LongMemEval file): the local executor streams one
    question's haystack at a time, Ray runs a unit per question; predictions, summaries and traces agree, and a
    Ray rerun on the local run's cache (each key's fit saved per key by the streamed run) agrees too."""
    import warnings

    from memlab.data.longmemeval_synthetic import write_synthetic

    path = tmp_path / "lme_m_like.json"
    write_synthetic(path, questions=2, sessions=40, turns=4, words=12)
    cfg = offline_grid(path).with_overrides({"grid": {"retrieval.top_k": [3]}})  # one cell: the two-cell grid is above
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the longmemeval scoring profile is chosen for the file
        local = run_grid(cfg, results=tmp_path / "local", executor="local", progress=False)
        remote = run_grid(cfg, results=tmp_path / "ray", executor="ray", progress=False)
        again = run_grid(cfg, results=tmp_path / "local", executor="ray", progress=False)  # the local cache
    assert local[0].info["extraction"]["streamed"] and local[0].info["extraction"]["max_resident_keys"] == 1
    assert len(local[0].predictions) == 2 and local[0].predictions.prediction.str.len().gt(0).all()
    for runs in (remote, again):
        for a, b in zip(local, runs, strict=True):
            pd.testing.assert_frame_equal(a.predictions.drop(columns=TIMING), b.predictions.drop(columns=TIMING))
            keep = [c for c in a.summary.columns if not c.startswith("latency")]
            pd.testing.assert_frame_equal(a.summary[keep], b.summary[keep])
            for name, drop in (("retrieval", ()), ("answers", ("latency_s",)), ("memories", ()),
                               ("extraction", ())):
                assert jsonl(a.run_dir / "traces" / f"{name}.jsonl", drop) == \
                    jsonl(b.run_dir / "traces" / f"{name}.jsonl", drop), name
    ja, jb = (json.loads((r.run_dir / "run.json").read_text()) for r in (local[0], remote[0]))
    where = ("cache_dir", "tasks_failed", "streamed", "max_resident_keys")  # where it ran; how the local one ran
    assert {k: v for k, v in ja["extraction"].items() if k not in where} == \
        {k: v for k, v in jb["extraction"].items() if k not in where}
    assert ja["dataset_sha256"] == jb["dataset_sha256"] and ja["dataset_format"] == "longmemeval"
    # the driver writes each key's extracted fit to its file (what a streamed run reads back), not into its index
    assert len(list((tmp_path / "ray" / ".cache" / "extract").glob("*/index-keys/*.npz"))) == 2


def test_tasks_are_submitted_in_a_window():
    """At most ``window`` tasks are in flight (their arguments, one conversation each, in the object store), every
    job runs once, and a finished task lets the next one in."""
    from memlab.run.ray_cluster import in_window

    class FakeRay:
        def wait(self, refs, num_returns):
            return refs[:num_returns], refs[num_returns:]

    submitted: list[int] = []
    pending: list = []
    jobs = [(lambda i=i: submitted.append(i) or f"ref{i}", i) for i in range(7)]
    most, got = 0, []
    for ref, i in in_window(FakeRay(), jobs, 3, pending):
        most = max(most, len(pending) + 1)
        got.append((ref, i))
        assert len(submitted) <= len(got) + 3
    assert got == [(f"ref{i}", i) for i in range(7)] and submitted == list(range(7)) and most == 3


@pytest.mark.parametrize("fault", engine_matrix.FAULTS)
def test_a_fault_ends_on_ray_as_it_does_locally_and_forked(fault, ray_local, data_path, tmp_path, monkeypatch):
    """The Ray column of the fault x executor matrix (tests/test_engine_faults.py: the same `EXPECTED` outcome),
    on this module's Ray instance."""
    # ray.init made SIGTERM a SystemExit in this process; a run takes the signal over from the default handler
    old = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        engine_matrix.check_cell(fault, "ray", data_path, tmp_path, monkeypatch)
    finally:
        signal.signal(signal.SIGTERM, old)
