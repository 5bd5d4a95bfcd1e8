"""``python -m memlab.testing serve`` (issue 38): the scripted server as a command, for dry runs from the shell."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from memlab.run import ExperimentConfig, run_experiment

ROOT = Path(__file__).resolve().parents[1]


def serve(*args: str) -> tuple[subprocess.Popen, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "memlab.testing", "serve", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()  # the first line: where it listens
    assert line.startswith("api_base: http://127.0.0.1:"), (line, proc.stderr.read() if proc.poll() else "")
    return proc, line.split(": ", 1)[1].strip()


def chat(base: str, text: str) -> tuple[int, dict]:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": text}]}).encode()
    req = urllib.request.Request(base + "/chat/completions", method="POST", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, {"retry_after": e.headers.get("Retry-After"), **json.loads(e.read())}


def stopped(proc: subprocess.Popen, sig: int) -> tuple[int, str]:
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=15)
    return proc.returncode, err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_echo_mode_answers_and_stops_on_a_signal(sig):
    proc, base = serve("--mode", "echo")
    try:
        status, body = chat(base, "hello there")
        assert status == 200 and body["choices"][0]["message"]["content"] == "hello there"
        assert body["usage"]["prompt_tokens"] > 0
    finally:
        rc, err = stopped(proc, sig)
    assert rc == 0 and "stopped after 1 chat" in err


def test_a_script_file_then_a_fixed_reply(tmp_path):
    script = tmp_path / "replies.yaml"
    script.write_text("- first\n- {status: 429, retry_after: 2, text: slow down}\n"
                      "- {text: third, completion_tokens: 3}\n")
    proc, base = serve("--script", str(script), "--mode", "fixed", "--reply", "always this")
    try:
        got = [chat(base, f"q{i}") for i in range(5)]
    finally:
        rc, _ = stopped(proc, signal.SIGTERM)
    assert rc == 0
    assert got[0][1]["choices"][0]["message"]["content"] == "first"
    assert got[1][0] == 429 and got[1][1]["retry_after"] == "2" and "slow down" in got[1][1]["error"]["message"]
    assert got[2][1]["choices"][0]["message"]["content"] == "third"
    assert [g[1]["choices"][0]["message"]["content"] for g in got[3:]] == ["always this"] * 2


@pytest.mark.parametrize("args, says", [
    (["--mode", "fixed"], "--mode fixed needs --reply TEXT"),
    (["--reply", "x"], "--reply goes with --mode fixed"),
    (["--script", "/no/such/file.json"], "/no/such/file.json: no such script file"),
])
def test_bad_arguments_are_refused_clearly(args, says):
    out = subprocess.run([sys.executable, "-m", "memlab.testing", "serve", *args], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=60)
    assert out.returncode == 2 and says in out.stderr


def test_a_bad_script_names_the_reply_and_field(tmp_path):
    from memlab.testing import load_script

    bad = tmp_path / "s.json"
    bad.write_text(json.dumps([{"text": "ok"}, {"txet": "typo"}]))
    with pytest.raises(ValueError, match=r"s.json: reply 1: unknown field\(s\) \['txet'\]"):
        load_script(str(bad))


def test_a_dry_run_of_every_role_against_the_served_model(synthetic_path, tmp_path):
    """The default mode reads its prompts as a model would: extraction, reader and judge all complete."""
    proc, base = serve()
    try:
        cfg = ExperimentConfig.from_dict({
            "name": "dry", "dataset": {"path": str(synthetic_path)},
            "extraction": {"name": "llm", "model": "openai/scripted"},
            "answer": {"name": "original", "model": "openai/scripted"}, "judge": {"model": "openai/scripted"},
            "models": {"api_base": base, "max_retries": 0}})
        t0 = time.perf_counter()
        run = run_experiment(cfg, results=tmp_path, progress=False)
    finally:
        rc, err = stopped(proc, signal.SIGTERM)
    assert run.info["status"] == "complete" and run.info["errors"] == 0 and time.perf_counter() - t0 < 120
    assert run.summary.loc["overall 1-5", "j"] == 1.0  # the scripted judge says CORRECT
    assert rc == 0 and f"stopped after {run.info['spend']['calls']} chat" in err
