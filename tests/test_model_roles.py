"""Per-role endpoints, limits and timeouts in the config, and what a run records when a model fails."""

from __future__ import annotations

import dataclasses

import pytest

from memlab.run import ConfigError, ExperimentConfig, run_experiment
from memlab.testing import Reply, ScriptedServer
from tests.scripted_model import responder


def cfg(**over) -> ExperimentConfig:
    base = {"extraction": {"extractor": "llm", "model": "openai/ex"},
            "answer": {"arm": "original", "model": "openai/reader"}, "judge": {"model": "openai/judge"},
            "models": {"api_base": "http://127.0.0.1:8000/v1", "timeout": 60.0, "max_retries": 2}}
    return ExperimentConfig.from_dict(base).with_overrides(over) if over else ExperimentConfig.from_dict(base)


def test_roles_fall_back_to_models_and_override_one_key_at_a_time():
    from memlab.run.extraction import job_timeout

    c = cfg(**{"models.judge.api_base": "https://api.example.invalid/v1", "models.judge.concurrency": 8,
               "models.extractor.timeout": 300.0})
    assert c.models.resolve("reader") == {"api_base": "http://127.0.0.1:8000/v1", "api_key_env": None,
                                          "timeout": 60.0, "max_retries": 2, "concurrency": None,
                                          "context_window": None}
    assert c.models.resolve("judge")["api_base"] == "https://api.example.invalid/v1"
    assert c.models.resolve("judge")["concurrency"] == 8 and c.models.resolve("extractor")["timeout"] == 300.0
    assert ExperimentConfig.from_dict(c.to_dict()).models.resolve("extractor")["timeout"] == 300.0  # round trip
    assert job_timeout(c) == 300.0 * 3 + 30.0  # above the extractor's own timeout x attempts
    assert job_timeout(cfg(**{"extraction.worker.job_timeout_s": 45.0})) == 45.0


@pytest.mark.parametrize("over, needle", [
    ({"models.reader.timeout": -1}, "models.reader.timeout = -1"),
    ({"models.judge.max_retries": -2}, "models.judge.max_retries = -2"),
    ({"models.concurrency": 0}, "models.concurrency = 0"),
    ({"models.extractor.context_window": 0}, "models.extractor.context_window = 0"),
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
            "extraction": {"extractor": "turns"}, "answer": {"arm": "original", "model": "openai/reader"},
            "judge": {"model": "openai/judge"},
            "models": {"api_base": reader.api_base, "max_retries": 0, "judge": {"api_base": judge.api_base}}})
        run = run_experiment(c, results=tmp_path, progress=False)
        assert len(reader.requests) == 7 and len(judge.requests) == 7
        assert {r["model"] for r in judge.requests} == {"judge"} and run.predictions["j"].eq(1.0).all()


def test_a_failed_question_keeps_the_cost_of_its_rounds(synthetic_path, tmp_path):
    """Round 1 of the optimized arm succeeds (300 prompt tokens), round 2 gets 500s: the row keeps round 1."""
    first = Reply(tool_calls=[{"name": "memory_search", "arguments": {"query": "dog"}}], prompt_tokens=300,
                  completion_tokens=12)
    with ScriptedServer([first, Reply(status=500), Reply(status=500)], responder=responder) as srv:
        c = ExperimentConfig.from_dict({
            "name": "partial", "dataset": {"path": str(synthetic_path), "conversations": ["syn-2"]},
            "extraction": {"extractor": "turns"}, "answer": {"arm": "optimized", "model": "openai/reader"},
            "models": {"api_base": srv.api_base, "max_retries": 1}})
        run = run_experiment(c, results=tmp_path, progress=False)
        bad = run.predictions[run.predictions["error"].notna()]
        assert len(bad) == 1 and "ModelCallError" in bad["error"].iloc[0]
        assert int(bad["prompt_tokens"].iloc[0]) == 300 and int(bad["calls"].iloc[0]) == 3


def test_job_timeout_from_config_bounds_a_slow_extraction(synthetic_path, tmp_path):
    with ScriptedServer(responder=lambda b: dataclasses.replace(responder(b), delay=0.6)) as srv:
        c = ExperimentConfig.from_dict({
            "name": "slow", "dataset": {"path": str(synthetic_path), "conversations": ["syn-2"]},
            "extraction": {"extractor": "llm", "model": "openai/ex", "worker": {"job_timeout_s": 0.2}},
            "answer": {"arm": "extractive"}, "models": {"api_base": srv.api_base, "max_retries": 0}})
        with pytest.raises(Exception, match=r"syn-2: job timeout after 0.2 s") as ei:
            run_experiment(c, results=tmp_path, progress=False)
        assert type(ei.value).__name__ == "ExtractionFailed"
