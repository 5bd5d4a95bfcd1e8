"""Per-role endpoints, limits and timeouts in the config, and what a run records when a model fails."""

from __future__ import annotations

import dataclasses

import pytest

from memlab.run import ConfigError, ExperimentConfig, run_experiment
from memlab.testing import Reply, ScriptedServer
from tests.scripted_model import responder


def cfg(**over) -> ExperimentConfig:
    base = {"extraction": {"name": "llm", "model": "openai/ex"},
            "answer": {"name": "original", "model": "openai/reader"}, "judge": {"model": "openai/judge"},
            "models": {"api_base": "http://127.0.0.1:8000/v1", "timeout": 60.0, "max_retries": 2}}
    return ExperimentConfig.from_dict(base).with_overrides(over) if over else ExperimentConfig.from_dict(base)


def test_roles_fall_back_to_models_and_override_one_key_at_a_time():
    from memlab.run.extraction import job_timeout

    c = cfg(**{"models.judge.api_base": "https://api.example.invalid/v1", "models.judge.concurrency": 8,
               "models.extractor.timeout": 300.0})
    assert c.models.resolve("reader") == {"api_base": "http://127.0.0.1:8000/v1", "api_key_env": None,
                                          "timeout": 60.0, "max_retries": 2, "concurrency": None,
                                          "context_window": None, "max_tokens": 256, "structured_output": "tools"}
    assert c.models.resolve("judge")["api_base"] == "https://api.example.invalid/v1"
    assert c.models.resolve("judge")["concurrency"] == 8 and c.models.resolve("extractor")["timeout"] == 300.0
    assert ExperimentConfig.from_dict(c.to_dict()).models.resolve("extractor")["timeout"] == 300.0  # round trip
    assert job_timeout(c) == 300.0 * 3 + 30.0  # above the extractor's own timeout x attempts
    assert job_timeout(cfg(**{"extraction.worker.job_timeout_s": 45.0})) == 45.0


def test_each_role_has_its_own_reply_cap_and_structured_output_falls_back_like_the_endpoint():
    from memlab.run.config_models import ROLE_MAX_TOKENS

    c = cfg()
    assert {r: c.models.resolve(r)["max_tokens"] for r in ROLE_MAX_TOKENS} == ROLE_MAX_TOKENS
    c = cfg(**{"models.max_tokens": 100, "models.judge.max_tokens": 20, "models.structured_output": "json_schema",
               "models.reader.structured_output": "tools"})
    assert [c.models.resolve(r)["max_tokens"] for r in ("extractor", "reader", "judge")] == [100, 100, 20]
    assert [c.models.resolve(r)["structured_output"] for r in ("extractor", "reader", "judge")] == \
        ["json_schema", "tools", "json_schema"]


@pytest.mark.parametrize("over, needle", [
    ({"models.reader.timeout": -1}, "models.reader.timeout = -1"),
    ({"models.judge.max_retries": -2}, "models.judge.max_retries = -2"),
    ({"models.concurrency": 0}, "models.concurrency = 0"),
    ({"models.extractor.context_window": 0}, "models.extractor.context_window = 0"),
    ({"models.reader.max_tokens": 0}, "models.reader.max_tokens = 0"),
    ({"models.max_tokens": -5}, "models.max_tokens = -5"),
    ({"models.structured_output": "grammar"}, "models.structured_output = 'grammar'; allowed: tools, json_schema"),
    ({"models.judge.structured_output": "xml"}, "models.judge.structured_output = 'xml'"),
    ({"models.reader.api_base": "localhost:8000"}, "expected an http(s):// URL"),
    ({"models.reader.concurrency": 2}, "one endpoint, one limit"),
    ({"extraction.worker.job_timeout_s": 0}, "extraction.worker.job_timeout_s = 0"),
])
def test_bad_role_values_are_config_errors_naming_the_key(over, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        cfg(**over)


def test_describe_models_says_which_local_embedder_runs():
    lines = cfg().describe_models()
    assert any(ln.startswith("embedder: tfidf-lsa (local, in this process); the chat endpoints of extractor, "
                             "reader, judge are not used") for ln in lines)
    assert any(ln.startswith("reader: openai/reader at http://127.0.0.1:8000/v1") and "concurrency 1" in ln
               for ln in lines)


def test_each_role_calls_its_own_endpoint(synthetic_path, tmp_path):
    with ScriptedServer(responder=responder) as reader, \
            ScriptedServer(default=Reply(text="CORRECT")) as judge:
        c = ExperimentConfig.from_dict({
            "name": "roles", "dataset": {"path": str(synthetic_path)},
            "extraction": {"name": "turns"}, "answer": {"name": "original", "model": "openai/reader"},
            "judge": {"model": "openai/judge"},
            "models": {"api_base": reader.api_base, "max_retries": 0, "judge": {"api_base": judge.api_base}}})
        run = run_experiment(c, results=tmp_path, progress=False)
        assert len(reader.requests) == 7 and len(judge.requests) == 7
        assert {r["model"] for r in judge.requests} == {"judge"} and run.predictions["j"].eq(1.0).all()


def test_a_later_run_may_give_the_same_server_another_concurrency(synthetic_path, tmp_path):
    """One process (a notebook), one server, two runs in turn: the second run's limit replaces the first's (before:
    "already limited to 1 request(s) at a time by another client")."""
    with ScriptedServer(responder=responder) as srv:
        c = ExperimentConfig.from_dict({
            "name": "limits", "dataset": {"path": str(synthetic_path), "question_limit": 2},
            "extraction": {"name": "turns"}, "answer": {"name": "original", "model": "openai/reader"},
            "models": {"api_base": srv.api_base, "max_retries": 0}})
        first = run_experiment(c, results=tmp_path / "a", progress=False)
        n = len(srv.requests)
        second = run_experiment(c.with_overrides({"models.concurrency": 3}), results=tmp_path / "b", progress=False)
        assert first.status == second.status == "complete" and n > 0 and len(srv.requests) == 2 * n
        from memlab.llm import registered_endpoint

        assert registered_endpoint(srv.api_base).concurrency == 3


def test_an_endpoints_limit_changes_only_while_no_request_is_in_flight():
    """A later client's limit replaces an idle endpoint's (a notebook's next run; a new server on a port an old one
    used, the cause of a flaky test), and is an error while a request holds a slot."""
    from memlab.llm import endpoint

    base = "http://127.0.0.1:9/v1-limit-test"
    assert endpoint(base, 1).concurrency == 1
    ep = endpoint(base, 4)
    assert ep.concurrency == 4 and endpoint(base + "/", 4) is ep
    assert ep.slots.acquire(blocking=False)  # a request in flight
    try:
        with pytest.raises(ValueError, match=r"concurrency 2 asked while another client's request is in flight "
                                             r"under its limit of 4"):
            endpoint(base, 2)
        assert endpoint(base, 4) is ep  # its own clients go on
    finally:
        ep.slots.release()
    assert endpoint(base, 2).concurrency == 2 and ep.idle()


def test_a_failed_question_keeps_the_cost_of_its_rounds(synthetic_path, tmp_path):
    """Round 1 of the optimized arm succeeds (300 prompt tokens), round 2 gets 500s: the row keeps round 1."""
    first = Reply(tool_calls=[{"name": "memory_search", "arguments": {"query": "dog"}}], prompt_tokens=300,
                  completion_tokens=12)
    with ScriptedServer([first, Reply(status=500), Reply(status=500)], responder=responder) as srv:
        c = ExperimentConfig.from_dict({
            "name": "partial", "dataset": {"path": str(synthetic_path), "conversations": ["syn-2"]},
            "extraction": {"name": "turns"}, "answer": {"name": "optimized", "model": "openai/reader"},
            "models": {"api_base": srv.api_base, "max_retries": 1}})
        run = run_experiment(c, results=tmp_path, progress=False)
        bad = run.predictions[run.predictions["error"].notna()]
        assert len(bad) == 1 and "ModelCallError" in bad["error"].iloc[0]
        assert int(bad["prompt_tokens"].iloc[0]) == 300 and int(bad["calls"].iloc[0]) == 3


def test_job_timeout_from_config_bounds_a_slow_extraction(synthetic_path, tmp_path):
    with ScriptedServer(responder=lambda b: dataclasses.replace(responder(b), delay=0.6)) as srv:
        c = ExperimentConfig.from_dict({
            "name": "slow", "dataset": {"path": str(synthetic_path), "conversations": ["syn-2"]},
            "extraction": {"name": "llm", "model": "openai/ex", "worker": {"job_timeout_s": 0.2}},
            "answer": {"name": "extractive"}, "models": {"api_base": srv.api_base, "max_retries": 0}})
        with pytest.raises(Exception, match=r"syn-2: job timeout after 0.2 s") as ei:
            run_experiment(c, results=tmp_path, progress=False)
        assert type(ei.value).__name__ == "ExtractionFailed"


# ------------------------------------------------------------------ endpoints checked before any work
def every_role(path, base: str, **over) -> ExperimentConfig:
    """The models guide's `original` recipe pointed at one address: extractor, embedder, reader and judge."""
    c = ExperimentConfig.from_dict({
        "name": "roles", "dataset": {"path": str(path)},
        "extraction": {"name": "llm", "model": "gpt-4o-mini"},
        "answer": {"name": "original", "model": "gpt-4o-mini"},
        "index": {"embedder": {"name": "litellm:text-embedding-3-small"}}, "judge": {"model": "gpt-4o-mini"},
        "models": {"api_base": base}})
    return c.with_overrides(over) if over else c


def test_a_dead_endpoint_stops_the_run_before_extraction_naming_every_role(synthetic_path, tmp_path):
    """Before: only reader and judge were checked, after extraction (every job waited out its retries)."""
    import json
    import time

    from memlab.testing import closed_port_api_base

    base = closed_port_api_base()
    t0 = time.perf_counter()
    with pytest.raises(ConnectionError) as ei:
        run_experiment(every_role(synthetic_path, base), results=tmp_path, progress=False)
    assert time.perf_counter() - t0 < 5  # the data and components load; the check itself is one refused GET
    msg = str(ei.value)
    assert f"extractor/reader/judge/embedder endpoint {base} does not answer" in msg, msg
    for role in ("extractor gpt-4o-mini", "reader gpt-4o-mini", "judge gpt-4o-mini", "embedder text-embedding-3-small"):
        assert role in msg
    run_dir = next(tmp_path.glob("roles-*"))
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "failed" and "extraction" not in info  # stopped before the extraction stage
    assert not (run_dir / "traces" / "extraction.jsonl").exists()


def test_each_dead_role_endpoint_is_named_and_a_live_one_is_not(synthetic_path, tmp_path):
    from memlab.run.clients import Clients, check_endpoints
    from memlab.testing import closed_port_api_base

    dead = closed_port_api_base()
    with ScriptedServer(responder=responder) as live:
        c = every_role(synthetic_path, live.api_base, **{"models.judge.api_base": dead})
        with pytest.raises(ConnectionError) as ei:
            check_endpoints(c, Clients(c, tmp_path / "r.sqlite"))
        assert f"judge endpoint {dead} does not answer" in str(ei.value)
        assert live.api_base not in str(ei.value) and not live.requests


def test_an_endpoint_that_does_not_serve_the_model_is_named(synthetic_path, tmp_path):
    """Ollama lists every pulled model: a name it lacks fails before any request (before: one error per job)."""
    listing = [{"id": "qwen2.5:0.5b-instruct"}, {"id": "nomic-embed-text"}]
    with ScriptedServer(responder=responder, models=listing) as srv:
        c = every_role(synthetic_path, srv.api_base, **{"extraction.model": "openai/qwen2.5:0.5b-instruct",
                                                        "index.embedder.name": "litellm:openai/nomic-embed-text",
                                                        "judge.model": "openai/qwen2.5:0.5b-instruct"})
        with pytest.raises(ConnectionError) as ei:
            run_experiment(c, results=tmp_path, progress=False)
        msg = str(ei.value)
        assert f"reader gpt-4o-mini: not served at {srv.api_base}" in msg and "qwen2.5:0.5b-instruct" in msg
        assert "extractor" not in msg and "embedder" not in msg and "judge" not in msg.split("\n", 1)[1]
        assert not srv.requests and not srv.embed_requests  # nothing was sent


def test_a_hosted_role_whose_key_variable_is_unset_is_named(synthetic_path, tmp_path, monkeypatch):
    from memlab.run.clients import Clients, check_endpoints

    monkeypatch.delenv("MEMLAB_TEST_UNSET_KEY", raising=False)
    c = ExperimentConfig.from_dict({"dataset": {"path": str(synthetic_path)}, "answer": {"name": "original",
                                    "model": "gpt-4o-mini"}, "models": {"api_key_env": "MEMLAB_TEST_UNSET_KEY"}})
    with pytest.raises(ConnectionError, match="reader gpt-4o-mini: the key variable MEMLAB_TEST_UNSET_KEY"):
        check_endpoints(c, Clients(c, tmp_path / "r.sqlite"), ("reader",))
    monkeypatch.setenv("MEMLAB_TEST_UNSET_KEY", "sk-x")
    assert check_endpoints(c, Clients(c, tmp_path / "r.sqlite"), ("reader",)) == []  # no api_base: nothing probed


def test_the_circuit_breaker_stops_retrying_a_dead_endpoint():
    """Three calls in a row that could not connect open it: the next call is not sent at all."""
    from memlab.breaker import breaker
    from memlab.llm import EndpointUnreachable, ModelClient
    from memlab.testing import closed_port_api_base

    base = closed_port_api_base()
    c = ModelClient("openai/x", api_base=base, api_key="x", max_retries=5, backoff=0.01)
    with pytest.raises(EndpointUnreachable) as first:
        c.complete([{"role": "user", "content": "hi"}])
    assert first.value.partial.calls == 3  # before: 6 attempts (1 + max_retries)
    with pytest.raises(EndpointUnreachable, match="could not connect") as second:
        c.complete([{"role": "user", "content": "again"}])
    assert second.value.partial.calls == 0 and c.calls == 3
    assert isinstance(second.value.__cause__, ConnectionError)  # a run's answering stage stops on it
    br = breaker(base)
    br.opened_at -= br.cooldown_s  # after the cooldown one trial call goes through (and fails again)
    with pytest.raises(EndpointUnreachable):
        c.complete([{"role": "user", "content": "trial"}])
    assert c.calls == 4


def test_an_extraction_against_a_dead_endpoint_fails_fast_without_the_check(synthetic_path, tmp_path):
    """With the up-front check off, the breaker bounds the work: 3 connection attempts for all the jobs."""
    import time

    from memlab.breaker import breaker
    from memlab.run.extraction import ExtractionFailed
    from memlab.testing import closed_port_api_base

    base = closed_port_api_base()
    c = every_role(synthetic_path, base, **{"run.check_endpoint": False, "index.embedder.name": "tfidf-lsa",
                                            "models.max_retries": 3})
    t0 = time.perf_counter()
    with pytest.raises(ExtractionFailed, match="could not connect"):
        run_experiment(c, results=tmp_path, progress=False)
    assert time.perf_counter() - t0 < 20 and breaker(base).failures == 3


def test_a_vllm_listing_of_another_model_is_named_a_llama_cpp_one_is_not(synthetic_path, tmp_path):
    from memlab.run.clients import Clients, check_endpoints

    c = every_role(synthetic_path, "http://127.0.0.1:1/v1", **{"index.embedder.name": "tfidf-lsa"})
    for server, fails in (("vllm", True), ("llama-cpp-python", False)):
        with ScriptedServer.imitating(server, responder=responder) as srv:
            c2 = c.with_overrides({"models.api_base": srv.api_base})
            if fails:
                with pytest.raises(ConnectionError, match="reader gpt-4o-mini: not served at .*Qwen/Qwen2.5"):
                    check_endpoints(c2, Clients(c2, tmp_path / "r.sqlite"))
            else:
                assert check_endpoints(c2, Clients(c2, tmp_path / "r.sqlite")) == [srv.api_base]
