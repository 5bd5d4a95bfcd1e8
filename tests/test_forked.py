"""Forked answering and side-by-side index builds (`memlab.run.forked`, `memlab.run.extraction.build_indexes`):
the same run folder as a serial run, failures raised, connections never shared across a fork."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
from concurrent.futures.process import BrokenProcessPool

import numpy as np
import pytest

from memlab.index import open_service
from memlab.memory import SearchOptions, UserKey
from memlab.run import ExperimentConfig, run_experiment
from memlab.run.forked import fork_map, fork_workers

pytestmark = pytest.mark.skipif(not hasattr(os, "fork") or os.uname().sysname != "Linux",
                                reason="forked workers are used on Linux only")


def _pid_and_square(x: int) -> tuple[int, int]:
    return os.getpid(), x * x


def test_fork_map_yields_in_order_from_other_processes_and_runs_the_child_hook_first():
    marks: list[int] = []
    out = list(fork_map(lambda x: (*_pid_and_square(x), len(marks)), list(range(9)), 2,
                        in_child=lambda: marks.append(1)))
    assert [sq for _, sq, _ in out] == [x * x for x in range(9)]
    pids = {pid for pid, _, _ in out}
    assert os.getpid() not in pids and 1 <= len(pids) <= 2
    assert {seen for _, _, seen in out} == {1} and marks == []  # the hook ran in each child, not here


def test_fork_map_with_one_worker_runs_here_in_order():
    assert list(fork_map(_pid_and_square, [3, 1, 2], 1)) == [(os.getpid(), 9), (os.getpid(), 1), (os.getpid(), 4)]


def test_a_child_exception_is_raised_here_and_a_killed_child_breaks_the_pool():
    def fail_on_two(x: int) -> int:
        if x == 2:
            raise ValueError(f"unit {x} failed")
        return x

    with pytest.raises(ValueError, match="unit 2 failed"):
        list(fork_map(fail_on_two, [0, 1, 2, 3], 2))

    def die_on_one(x: int) -> int:
        if x == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return x

    with pytest.raises(BrokenProcessPool):
        list(fork_map(die_on_one, [0, 1, 2, 3], 2))
    def cannot_reopen() -> None:
        raise OSError("store.db: unable to open database file")

    with pytest.raises(BrokenProcessPool):  # a child that cannot reopen its store runs no unit
        list(fork_map(lambda x: x, [0, 1, 2], 2, in_child=cannot_reopen))
    assert list(fork_map(lambda x: x + 1, [1, 2], 2)) == [2, 3]  # the module is usable again


def test_no_fork_inside_a_child_or_for_one_unit():
    assert fork_workers(4, 1) == 1 and fork_workers(2, 10) == 2 and fork_workers(1, 10) == 1
    assert list(fork_map(lambda x: fork_workers(4, 10), [0, 1], 2)) == [1, 1]


def test_a_forked_child_reads_the_store_through_its_own_connection(tmp_path):
    svc = open_service("sqlite", path=tmp_path / "store.db")
    key = UserKey("app", "u")
    for text in ("Alice likes pottery", "Bob plays chess", "Alice went hiking"):
        svc.add(key, text)
    here = [h.entry.text for h in svc.search(key, SearchOptions(query="pottery", max_results=2)).hits]
    opened: list[str] = []  # filled in each child only
    connect = sqlite3.connect

    def reopen() -> None:
        sqlite3.connect = lambda path, *a, **kw: opened.append(str(path)) or connect(path, *a, **kw)
        svc.after_fork()

    def search(q: str) -> tuple[list[str], list[str]]:
        return [h.entry.text for h in svc.search(key, SearchOptions(query=q, max_results=2)).hits], list(opened)

    got = list(fork_map(search, ["pottery", "pottery"], 2, in_child=reopen))
    assert got == [(here, [str(tmp_path / "store.db")])] * 2 and opened == [] and sqlite3.connect is connect
    svc.add(key, "Carol bakes bread")  # the parent's connection still writes after the children
    assert svc.count(key) == 4
    svc.close()


def test_only_a_model_free_arm_over_a_model_free_index_answers_in_processes(tmp_path):
    from memlab.index import HybridIndex
    from memlab.run.executors import Local, answers_without_model

    class Roles:
        def __init__(self, *roles: str):
            self.roles = roles

        def roles_in_use(self, answerer):
            return self.roles

    assert HybridIndex().model_free and not HybridIndex(embedder="minilm").model_free
    assert not HybridIndex(keyword="splade").model_free and not HybridIndex(sparse="splade").model_free
    svc = open_service("memory")
    assert answers_without_model(Roles(), None, svc)
    assert answers_without_model(Roles(), None, None)  # no store (an arm that reads the conversation)
    assert not answers_without_model(Roles("answerer"), None, svc)  # model calls: run.concurrency's threads
    assert not answers_without_model(Roles(), None, open_service("memory", embedder="minilm"))
    # the local executor forks only units that call no model (``in_child`` given), one process per unit at most
    ex = Local(threads=2)
    assert [r for _, r in ex.map(lambda u: os.getpid(), [1, 2])] == [os.getpid()] * 2
    assert ex.processes == 1
    pids = [r for _, r in ex.map(lambda u: os.getpid(), [1, 2], in_child=lambda: None)]
    assert ex.processes == 2 and os.getpid() not in pids
    assert [r for _, r in Local(threads=2).map(lambda u: u * 2, [3], in_child=lambda: None)] == [6]  # one unit: here


def _run_folder_lines(run_dir) -> dict[str, list[dict]]:
    out = {}
    for name in ("predictions.jsonl", "traces/retrieval.jsonl", "traces/answers.jsonl", "traces/memories.jsonl"):
        rows = [json.loads(line) for line in (run_dir / name).read_text().splitlines()]
        for r in rows:
            r.pop("latency_s", None)
        out[name] = rows
    return out


def _offline(locomo_path, threads: int, conversations: list[str], questions: int) -> ExperimentConfig:
    return ExperimentConfig.from_dict({
        "name": f"t{threads}", "extraction": {"name": "turns+observations"}, "run": {"threads": threads},
        "dataset": {"path": str(locomo_path), "conversations": conversations, "question_limit": questions}})


def test_a_run_on_two_threads_writes_what_a_serial_run_writes(locomo_path, tmp_path):
    """Two conversations, 60 questions each: the keys build side by side and the questions are answered in two
    forked processes; predictions, every trace line (in order) and the saved index equal a run on one thread."""
    runs = {}
    for threads in (1, 2):
        cfg = _offline(locomo_path, threads, ["conv-26", "conv-30"], 60)
        runs[threads] = run_experiment(cfg, results=tmp_path / str(threads), progress=False)
    one, two = runs[1].run_dir, runs[2].run_dir
    info = {t: json.loads((r.run_dir / "run.json").read_text())["executor"] for t, r in runs.items()}
    assert (info[1]["index_threads"], info[1]["answer_processes"]) == (1, 1)
    assert (info[2]["index_threads"], info[2]["answer_processes"]) == (2, 2)
    peaks = [json.loads((r.run_dir / "run.json").read_text())["peak_rss_mb"] for r in runs.values()]
    assert "answer_processes" not in peaks[0] and peaks[1]["answer_processes"] > 0
    lines = _run_folder_lines(one)
    assert len(lines["predictions.jsonl"]) == 120 and lines == _run_folder_lines(two)
    saved = [sorted((tmp_path / str(t) / ".cache" / "extract").glob("*/index-*.npz")) for t in (1, 2)]
    assert len(saved[0]) == len(saved[1]) == 1
    with np.load(saved[0][0]) as a, np.load(saved[1][0]) as b:
        assert sorted(a.files) == sorted(b.files) and len(a.files) > 2
        for name in set(a.files) - {"manifest", "manifest_sha256"}:
            assert np.array_equal(a[name], b[name]), name
        manifests = [json.loads(bytes(f["manifest"]).decode()) for f in (a, b)]
    for m in manifests:  # the rows' fingerprint covers their write times, which differ from run to run
        for k in m["keys"]:
            k.pop("fingerprint")
    assert manifests[0] == manifests[1]


def test_ctrl_c_during_forked_answering_keeps_the_written_questions_and_leaves_no_process(
        locomo_path, tmp_path, monkeypatch):
    import multiprocessing

    from memlab.run.answering import RecordLog

    write = RecordLog.write_lines

    def write_then_ctrl_c(self, lines):
        write(self, lines)
        os.kill(os.getpid(), signal.SIGINT)  # after the first unit of questions is logged

    old = signal.signal(signal.SIGINT, signal.default_int_handler)  # a background CI job may ignore SIGINT
    try:
        monkeypatch.setattr(RecordLog, "write_lines", write_then_ctrl_c)
        with pytest.raises(KeyboardInterrupt):
            run_experiment(_offline(locomo_path, 2, ["conv-26"], 72), results=tmp_path, progress=False)
        monkeypatch.undo()
    finally:
        signal.signal(signal.SIGINT, old)
    assert multiprocessing.active_children() == []  # the pool was shut down, its processes joined
    (run_dir,) = tmp_path.glob("t2-*")
    logged = [json.loads(line) for line in (run_dir / "predictions.jsonl").read_text().splitlines()]
    assert len(logged) == 24 and json.loads((run_dir / "run.json").read_text())["status"] == "interrupted"
    resumed = run_experiment(None, resume=run_dir, progress=False)
    assert resumed.info["resumed_skipped"] == 24 and resumed.info["status"] == "complete"
    assert len(resumed.predictions) == 72
