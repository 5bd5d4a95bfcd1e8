"""The rate-limit policy (`memlab.llm.retry`, issue 38): Retry-After waited (capped), else exponential backoff with
jitter up to the role's max_retries, then the call fails; requests in flight bounded per endpoint, hosted ones too."""

from __future__ import annotations

import random
import threading
import time
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from types import SimpleNamespace

import pytest

import memlab.llm.retry as retry
from memlab.llm import HOSTED_CONCURRENCY, ModelCallError, ModelClient
from memlab.run import ExperimentConfig
from memlab.testing import Reply, ScriptedServer

HI = [{"role": "user", "content": "hi"}]


def gaps(srv: ScriptedServer) -> list[float]:
    t = srv.arrivals
    return [b - a for a, b in zip(t, t[1:])]


def test_retry_after_is_waited_exactly_not_the_longer_backoff():
    with ScriptedServer([Reply(status=429, retry_after=0.3), Reply(text="ok")]) as srv:
        c = ModelClient("openai/scripted", api_base=srv.api_base, api_key="x", backoff=5.0, max_retries=1)
        assert c.complete(HI).text == "ok"
    assert 0.3 <= gaps(srv)[0] < 2.0  # the server's 0.3 s, not the 5 s backoff


def test_retry_after_above_the_declared_maximum_waits_the_maximum(monkeypatch):
    monkeypatch.setattr(retry, "MAX_RETRY_AFTER_S", 0.4)
    with ScriptedServer([Reply(status=429, retry_after=600), Reply(text="ok")]) as srv:
        t0 = time.monotonic()
        c = ModelClient("openai/scripted", api_base=srv.api_base, api_key="x", max_retries=1)
        assert c.complete(HI).text == "ok"
    assert 0.4 <= gaps(srv)[0] < 3.0 and time.monotonic() - t0 < 10


def test_429_without_retry_after_backs_off_exponentially_then_fails():
    with ScriptedServer(default=Reply(status=429, text="rate limited")) as srv:
        c = ModelClient("openai/scripted", api_base=srv.api_base, api_key="x", backoff=0.2, max_retries=3)
        with pytest.raises(ModelCallError, match="after 4 attempt"):
            c.complete(HI)
    g = gaps(srv)
    assert len(srv.requests) == 4 and len(g) == 3
    for n, gap in enumerate(g, start=1):  # attempt n waits between half and all of 0.2 x 2^(n-1)
        base = 0.2 * 2 ** (n - 1)
        assert base / 2 <= gap < base + 1.0, (n, g)
    assert c.failures == 1 and c.calls == 4


def test_the_backoff_is_jittered_and_bounded():
    e = RuntimeError("429")
    rng = random.Random(7)
    waits = [retry.retry_wait(e, 3, 0.5, rng) for _ in range(200)]
    assert all(1.0 <= w <= 2.0 for w in waits)  # base 0.5 x 2^2 = 2 s: between 1 and 2
    assert max(waits) - min(waits) > 0.5  # spread: clients that failed together do not retry together
    assert retry.retry_wait(e, 30, 0.5, rng) <= retry.MAX_BACKOFF_S


@pytest.mark.parametrize("headers, expect", [
    ({"retry-after": "7"}, 7.0),
    ({"retry-after-ms": "250"}, 0.25),
    ({"retry-after": "soon"}, None),
    ({}, None),
])
def test_retry_after_forms(headers, expect):
    e = RuntimeError("x")
    e.response = SimpleNamespace(headers=headers)  # type: ignore[attr-defined]
    got = retry.retry_after(e)
    assert got == expect if expect is None else got == pytest.approx(expect)


def test_retry_after_as_an_http_date():
    e = RuntimeError("x")
    when = datetime.now(timezone.utc) + timedelta(seconds=30)
    e.response = SimpleNamespace(headers={"retry-after": format_datetime(when, usegmt=True)})  # type: ignore
    assert 25 <= retry.retry_after(e) <= 31


def test_errors_a_retry_cannot_fix_are_not_retried():
    with ScriptedServer(default=Reply(status=401, text="bad key")) as srv:
        c = ModelClient("openai/scripted", api_base=srv.api_base, api_key="x", backoff=0.01, max_retries=3)
        with pytest.raises(ModelCallError, match="after 1 attempt"):
            c.complete(HI)
    assert len(srv.requests) == 1


def test_hosted_endpoints_are_bounded_by_default_and_local_ones_serial():
    hosted = ModelClient("openai/x", api_base="https://api.example.invalid/v1")
    provider = ModelClient("gpt-4o-mini")
    local = ModelClient("openai/x", api_base="http://127.0.0.1:9/v1")
    assert hosted.concurrency == provider.concurrency == HOSTED_CONCURRENCY == 4 and local.concurrency == 1
    cfg = ExperimentConfig.from_dict({"name": "h", "answer": {"name": "original", "model": "openai/x"},
                                      "models": {"api_base": "https://api.example.invalid/v1"}})
    assert any(line.startswith("reader:") and "concurrency 4" in line for line in cfg.describe_models())


def test_requests_in_flight_never_pass_the_endpoint_limit():
    """Eight threads, one endpoint limited to 4 (the hosted default): at most 4 reach the server at once."""
    with ScriptedServer(default=Reply(text="ok", delay=0.2)) as srv:
        clients = [ModelClient("openai/scripted", api_base=srv.api_base, api_key="x", concurrency=HOSTED_CONCURRENCY)
                   for _ in range(2)]  # two roles' clients of one endpoint share its slots
        threads = [threading.Thread(target=clients[i % 2].complete, args=([{"role": "user", "content": f"q{i}"}],))
                   for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(srv.requests) == 8 and srv.max_in_flight == 4


def test_a_question_whose_calls_stay_rate_limited_is_an_error_counted_against_the_budget(synthetic_path, tmp_path):
    """After max_retries the failure rules apply as to any failed call: the question is an error, not scored, and
    over run.max_error_rate the CLI exits 3; the run goes on with the other questions."""
    from memlab.cli import main
    from memlab.testing.models import scripted_model

    with ScriptedServer([Reply(status=429, retry_after=0, text="rate limited")] * 2,
                        responder=scripted_model) as srv:
        cfg = tmp_path / "c.yaml"
        cfg.write_text(ExperimentConfig.from_dict({
            "name": "rl", "dataset": {"path": str(synthetic_path)}, "extraction": {"name": "turns"},
            "answer": {"name": "original", "model": "openai/scripted"},
            "models": {"api_base": srv.api_base, "max_retries": 1}}).to_yaml())
        assert main(["run", str(cfg), "--results", str(tmp_path / "r")]) == 3
        assert len(srv.requests) == 2 + 6  # the first question's two attempts, then one call each for the other six
    import json

    (run_dir,) = [p for p in (tmp_path / "r").iterdir() if p.is_dir() and not p.name.startswith(".")]
    errors = [json.loads(x)["error"] for x in (run_dir / "predictions.jsonl").read_text().splitlines()]
    assert sum(e is not None for e in errors) == 1 and "RateLimit" in next(e for e in errors if e)
    assert json.loads((run_dir / "run.json").read_text())["status"] == "complete-with-errors"
