from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from memlab.answer import AnswerContext, preload
from memlab.data import load_locomo
from memlab.index import open_service
from memlab.memory import SearchOptions, UserKey
from memlab.run import ConfigError, ExperimentConfig, load_run, run_experiment
from memlab.run.report import report_table
from memlab.testing import Reply, ScriptedServer
from tests.scripted_model import responder

ROOT = Path(__file__).resolve().parents[1]


def test_shipped_configs_round_trip():
    for name in ("offline", "long-context", "original", "optimized", "topk-ablation", "retrieval-best"):
        cfg = ExperimentConfig.from_yaml(ROOT / "memlab" / "configs" / f"{name}.yaml")
        assert ExperimentConfig.from_yaml(name) == cfg  # by name: the packaged file
        again = ExperimentConfig.from_dict(yaml.safe_load(cfg.to_yaml()))
        assert again == cfg
    grid = ExperimentConfig.from_yaml("topk-ablation").expand()
    assert [c.retrieval.top_k for c in grid] == [5, 10, 20, 40] and all(not c.grid for c in grid)


@pytest.mark.parametrize(
    "doc, needle",
    [
        ({"retrieval": {"top_kk": 3}}, "unknown key(s) retrieval.top_kk; allowed under retrieval: top_k"),
        ({"answer": {"name": "oracle"}}, "answer.name = 'oracle'; allowed: extractive, long-context"),
        ({"index": {"embedder": {"name": "word2vec"}}}, "index.embedder.name = 'word2vec'; allowed: tfidf-lsa, minilm"),
        ({"retrieval": {"top_k": 0}}, "retrieval.top_k = 0; expected an integer >= 1"),
        ({"retrieval": {"hybrid": "yes"}}, "retrieval.hybrid = 'yes'; expected true or false"),
        ({"answer": {"name": "original"}}, "answer.model is required"),
        ({"extraction": {"reconcile": {"skip_score": 3}}}, "skip_score"),
        ({"grid": {"retrieval.nope": [1]}}, "unknown key 'retrieval.nope'"),
        ({"dataset": {"categories": [8]}}, "dataset.categories has [8]"),
    ],
)
def test_config_errors_name_key_and_allowed(doc, needle):
    with pytest.raises(ConfigError) as e:
        ExperimentConfig.from_dict(doc)
    assert needle in str(e.value)


def test_judge_shorthand():
    assert ExperimentConfig.from_dict({"judge": "litellm:gpt-4o-mini"}).judge.model == "gpt-4o-mini"
    with pytest.raises(ConfigError, match="litellm:<model>"):
        ExperimentConfig.from_dict({"judge": "gpt-4o-mini"})


def test_overrides():
    cfg = ExperimentConfig().with_overrides(["retrieval.top_k=20", "dataset.conversations=[conv-26]"])
    assert cfg.retrieval.top_k == 20 and cfg.dataset.conversations == ["conv-26"]
    with pytest.raises(ConfigError, match="unknown key 'top'"):
        ExperimentConfig().with_overrides(["retrieval.top=3"])


@pytest.mark.parametrize("values", [5, "5", [], {"a": 1}])
def test_a_grid_value_that_is_not_a_non_empty_list_is_refused_naming_the_key(values):
    with pytest.raises(ConfigError, match=r"grid\.retrieval\.top_k = .*expected a non-empty list"):
        ExperimentConfig.from_dict({"grid": {"retrieval.top_k": values}})


def test_preload_rule():
    svc = open_service("memory")
    k = UserKey("a", "u")
    for i in range(5):
        svc.add(k, f"memory number {i} about topic{i}")
    ctx = lambda n: AnswerContext(service=svc, key=k, conversation=None, search=SearchOptions(),  # noqa: E731
                                  preload_budget=n)
    assert preload(ctx(0), "x") == ([], {"budget": 0, "mode": "off"})
    got, info = preload(ctx(5), "x")
    assert info["mode"] == "all" and len(got) == 5  # N+1 probe found <= N
    got, info = preload(ctx(-1), "x")
    assert info["mode"] == "all" and len(got) == 5
    got, info = preload(ctx(2), "topic3")
    assert info["mode"] == "search" and len(got) == 2 and "topic3" in got[0].text
    strict = AnswerContext(service=svc, key=k, conversation=None, search=SearchOptions(similarity_threshold=0.999),
                           preload_budget=2)
    got, info = preload(strict, "zzz unknown words")
    assert info["mode"] == "recent (search empty)" and len(got) == 2

    class Broken:
        def read_recent(self, *a):
            raise RuntimeError("down")

    got, info = preload(AnswerContext(Broken(), k, None, SearchOptions(), 3), "x")
    assert got == [] and info["mode"] == "probe-failed"


def offline_cfg(locomo_path, **over):
    base = {"name": "t", "dataset": {"path": str(locomo_path), "conversations": ["conv-26"], "question_limit": 40},
            "extraction": {"name": "turns+observations"}, "retrieval": {"participant_boost": True}}
    cfg = ExperimentConfig.from_dict(base)
    return cfg.with_overrides(over) if over else cfg


def test_offline_run_writes_everything(locomo_path, tmp_path):
    run = run_experiment(offline_cfg(locomo_path), results=tmp_path, progress=False)
    d = run.run_dir
    for f in ("config.yaml", "environment.json", "predictions.parquet", "summary.parquet", "predictions.csv",
              "summary.csv", "run.json",
              "traces/retrieval.jsonl", "traces/answers.jsonl", "traces/extraction.jsonl", "traces/memories.jsonl"):
        assert (d / f).is_file(), f
    assert len(run.predictions) == 40 and run.predictions.error.isna().all()
    assert {"f1", "bleu1", "em", "recall@10", "context_recall", "rule"} <= set(run.predictions.columns)
    s = run.summary
    assert {"answer_tokens_qa", "prompt_tokens_qa", "calls_qa", "latency_p50_s", "latency_p95_s",
            "context_tokens_qa"} <= set(s.columns) and "tokens_qa" not in s.columns
    assert s.loc["overall 1-5", "n"] == 40 and s.loc["overall 1-5", "calls_qa"] == 0
    assert 0 < s.loc["overall 1-5", "recall@10"] <= 1
    again = load_run(d)
    pd.testing.assert_series_equal(again.summary["f1"], s["f1"], check_names=False)
    info = json.loads((d / "run.json").read_text())
    assert info["extraction"]["from_cache"] is False and info["timings"]["total_s"] > 0
    second = run_experiment(offline_cfg(locomo_path, **{"retrieval.top_k": 5}), results=tmp_path, progress=False)
    assert second.info["extraction"]["from_cache"] is True  # retrieval ablation re-extracts nothing
    table = report_table([run, second])
    assert list(dict.fromkeys(table.run_dir)) == [str(run.run_dir), str(second.run_dir)] and table.f1.notna().all()


def model_cfg(locomo_path, srv, arm, **over):
    base = {"name": arm, "dataset": {"path": str(locomo_path), "conversations": ["conv-26"], "question_limit": 12},
            "extraction": {"name": "turns"}, "answer": {"name": arm, "model": "openai/scripted-reader"},
            "models": {"api_base": srv.api_base, "max_retries": 1}}
    cfg = ExperimentConfig.from_dict(base)
    return cfg.with_overrides(over) if over else cfg


def test_original_arm_prompt_has_the_retrieved_memories_and_cache_makes_rerun_free(locomo_path, warm_results):
    with ScriptedServer(responder=responder) as srv:
        run = run_experiment(model_cfg(locomo_path, srv, "original"), results=warm_results, progress=False)
        assert run.info["models"]["model_calls"] == 12 and len(srv.requests) == 12
        rows = [json.loads(x) for x in open(run.run_dir / "traces" / "retrieval.jsonl")]
        mems = {m["id"]: m["text"] for m in map(json.loads, open(run.run_dir / "traces" / "memories.jsonl"))}
        for req, r in zip(srv.requests, rows):
            prompt = req["messages"][0]["content"]
            top = r["queries"][0]["hits"][0]["id"]
            assert mems[top] in prompt  # the prompt the model got carries the retrieved memories
        s = run.summary.loc["overall 1-5"]
        assert s["calls_qa"] == 1 and s["completion_tokens_qa"] == 6 and s["prompt_tokens_qa"] > 100
        n_before = len(srv.requests)
        rerun = run_experiment(model_cfg(locomo_path, srv, "original"), results=warm_results, progress=False)
        assert len(srv.requests) == n_before and rerun.info["models"]["model_calls"] == 0
        assert rerun.info["models"]["cache_hits"] == 12
        assert list(rerun.predictions.prediction) == list(run.predictions.prediction)


def test_optimized_arm_tools_and_accounting(locomo_path, warm_results):
    with ScriptedServer(responder=responder) as srv:
        run = run_experiment(model_cfg(locomo_path, srv, "optimized", **{"retrieval.preload": 3}),
                             results=warm_results, progress=False)
        p = run.predictions
        assert (p.calls == 2).all() and (p.cached_tokens == 400).all() and (p.prompt_tokens == 800).all()
        answers = [json.loads(x) for x in open(run.run_dir / "traces" / "answers.jsonl")]
        assert all([t["name"] for t in a["tool_calls"]] == ["memory_search", "memory_search"] for a in answers)
        second = srv.requests[1]["messages"]
        tool_msgs = [m for m in second if m["role"] == "tool"]
        assert json.loads(tool_msgs[0]["content"])["results"]  # search results went back to the model
        assert json.loads(tool_msgs[1]["content"]) == {"results": []}  # empty query -> empty result
        assert "Preloaded memories" in srv.requests[0]["messages"][0]["content"]
        retr = [json.loads(x) for x in open(run.run_dir / "traces" / "retrieval.jsonl")]
        assert all(r["preload"]["mode"] == "search" for r in retr)
        assert run.summary.loc["overall 1-5", "calls_qa"] == 2


def test_long_context_arm_and_judge(locomo_path, tmp_path):
    with ScriptedServer(responder=lambda body: Reply(text="CORRECT") if "grade answers" in
                        body["messages"][0]["content"] else Reply(text="7 May 2023")) as srv:
        cfg = model_cfg(locomo_path, srv, "long-context", **{"judge.model": "openai/scripted-judge",
                                                             "dataset.question_limit": 3})
        run = run_experiment(cfg, results=tmp_path, progress=False)
        first = srv.requests[0]["messages"][0]["content"]
        assert "Session 1 (1:56 pm on 8 May, 2023)" in first and "Caroline:" in first
        assert (run.predictions.j == 1.0).all() and "j" in run.summary.columns
        assert run.info["extraction"] == {}  # no memory needed


@pytest.mark.parametrize("extractor", ["llm", "turns+llm"])
def test_llm_extraction_arm_end_to_end(extractor, synthetic_path, tmp_path):
    data = load_locomo(synthetic_path)
    turns = {c.sample_id: {t.dia_id for t in c.turns} for c in data}
    keep_turns = extractor == "turns+llm"  # then observation-aware: the extracted memories index their turns
    extra = {"index.params.append_citing": True, "retrieval.unit": "turn"} if keep_turns else {}
    with ScriptedServer(responder=responder) as srv:  # it proposes one add per message in the delta
        cfg = model_cfg(synthetic_path, srv, "original", **{"extraction.name": extractor,
                                                            "extraction.model": "openai/scripted-extractor",
                                                            "dataset.conversations": sorted(turns), **extra})
        run = run_experiment(cfg, results=tmp_path, progress=False)
        extractor_calls = sum(1 for r in srv.requests if r.get("tools") and
                              "add_memory" in {t["function"]["name"] for t in r["tools"]})
    ext = [json.loads(x) for x in open(run.run_dir / "traces" / "extraction.jsonl")]
    applied = [e for e in ext if "result" in e]
    # every message's add reached the store (and, keeping turns, every turn itself)
    assert len(applied) == (2 if keep_turns else 1) * sum(map(len, turns.values()))
    assert all(e["result"] in ("added", "updated", "skipped", "update->add") for e in applied)
    tiers = [e["reconcile"]["tier"] for e in applied]
    assert tiers.count("verbatim") == (sum(map(len, turns.values())) if keep_turns else 0)
    info = run.info["extraction"]
    assert info["ops_applied"] == len(applied) and info["model_calls"] == extractor_calls > 0
    mems = [json.loads(x) for x in open(run.run_dir / "traces" / "memories.jsonl")]
    for conv, ids in turns.items():  # each memory cites its own conversation's turns, and every turn is cited
        cited = {s for m in mems if m["conversation"] == conv for s in m["source_ids"]}
        assert cited == ids, conv
    assert run.predictions.error.isna().all() and len(run.predictions) == sum(len(c.questions) for c in data)


@pytest.mark.parametrize("extractor", ["llm", "turns+llm"])
def test_a_clear_the_model_proposes_is_applied_and_never_forgets_a_turn(extractor, synthetic_path, tmp_path):
    """The model proposes one memory and then "forget everything" in one job: the clear is applied (``cleared:N``;
    it used to fail on every run with a RecursionError), and with verbatim turns it forgets the model's own
    memories only (the model never edits a turn)."""
    def adds_then_clears(body: dict) -> Reply:
        r = responder(body)
        if r.tool_calls and r.tool_calls[0]["name"] == "add_memory":
            r.tool_calls = [*r.tool_calls[:1], {"name": "clear_memories", "arguments": {}}]
        return r

    with ScriptedServer(responder=adds_then_clears) as srv:
        cfg = model_cfg(synthetic_path, srv, "original", **{"extraction.name": extractor,
                                                            "extraction.model": "openai/scripted-extractor",
                                                            "dataset.conversations": ["syn-1"],
                                                            "run.allow_failed_extraction": True})
        run = run_experiment(cfg, results=tmp_path, progress=False)
    ext = [json.loads(x) for x in open(run.run_dir / "traces" / "extraction.jsonl")]
    clears = [e for e in ext if e.get("op", {}).get("action") == "clear"]
    assert clears and all(e["result"].startswith("cleared:") and e["error"] is None for e in clears), clears
    assert run.info["extraction"]["ops_failed"] == 0
    mems = [json.loads(x) for x in open(run.run_dir / "traces" / "memories.jsonl")]
    turns = {t.dia_id for t in load_locomo(synthetic_path)["syn-1"].turns}
    if extractor == "turns+llm":  # every turn kept, each job's own memory gone
        assert sorted(s for m in mems for s in m["source_ids"]) == sorted(turns) and len(mems) == len(turns)
    else:
        assert mems == []


def test_a_conversation_the_model_wrote_nothing_for_still_has_its_build_cost(synthetic_path, tmp_path):
    """Every op dropped (first-person memories): the conversation ends empty and is extracted again next time
    (no cursor), but what the attempt cost is recorded each time, not NaN with a wrong stated cause, and a second
    attempt is not added to the first."""
    def first_person(body: dict) -> Reply:
        r = responder(body)
        for c in r.tool_calls:
            c["arguments"]["memory"] = "I went there."
        return r

    costs = []
    with ScriptedServer(responder=first_person) as srv:
        for _ in range(2):
            cfg = model_cfg(synthetic_path, srv, "original", **{"extraction.name": "llm",
                                                                "extraction.model": "openai/scripted-extractor",
                                                                "dataset.conversations": ["syn-1"],
                                                                "run.allow_failed_extraction": True,
                                                                "run.max_error_rate": 1.0})
            run = run_experiment(cfg, results=tmp_path, progress=False)
            assert run.info["extraction"]["empty_conversations"] == ["syn-1"]
            assert "build_unknown" not in run.info["cost"]
            costs.append(run.predictions[["extract_calls", "extract_prompt_tokens", "embed_tokens"]].iloc[0].tolist())
    assert costs[0] == costs[1] and costs[0][0] > 0 and costs[0][1] > 0


def test_a_failed_question_is_recorded_and_the_run_goes_on(locomo_path, warm_results):
    with ScriptedServer([Reply(status=400, text="bad request")], responder=responder) as srv:
        run = run_experiment(model_cfg(locomo_path, srv, "original", **{"dataset.question_limit": 4}),
                             results=warm_results, progress=False)
        p = run.predictions
        assert p.error.notna().sum() == 1 and "BadRequest" in p.error.dropna().iloc[0]
        assert run.info["extraction"]["from_cache"] is True  # the session's warm cache was used, not rebuilt
        assert p.error.isna().sum() == 3 and run.summary.loc["overall 1-5", "errors"] == 1


def test_resume_after_sigkill_matches_uninterrupted(locomo_path, tmp_path, warm_results):
    straight_root = tmp_path / "straight"  # both roots start from the same warm extraction, no model response
    shutil.copytree(warm_results / ".cache" / "extract", straight_root / ".cache" / "extract")
    seen, killed = threading.Event(), threading.Event()

    def slow(body: dict) -> Any:
        if not killed.is_set():  # slow until the kill; the resumed and the straight run go at full speed
            time.sleep(0.05)
        if seen.is_set():  # hold the rest until the kill: a slow machine must not finish the run first
            killed.wait(30)
        return responder(body)

    with ScriptedServer(responder=slow) as srv:
        cfg = model_cfg(locomo_path, srv, "original", **{"dataset.question_limit": 30})
        cfg_file = tmp_path / "cfg.yaml"
        cfg_file.write_text(cfg.to_yaml())
        killed_root = warm_results
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        proc = subprocess.Popen([sys.executable, "-m", "memlab", "run", str(cfg_file), "--results", str(killed_root)],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        log = None
        deadline = time.time() + 120
        while time.time() < deadline:
            logs = list(killed_root.glob("original-*/predictions.jsonl"))
            if logs and sum(1 for _ in open(logs[0])) >= 8:
                log = logs[0]
                seen.set()
                break
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        killed.set()
        assert log is not None, "the run never got going"
        n_before = sum(1 for _ in open(log))
        assert n_before < 30 and not (log.parent / "predictions.parquet").exists()
        resumed = run_experiment(None, resume=log.parent, progress=False)
        assert resumed.info["resumed_skipped"] == n_before and resumed.info["answered_now"] == 30 - n_before
        straight = run_experiment(cfg, results=straight_root, progress=False)
        a = resumed.predictions.set_index("qid")
        b = straight.predictions.set_index("qid")
        assert list(a.index) == list(b.index)
        pd.testing.assert_series_equal(a.prediction, b.prediction)
        pd.testing.assert_series_equal(a.f1, b.f1)
        cols = ["n", "f1", "recall@10"]
        pd.testing.assert_frame_equal(resumed.summary[cols], straight.summary[cols])
        retr = [json.loads(x)["qid"] for x in open(log.parent / "traces" / "retrieval.jsonl")]
        assert sorted(retr) == sorted(a.index)  # one trace line per question, none duplicated


def test_cli_run_and_report(locomo_path, tmp_path, capsys):
    from memlab.cli import main

    rc = main(["run", "offline", "--results", str(tmp_path), "--set", f"dataset.path={locomo_path}",
               "--set", "dataset.conversations=[conv-30]", "--set", "dataset.question_limit=10"])
    out = capsys.readouterr().out
    assert rc == 0 and "overall 1-4" in out and "model calls 0" in out
    runs = sorted(tmp_path.glob("offline-*"))
    assert main(["report", str(runs[0])]) == 0
    out = capsys.readouterr().out
    assert "F1" in out and "overall 1-4" in out and "context tokens" in out
    assert main(["run", "offline", "--set", "answer.name=magic"]) == 2
    assert "allowed: extractive" in capsys.readouterr().err
    (runs[0] / "predictions.parquet").unlink()
    assert main(["report", str(runs[0])]) == 2
    assert "memlab run --resume" in capsys.readouterr().err
    assert main(["report", str(tmp_path)]) == 2 and "not a run folder" in capsys.readouterr().err
