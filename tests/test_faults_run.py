"""Issue 10, runner side: every failure is an error the run reports and never scores or caches.

Each test reproduces a fault that produced a plausible number with exit 0 before (commit 9e58b84).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from memlab.answer import Answer, Answerer
from memlab.cli import main
from memlab.run import ConfigError, ExperimentConfig, run_experiment
from memlab.run.extraction import ExtractionFailed
from memlab.testing import Reply, ScriptedServer
from tests.scripted_model import responder

ROOT = Path(__file__).resolve().parents[1]


def syn(path: Path, **over) -> ExperimentConfig:
    cfg = ExperimentConfig.from_dict({"name": "f", "dataset": {"path": str(path)},
                                      "extraction": {"name": "turns"}})
    return cfg.with_overrides(over) if over else cfg


def model(path: Path, srv: ScriptedServer | str, arm: str = "original", **over) -> ExperimentConfig:
    base = srv if isinstance(srv, str) else srv.api_base
    return syn(path, **{"answer.name": arm, "answer.model": "openai/scripted", "models.api_base": base,
                        "models.max_retries": 0, "models.timeout": 5.0, **over})


class FlakyAnswerer(Answerer):
    """Fails on the questions named in ``bad`` (a set the test may empty to 'heal' it)."""

    name = "flaky"
    needs_memory = False

    def __init__(self, bad: set[str]):
        self.bad = bad

    def answer(self, question, ctx):
        if question.qid in self.bad:
            raise RuntimeError(f"scripted failure on {question.qid}")
        return Answer(prediction=question.answer or "Not mentioned in the conversation.", rule="gold")


def test_errored_questions_are_not_scored_and_resume_retries_them(synthetic_path, tmp_path):
    bad = {"syn-1/q0", "syn-1/q4"}
    run = run_experiment(syn(synthetic_path), results=tmp_path, progress=False, answerer=FlakyAnswerer(bad))
    s = run.summary
    assert (s.loc["overall 1-5", "n"], s.loc["overall 1-5", "n_scored"], s.loc["overall 1-5", "errors"]) == (7, 5, 2)
    assert s.loc["1", "n_scored"] == 0 and s.loc["1", "errors"] == 1  # before: scored 0.0 and counted
    p = run.predictions.set_index("qid")
    assert p.loc[sorted(bad), "f1"].isna().all()  # NaN, not 0
    scored = p.f1.dropna()
    assert len(scored) == 5 and s.loc["overall 1-5", "f1"] == pytest.approx(scored.mean())
    assert scored.mean() > scored.sum() / 7 + 0.2  # what counting the errors as 0 would have reported
    assert run.info["status"] == "complete-with-errors" and run.info["errors"] == 2
    bad.clear()  # the cause is fixed: resume answers only the errored questions
    again = run_experiment(None, resume=run.run_dir, progress=False, answerer=FlakyAnswerer(bad))
    assert again.info["resumed_skipped"] == 5 and again.info["answered_now"] == 2
    assert again.info["status"] == "complete" and again.summary.loc["overall 1-5", "errors"] == 0
    lines = [json.loads(x)["qid"] for x in open(run.run_dir / "traces" / "answers.jsonl")]
    assert sorted(lines) == sorted(set(lines)) and len(lines) == 7  # one trace line per question
    assert len(json.loads((run.run_dir / "run.json").read_text())["sessions"]) == 2  # both timings kept


def test_cli_exits_nonzero_when_errors_exceed_the_limit(synthetic_path, tmp_path, capsys):
    with ScriptedServer([Reply(status=400, text="bad request")], responder=responder) as srv:
        cfg = tmp_path / "c.yaml"
        cfg.write_text(model(synthetic_path, srv).to_yaml())
        assert main(["run", str(cfg), "--results", str(tmp_path / "r")]) == 3
        captured = capsys.readouterr()
        assert "complete-with-errors" in captured.out and "errors" in captured.out
        assert "1 of 7 questions ended in an error" in captured.err and "--resume" in captured.err
        assert main(["run", str(cfg), "--results", str(tmp_path / "r2"), "--set", "run.max_error_rate=0.5"]) == 0


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_endpoint_down_stops_at_once_naming_it(synthetic_path, tmp_path):
    base = f"http://127.0.0.1:{_closed_port()}/v1"
    t0 = time.perf_counter()
    with pytest.raises(ConnectionError, match=f"reader endpoint {base} does not answer"):
        run_experiment(model(synthetic_path, base), results=tmp_path, progress=False)
    assert time.perf_counter() - t0 < 30
    run_dir = next(tmp_path.glob("f-*"))
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "failed" and info["resume"].endswith(str(run_dir))
    assert not (run_dir / "predictions.parquet").exists()  # nothing scored
    # without the up-front check, the first question's connection error stops the run, not 7 errors
    from memlab.llm import EndpointUnreachable  # one class: the client's failed call and the run stopping on it

    with pytest.raises(EndpointUnreachable, match="could not be reached"):
        run_experiment(model(synthetic_path, base, **{"run.check_endpoint": False}), results=tmp_path,
                       progress=False)


def test_judge_failure_is_its_own_column(synthetic_path, tmp_path):
    def judge_down(body):
        if "grade answers" in body["messages"][0]["content"]:
            return Reply(status=400, text="judge refused")
        return responder(body)

    with ScriptedServer(responder=judge_down) as srv:
        run = run_experiment(model(synthetic_path, srv, **{"judge.model": "openai/judge"}), results=tmp_path,
                             progress=False)
    p = run.predictions
    assert p.judge_error.notna().all() and p.error.isna().all()
    assert not p.rule.str.contains("judge failed").any()  # before: text appended to `rule`
    s = run.summary.loc["overall 1-5"]
    assert s["judge_errors"] == 7 and s["j"] != s["j"] and s["n_scored"] == 7  # J over judged questions: none


def test_failed_extraction_stops_before_answering_and_is_not_cached(synthetic_path, tmp_path):
    def extractor_down(body):
        if any(t["function"]["name"] == "add_memory" for t in body.get("tools", [])):
            return Reply(status=400, text="extractor refused")
        return responder(body)

    over = {"extraction.name": "llm", "extraction.model": "openai/extractor"}
    with ScriptedServer(responder=extractor_down) as srv:
        with pytest.raises(ExtractionFailed, match="syn-1: extractor failed") as e:
            run_experiment(model(synthetic_path, srv, **over), results=tmp_path, progress=False)
        assert "allow_failed_extraction" in str(e.value)
        answered = [r for r in srv.requests if "add_memory" not in json.dumps(r.get("tools", []))]
        assert answered == []  # nothing was answered from an empty store
    with ScriptedServer(responder=responder) as srv:  # healthy again: the failed jobs are redone
        run = run_experiment(model(synthetic_path, srv, **over), results=tmp_path, progress=False)
        assert run.info["extraction"]["from_cache"] is False and run.info["extraction"]["jobs_failed"] == 0
        assert run.info["extraction"]["memories"] > 0 and run.info["status"] == "complete"


def test_extractor_that_writes_nothing_stops_the_run(synthetic_path, tmp_path):
    with ScriptedServer(responder=lambda body: Reply(text="I have nothing to add.") if body.get("tools")
                        else responder(body)) as srv:
        over = {"extraction.name": "llm", "extraction.model": "openai/extractor"}
        with pytest.raises(ExtractionFailed, match="wrote no memory"):
            run_experiment(model(synthetic_path, srv, **over), results=tmp_path, progress=False)
        from memlab.memory import SQLiteMemoryService

        store = SQLiteMemoryService(next((tmp_path / ".cache" / "extract").glob("*/store.db")))
        states = [store.extraction_state(c) for c in ("syn-1", "syn-2")]  # never recorded as done: no cursor,
        assert [set(s) - {"memlab:build_cost"} for s in states] == [set(), set()]  # only what it cost
        store.close()
        run = run_experiment(model(synthetic_path, srv, **over, **{"run.allow_failed_extraction": True}),
                             results=tmp_path, progress=False)
        assert run.info["extraction"]["empty_conversations"] == ["syn-1", "syn-2"]


@pytest.mark.parametrize("over, needle", [
    ({"dataset.question_limit": 0}, "dataset.question_limit = 0; expected an integer >= 1"),
    ({"models.max_retries": -1}, "models.max_retries = -1"),
    ({"models.timeout": -1.0}, "models.timeout = -1.0; expected a number > 0"),
    ({"answer.name": "original", "answer.model": "m", "answer.prompt": "nope"}, "answer.prompt = 'nope'"),
    ({"judge.model": "m", "judge.prompt": "nope"}, "judge.prompt = 'nope'"),
    ({"index.params.factory": "HNSW0"}, "index.params.factory = 'HNSW0'"),
    ({"name": "../../etc"}, "name = '../../etc'"),
    ({"dataset.categories": [True]}, "dataset.categories has [True]"),
    # issue 20: each got through before (a crash in scoring, a TypeError, an errored question each, a silent change)
    ({"run.seed": -1}, "run.seed = -1; expected an integer >= 0"),
    ({"run.seed": 2**40}, "run.seed = 1099511627776; expected an integer <= 4294967295"),
    ({"dataset.path": [1, 2]}, "dataset.path = [1, 2]; expected a string or null"),
    ({"retrieval.similarity_threshold": "high"}, "retrieval.similarity_threshold = 'high'; expected a number or null"),
    ({"retrieval.participant_boost_sigma": float("nan")}, "retrieval.participant_boost_sigma = nan; expected a finite"),
    ({"models.timeout": float("inf")}, "models.timeout = inf; expected a finite number"),
    ({"retrieval.similarity_threshold": float("-inf")}, "retrieval.similarity_threshold = -inf; expected a finite"),
    ({"retrieval.fusion_weights": {"dense": float("nan")}}, "retrieval.fusion_weights has nan; expected finite"),
    ({"retrieval.top_k": 10**12}, "retrieval.top_k = 1000000000000; expected an integer <= 10000"),
    ({"name": "n" * 200}, "expected at most 120 letters"),
])
def test_bad_config_is_an_error_before_any_folder(synthetic_path, tmp_path, over, needle):
    with pytest.raises(ConfigError) as e:
        run_experiment(syn(synthetic_path).with_overrides(over), results=tmp_path / "res", progress=False)
    assert needle in str(e.value)
    assert not (tmp_path / "res").exists()  # no orphan run folder (nothing at all is written)


def test_yaml_nan_from_the_command_line_is_refused_before_any_folder(synthetic_path, tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(syn(synthetic_path).to_yaml())
    for value in ("retrieval.participant_boost_sigma=.nan", "run.max_error_rate=.inf", "retrieval.rrf_k=1e12"):
        assert main(["run", str(cfg), "--set", value, "--results", str(tmp_path / "r")]) == 2
        assert value.split("=")[0] in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_bad_data_and_unknown_conversation_leave_no_folder(write_locomo, synthetic_path, tmp_path):
    res = tmp_path / "res"
    with pytest.raises(ConfigError, match="unknown \\['conv-99'\\]"):
        run_experiment(syn(synthetic_path, **{"dataset.conversations": "conv-99"}), results=res, progress=False)
    broken = write_locomo(raw_text="{not json")
    with pytest.raises(Exception, match="variant.json"):
        run_experiment(syn(broken), results=res, progress=False)
    assert not res.exists() or [p for p in res.iterdir() if p.name != ".cache"] == []
    one = syn(synthetic_path, **{"dataset.conversations": "syn-2"})  # no brackets: a one-item list
    assert one.dataset.conversations == ["syn-2"]


def test_resume_refuses_a_changed_dataset_and_silent_overrides(write_locomo, tmp_path):
    path = write_locomo()
    run = run_experiment(syn(path, **{"dataset.question_limit": 1}), results=tmp_path, progress=False)
    with pytest.raises(ConfigError, match="refusing --set"):
        run_experiment(None, resume=run.run_dir, overrides={"retrieval.top_k": 3}, progress=False)
    forced = run_experiment(None, resume=run.run_dir, overrides={"retrieval.top_k": 3}, force_config=True,
                            progress=False)
    assert forced.config.retrieval.top_k == 3
    write_locomo(lambda s: s[0]["qa"][0].update(answer="a different gold answer"))
    with pytest.raises(ConfigError, match="the dataset changed since the run started"):
        run_experiment(None, resume=run.run_dir, progress=False)


def test_run_json_pins_inputs(synthetic_path, tmp_path):
    import hashlib

    import memlab

    run = run_experiment(syn(synthetic_path), results=tmp_path, progress=False)
    info = json.loads((run.run_dir / "run.json").read_text())
    assert info["dataset_sha256"] == hashlib.sha256(synthetic_path.read_bytes()).hexdigest()
    assert info["memlab_version"] == memlab.__version__ and info["config"] == run.config.to_dict()
    pk = info["environment"]["packages"]
    assert pk["numpy"] and pk["faiss-cpu"] and pk["pandas"] and "memlab_commit" in info["environment"]


class SwallowingAnswerer(FlakyAnswerer):
    """Ctrl-C arrives on the third question and a library below swallows it (a broad ``except``)."""

    def answer(self, question, ctx):
        self.seen = getattr(self, "seen", 0) + 1
        if self.seen == 3:
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1)  # the KeyboardInterrupt is raised in here ...
            except BaseException:  # noqa: BLE001 ... and eaten, as some HTTP stacks do
                pass
        return super().answer(question, ctx)


@pytest.fixture
def terminal_sigint():
    """Python's own Ctrl-C handler in this process (a CI job started in the background has SIGINT ignored)."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def test_a_swallowed_ctrl_c_still_stops_the_run(synthetic_path, tmp_path, terminal_sigint):
    with pytest.raises(KeyboardInterrupt):
        run_experiment(syn(synthetic_path), results=tmp_path, progress=False, answerer=SwallowingAnswerer(set()))
    (run_dir,) = tmp_path.glob("f-*")
    assert (run_dir / "predictions.jsonl").read_text().count("\n") == 2  # the third answer is not kept
    assert json.loads((run_dir / "run.json").read_text())["status"] == "interrupted"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is given back
    resumed = run_experiment(None, resume=run_dir, progress=False, answerer=FlakyAnswerer(set()))
    assert resumed.info["resumed_skipped"] == 2 and resumed.info["status"] == "complete"


def _terminal_sigint() -> None:
    """In the child: Ctrl-C as a terminal delivers it (a test runner may leave SIGINT ignored or blocked)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@contextlib.contextmanager
def _child_run_held_after_two_answers(synthetic_path, tmp_path, preexec):
    """A model run in a child process whose remaining answers are held once two are logged, so a signal the test
    sends arrives mid-call however slow this machine is. Yields (process, its predictions log or None, release):
    call release() once the signal is sent."""
    seen, sent = threading.Event(), threading.Event()

    def slow(body: dict) -> Any:
        if not sent.is_set():  # slow until the signal is sent; the resumed run afterwards goes at full speed
            time.sleep(0.4)
        if seen.is_set():
            sent.wait(30)
        return responder(body)

    with ScriptedServer(responder=slow) as srv:
        cfg = tmp_path / "c.yaml"
        cfg.write_text(model(synthetic_path, srv).to_yaml())
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        proc = subprocess.Popen([sys.executable, "-m", "memlab", "run", str(cfg), "--results", str(tmp_path / "r")],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=preexec)
        try:
            deadline = time.time() + 120
            log = None
            while time.time() < deadline and log is None:
                logs = list((tmp_path / "r").glob("f-*/predictions.jsonl"))
                if logs and logs[0].read_text().count("\n") >= 2:
                    log = logs[0]
                    seen.set()
                time.sleep(0.05)
            yield proc, log, sent.set
        finally:
            sent.set()
            if proc.poll() is None:  # a failed assertion leaves no child behind
                proc.kill()
                proc.communicate()


def test_sigint_stops_cleanly_and_prints_the_resume_command(synthetic_path, tmp_path):
    with _child_run_held_after_two_answers(synthetic_path, tmp_path, _terminal_sigint) as (proc, log, release):
        proc.send_signal(signal.SIGINT)
        release()
        out, err = proc.communicate(timeout=60)
        assert log is not None and proc.returncode == 130
        assert f"memlab run --resume {log.parent}" in err and "Traceback" not in err
        info = json.loads((log.parent / "run.json").read_text())
        assert info["status"] == "interrupted"
        done = log.read_text().count("\n")
        resumed = run_experiment(None, resume=log.parent, progress=False)
        assert resumed.info["resumed_skipped"] == done and resumed.info["status"] == "complete"
        assert len(resumed.info["sessions"]) == 2


# ------------------------------------------------------------------------------ issue 20, part B: run lifecycle
def _file_limit(limit: int):
    """In the child: files may grow to ``limit`` bytes, then a write fails with EFBIG (as a full disk fails one)."""
    import resource

    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def _memlab(*args: str, limit: int | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run([sys.executable, "-m", "memlab", *args], env=env, capture_output=True, text=True,
                          timeout=300, preexec_fn=_file_limit(limit) if limit else None)


@pytest.fixture
def finished_run(synthetic_path, tmp_path):
    return run_experiment(syn(synthetic_path), results=tmp_path / "res", progress=False)


@pytest.mark.parametrize("flag, name", [("--out", "report.md"), ("--html", "report.html")])
def test_a_report_cut_by_a_full_disk_keeps_the_old_file(finished_run, tmp_path, flag, name):
    out = tmp_path / "out" / name
    out.parent.mkdir()
    out.write_text("the old report\n")
    res = _memlab("report", str(finished_run.run_dir), flag, str(out), limit=700)  # the new one is larger
    assert res.returncode == 2, res.stderr
    assert f"memlab: cannot write {out}: File too large (EFBIG)" in res.stderr and "Traceback" not in res.stderr
    assert out.read_text() == "the old report\n"  # before: cut at 700 bytes (of ~1,500), the old report gone
    assert [p.name for p in out.parent.iterdir()] == [name]  # no temp file left


def test_a_resume_log_rewrite_cut_by_a_full_disk_keeps_the_log(finished_run):
    log = finished_run.run_dir / "predictions.jsonl"
    before = log.read_text()
    code = f"from pathlib import Path; from memlab.run.answering import load_done; load_done(Path({str(log.parent)!r}))"
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONDONTWRITEBYTECODE="1")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                         preexec_fn=_file_limit(len(before) // 2))
    assert res.returncode != 0 and "File too large" in res.stderr
    assert log.read_text() == before  # before: the log was cut in half, and the cut questions answered again


def test_a_storage_error_is_one_line_and_marks_the_run_failed(synthetic_path, tmp_path, monkeypatch, capsys):
    import errno

    import memlab.run.steps as steps

    def full(run_dir, pred, summ):
        raise OSError(errno.ENOSPC, "No space left on device", str(run_dir / "predictions.parquet"))

    monkeypatch.setattr(steps, "write_results", full)  # scoring is the run's shared step
    cfg = tmp_path / "c.yaml"
    cfg.write_text(syn(synthetic_path).to_yaml())
    assert main(["run", str(cfg), "--results", str(tmp_path / "r")]) == 2  # before: a traceback
    err = capsys.readouterr().err
    (run_dir,) = (tmp_path / "r").glob("f-*")
    assert f"memlab: cannot write {run_dir / 'predictions.parquet'}: No space left on device (ENOSPC)" in err
    said = [ln for ln in err.splitlines() if ln.startswith("memlab:")]
    assert f"memlab run --resume {run_dir}" in err and len(said) == 1 and "Traceback" not in err
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "failed" and "No space left on device" in info["failure"]


def test_a_results_path_too_long_is_one_line_and_no_traceback(synthetic_path, tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(syn(synthetic_path).to_yaml())
    assert main(["run", str(cfg), "--results", str(tmp_path / ("x" * 300))]) == 2  # before: a traceback
    err = capsys.readouterr().err
    assert "File name too long (ENAMETOOLONG)" in err and "x" * 300 in err and len(err.strip().splitlines()) == 1


def test_sigterm_stops_like_ctrl_c_and_a_second_process_is_refused_the_folder(synthetic_path, tmp_path):
    from memlab.rundir import RunFolderBusy

    default_sigterm = lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL)  # noqa: E731
    with _child_run_held_after_two_answers(synthetic_path, tmp_path, default_sigterm) as (proc, log, release):
        assert log is not None
        t0 = time.perf_counter()
        with pytest.raises(RunFolderBusy, match=f"in use by another memlab process \\(pid {proc.pid} on "):
            run_experiment(None, resume=log.parent, progress=False)  # before: a second writer on the same log
        assert time.perf_counter() - t0 < 5  # refused at once, before loading anything
        proc.send_signal(signal.SIGTERM)
        release()
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 143, err  # before: killed by the signal (-15), run.json left "running"
        assert f"memlab run --resume {log.parent}" in err and "Traceback" not in err
        assert json.loads((log.parent / "run.json").read_text())["status"] == "interrupted"
        done = log.read_text().count("\n")
        resumed = run_experiment(None, resume=log.parent, progress=False)  # the lock died with its process
        assert resumed.info["resumed_skipped"] == done and resumed.info["status"] == "complete"


def test_a_stale_lock_file_of_a_dead_process_is_taken_over(finished_run):
    import socket

    from memlab.rundir import LOCK_FILE

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lock = finished_run.run_dir / LOCK_FILE
    lock.write_text(json.dumps({"pid": int(dead.stdout), "host": socket.gethostname(), "since": "2026-01-01"}))
    again = run_experiment(None, resume=finished_run.run_dir, progress=False)
    assert again.info["status"] == "complete" and lock.read_text() == ""  # released when the run ended


def test_grid_values_never_make_a_path_outside_the_results_root(synthetic_path, tmp_path):
    from memlab.run import run_ablation

    root = tmp_path / "a" / "b" / "res"
    cfg = syn(synthetic_path, **{"dataset.question_limit": 1, "grid": {"extraction.model": ["../../../x", "x"]}})
    runs = run_ablation(cfg, results=root, progress=False)
    assert [r.run_dir.parent for r in runs] == [root, root]  # before: ../../../x made a/b/x-<stamp>
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_dir() and p.name.startswith("x")) == []
    names = [r.config.name for r in runs]
    assert names[0].startswith("f-modelx_") and names[1] == "f-modelx" and "/" not in names[0]


def _crafted(run_dir: Path, srv: ScriptedServer, prompt: Path) -> None:
    """Edit a finished offline run's config.yaml as a folder from elsewhere could come."""
    import yaml

    d = yaml.safe_load((run_dir / "config.yaml").read_text())
    d["answer"].update(name="original", model="openai/scripted", prompt=str(prompt))
    d["models"].update(api_base=srv.api_base, api_key_env="H20B_SECRET", max_retries=0, timeout=5.0)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(d))
    (run_dir / "predictions.jsonl").write_text("")  # every question still to answer


def test_resume_refuses_a_crafted_endpoint_key_and_prompt_unless_trusted(finished_run, tmp_path, monkeypatch,
                                                                       capsys):
    monkeypatch.setenv("H20B_SECRET", "sk-the-users-secret")
    prompt = tmp_path / "local-file.md"
    prompt.write_text((ROOT / "memlab" / "prompts" / "answer" / "original.md").read_text())
    with ScriptedServer(responder=responder) as srv:
        _crafted(finished_run.run_dir, srv, prompt)
        assert main(["run", "--resume", str(finished_run.run_dir)]) == 2
        err = capsys.readouterr().err
        for needle in (f"models.reader.api_base = '{srv.api_base}'", "models.reader.api_key_env = 'H20B_SECRET'",
                       f"answer.prompt = '{prompt}'", "--trust-run-config"):
            assert needle in err
        assert srv.requests == []  # before: the secret and the file went to the folder's server
        # the user confirms: the folder's settings are used, and remembered for the next resume
        run = run_experiment(None, resume=finished_run.run_dir, progress=False, trust_run_config=True)
        assert run.config.models.api_base == srv.api_base and srv.requests
        run_experiment(None, resume=finished_run.run_dir, progress=False)


def test_resume_of_the_users_own_model_run_needs_no_flag(synthetic_path, tmp_path):
    with ScriptedServer(responder=responder) as srv:
        run = run_experiment(model(synthetic_path, srv, **{"models.api_key_env": "H20B_OWN"}), results=tmp_path,
                             progress=False)
        again = run_experiment(None, resume=run.run_dir, progress=False)
        assert again.info["status"] == "complete"
        with pytest.raises(ConfigError, match="models.reader.api_key_env = 'OTHER'"):  # edited after the start
            _edit_and_resume(run.run_dir)


def _edit_and_resume(run_dir: Path) -> None:
    import yaml

    d = yaml.safe_load((run_dir / "config.yaml").read_text())
    d["models"]["api_key_env"] = "OTHER"
    (run_dir / "config.yaml").write_text(yaml.safe_dump(d))
    run_experiment(None, resume=run_dir, progress=False)


@pytest.mark.parametrize("name, damage, needle", [
    ("predictions.parquet", b"PAR1 cut short", "predictions.parquet: unreadable"),
    ("run.json", b"{not json", "run.json: unreadable"),
    ("config.yaml", b"name: [unclosed", "config.yaml: unreadable"),
    ("config.yaml", b"- a list", "config.yaml: expected a mapping"),
])
def test_report_on_a_corrupt_run_file_names_it(finished_run, capsys, name, damage, needle):
    (finished_run.run_dir / name).write_bytes(damage)
    assert main(["report", str(finished_run.run_dir)]) == 2  # before: a raw traceback
    err = capsys.readouterr().err
    assert needle in err and str(finished_run.run_dir / name) in err


# ------------------------------------------------------------------ issue 35: every role's errors, signals twice
def test_a_run_whose_judge_calls_all_failed_is_not_complete_and_says_so(synthetic_path, tmp_path, capsys):
    def judge_down(body):
        if "grade answers" in body["messages"][0]["content"]:
            return Reply(status=400, text="judge refused")
        return responder(body)

    with ScriptedServer(responder=judge_down) as srv:
        cfg = tmp_path / "c.yaml"
        cfg.write_text(model(synthetic_path, srv, **{"judge.model": "openai/judge"}).to_yaml())
        assert main(["run", str(cfg), "--results", str(tmp_path / "r")]) == 3  # before: 0, [complete], J NaN
        out = capsys.readouterr()
        assert "[complete-with-errors]" in out.out and "errors: reader 0 of 7, judge 7 of 7" in out.out
        assert "judge: 7 of 7 verdicts ended in an error" in out.err
        (run_dir,) = (tmp_path / "r").glob("f-*")
        info = json.loads((run_dir / "run.json").read_text())
        assert info["status"] == "complete-with-errors" and info["role_errors"]["judge"] == {"errors": 7, "of": 7}
        assert main(["run", str(cfg), "--results", str(tmp_path / "r2"), "--set", "run.max_error_rate=1"]) == 0


_TWICE = """
import json, os, signal, sys
import memlab.run.runner as runner
from memlab.extract.extractors import TurnsExtractor
from memlab.run import ExperimentConfig, run_experiment

target = getattr(runner, sys.argv[3])
def again(*a, **k):  # a second SIGTERM while the first is being handled
    os.kill(os.getpid(), signal.SIGTERM)
    return target(*a, **k)
setattr(runner, sys.argv[3], again)

class Killed(TurnsExtractor):
    def extract(self, request):
        os.kill(os.getpid(), signal.SIGTERM)  # the first one, during extraction
        return super().extract(request)

cfg = ExperimentConfig.from_dict({"name": "f", "dataset": {"path": sys.argv[1]}, "extraction": {"name": "turns"}})
try:
    run_experiment(cfg, results=sys.argv[2], progress=False, extractor=Killed())
except KeyboardInterrupt as e:
    print("stopped by", type(e).__name__)
"""


@pytest.mark.parametrize("while_in", ["record_interrupt", "close_session"])
def test_a_second_signal_while_the_first_is_handled_never_leaves_the_run_running(while_in, synthetic_path,
                                                                                   tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONDONTWRITEBYTECODE="1")
    res = subprocess.run([sys.executable, "-c", _TWICE, str(synthetic_path), str(tmp_path / "r"), while_in],
                         env=env, capture_output=True, text=True, timeout=120,
                         preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))
    assert "stopped by Terminated" in res.stdout, res.stderr
    (run_dir,) = (tmp_path / "r").glob("f-*")
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "interrupted", info["status"]  # before: "running"
    assert info["resume"] == f"memlab run --resume {run_dir}"
