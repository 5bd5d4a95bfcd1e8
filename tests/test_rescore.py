"""Rescoring a finished run under other profiles makes zero model calls (a scripted server counts them);
a judge prompt the run never sent leaves J empty unless model calls are allowed."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from memlab.run import ExperimentConfig, run_experiment
from memlab.testing import Reply, ScriptedServer


def reply(body):
    text = body["messages"][-1]["content"]
    if "grade answers" in text:  # memlab's default judge prompt: alternate verdicts by question
        return Reply(text="CORRECT" if "Caroline" in text else "WRONG")
    if '"correct": true or false' in text:  # the tRPC-Agent-Go judge prompt
        return Reply(text='{"correct": true, "confidence": 0.9, "reason": "same"}')
    return Reply(text="7 May 2023")


@pytest.fixture
def judged_run(locomo_path, tmp_path):
    with ScriptedServer(responder=reply) as srv:
        cfg = ExperimentConfig.from_dict({
            "name": "judged", "dataset": {"path": str(locomo_path), "conversations": ["conv-26"],
                                          "question_limit": 8},
            "answer": {"name": "long-context", "model": "openai/scripted-reader"},
            "judge": {"model": "openai/scripted-judge"}, "models": {"api_base": srv.api_base, "max_retries": 1}})
        run = run_experiment(cfg, results=tmp_path, progress=False)
        yield run, srv


def test_rescore_without_model_calls(judged_run, capsys):
    from memlab.cli import main
    from memlab.run.rescore import profile_table, rescore

    run, srv = judged_run
    sent = len(srv.requests)
    assert sent == 16  # 8 answers + 8 verdicts
    loc = rescore(run.run_dir, "locomo")
    assert len(srv.requests) == sent and loc.info["judge"]["model_calls"] == 0
    assert loc.info["judge"]["from_cache"] == 8 and loc.info["judge"]["cache_misses"] == 0
    pd.testing.assert_series_equal(loc.scores.set_index("qid")["j"], run.predictions.set_index("qid")["j"],
                                   check_names=False)
    assert (run.run_dir / "summary-locomo.csv").is_file()
    assert loc.summary.loc["overall 1-5", "f1"] == pytest.approx(run.summary.loc["overall 1-5", "f1"])
    # mem0's judge prompt was never sent: J empty, every miss counted, still no request
    m = rescore(run.run_dir, "mem0")
    assert len(srv.requests) == sent
    n_scored = int(m.scores["scored"].sum())
    assert m.info["judge"]["cache_misses"] == n_scored and m.scores["j"].isna().all()
    assert m.summary["j"].isna().all()
    # the CLI says so, and writes summary-mem0.csv next to the run
    assert main(["rescore", str(run.run_dir), "--profile", "mem0"]) == 0
    out = capsys.readouterr().out
    assert "not in the response cache" in out and "--allow-model-calls" in out
    assert (run.run_dir / "summary-mem0.csv").is_file()
    assert len(srv.requests) == sent
    # side by side: three profiles, still no request
    table = profile_table(run.run_dir, ["locomo", "mem0", "trpc-agent-go"])
    assert len(srv.requests) == sent
    assert set(table.columns.get_level_values(0)) == {"locomo", "mem0", "trpc-agent-go"}
    assert table.loc["1", ("locomo", "label")] == "multi-hop" and table.loc["1", ("mem0", "label")] == "single-hop"
    assert pd.isna(table.loc["overall 1-5", ("mem0", "f1")])  # mem0 skips category 5: no 1-5 figure
    assert main(["report", str(run.run_dir), "--profiles", "locomo,mem0,trpc-agent-go"]) == 0
    assert "trpc-agent-go" in capsys.readouterr().out
    assert len(srv.requests) == sent


def test_rescore_with_model_calls_allowed(judged_run):
    from memlab.run.rescore import rescore

    run, srv = judged_run
    sent = len(srv.requests)
    t = rescore(run.run_dir, "trpc-agent-go", allow_model_calls=True)
    n = int(t.scores["scored"].sum())
    assert len(srv.requests) == sent + n and t.info["judge"]["model_calls"] == n
    assert (t.scores.loc[t.scores["scored"], "j"] == 0.9).all()  # a correct verdict scores its confidence
    judge_prompts = [r["messages"][0]["content"] for r in srv.requests[sent:]]
    assert all('"confidence"' in p for p in judge_prompts)
    # the second time the verdicts are cached: no request
    again = rescore(run.run_dir, "trpc-agent-go")
    assert len(srv.requests) == sent + n and again.info["judge"]["cache_misses"] == 0


def test_run_under_a_profile_judges_with_its_prompt(locomo_path, tmp_path):
    with ScriptedServer(responder=reply) as srv:
        cfg = ExperimentConfig.from_dict({
            "name": "trpc", "dataset": {"path": str(locomo_path), "conversations": ["conv-26"],
                                        "question_limit": 4},
            "answer": {"name": "long-context", "model": "openai/scripted-reader"},
            "judge": {"model": "openai/scripted-judge"}, "scoring": {"profile": "trpc-agent-go"},
            "models": {"api_base": srv.api_base, "max_retries": 1}})
        run = run_experiment(cfg, results=tmp_path, progress=False)
        assert (run.predictions["j"] == 0.9).all()
        assert run.summary.loc["2", "label"] == "multi-hop"  # tRPC's name for category 2
        info = json.loads((run.run_dir / "run.json").read_text())
        assert info["scoring"]["profile"] == "trpc-agent-go"


def test_compare_refuses_one_run_given_twice(synthetic_path, tmp_path, capsys):
    from memlab.cli import main

    cfg = ExperimentConfig.from_yaml("offline").with_overrides({"dataset.path": str(synthetic_path)})
    run_dir = str(run_experiment(cfg, results=tmp_path, progress=False).run_dir)
    capsys.readouterr()
    for args in ([run_dir, run_dir], [run_dir, run_dir + "/"]):
        assert main(["compare", *args]) == 2  # before: ValueError "names must be 2 distinct labels", a traceback
        err = capsys.readouterr().err
        assert "given more than once" in err and len(err.strip().splitlines()) == 1
