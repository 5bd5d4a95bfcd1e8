"""The session-recall arm: unit selection, the offline reader, and the model path over real HTTP."""

from __future__ import annotations

import json

import pytest
import yaml

from memlab.answer import ExtractiveAnswerer, SessionRecallAnswerer
from memlab.data import load_locomo
from memlab.run import ConfigError, ExperimentConfig, run_experiment
from memlab.testing import Reply, ScriptedServer


@pytest.fixture
def syn(synthetic_path):
    return load_locomo(synthetic_path)


def test_select_sessions_in_hit_order_up_to_the_limit(syn):
    conv = syn["syn-1"]
    arm = SessionRecallAnswerer(reader=ExtractiveAnswerer(), unit="session", max_units=1)
    assert arm.select(conv, ["D2:2", "D1:1", "D2:1"]) == [(2, ["D2:1", "D2:2"])]
    arm.max_units = 2
    assert arm.select(conv, ["D2:2", "D2:1", "D1:3"]) == [(2, ["D2:1", "D2:2"]), (1, ["D1:1", "D1:2", "D1:3"])]


def test_select_windows_merge_when_they_touch(syn):
    conv = syn["syn-1"]
    arm = SessionRecallAnswerer(reader=ExtractiveAnswerer(), unit="window", window=0, max_units=3)
    # D1:1 and D1:3 are one turn apart: with window 0 they do not touch, D1:2 joins them into one window
    assert arm.select(conv, ["D1:1", "D1:3"]) == [(1, ["D1:1"]), (1, ["D1:3"])]
    assert arm.select(conv, ["D1:1", "D1:2", "D2:1"]) == [(1, ["D1:1", "D1:2"]), (2, ["D2:1"])]
    arm.window = 1
    assert arm.select(conv, ["D1:1"]) == [(1, ["D1:1", "D1:2"])]


def test_bad_knobs_are_refused():
    with pytest.raises(ValueError, match="unit"):
        SessionRecallAnswerer(reader=ExtractiveAnswerer(), unit="day")
    with pytest.raises(ValueError, match="model client or an offline reader"):
        SessionRecallAnswerer()
    with pytest.raises(ConfigError, match="answer.params.unit = 'day'"):
        ExperimentConfig.from_dict({"answer": {"name": "session-recall", "params": {"unit": "day"}}})
    with pytest.raises(ConfigError, match="answer.params.max_units = 0"):
        ExperimentConfig.from_dict({"answer": {"name": "session-recall", "params": {"max_units": 0}}})
    with pytest.raises(ConfigError, match="answer.params.reader__span = 'x'; expected one of novel"):
        ExperimentConfig.from_dict({"answer": {"name": "session-recall", "params": {"reader__span": "x"}}})


def test_shipped_config_round_trips_and_runs_offline(synthetic_path, tmp_path):
    cfg = ExperimentConfig.from_yaml("session-recall")
    assert ExperimentConfig.from_dict(yaml.safe_load(cfg.to_yaml())) == cfg
    assert cfg.answer.name == "session-recall" and cfg.answer.model is None
    cfg = cfg.with_overrides({"dataset.path": str(synthetic_path), "answer.params.max_units": 1})
    run = run_experiment(cfg, results=tmp_path, progress=False)
    p = run.predictions.set_index("qid")
    assert run.info["extraction"] == {}  # no extracted store: it reads the raw turns
    assert p.loc["syn-1/q3", "prediction"] != "" and "[over 1 session(s)" in p.loc["syn-1/q3", "rule"]
    # the reader's context is the whole loaded session: Bob's dog (D1:2) is in session 1 with 3 turns
    assert p.loc["syn-1/q3", "context_recall"] == 1.0
    retr = {r["qid"]: r for r in map(json.loads, open(run.run_dir / "traces" / "retrieval.jsonl"))}
    assert retr["syn-1/q3"]["preload"]["loaded"] == [{"session": 1, "turns": 3, "first": "D1:1", "last": "D1:3"}]
    assert len(retr["syn-1/q3"]["context_ids"]) == 3
    assert (p.calls == 0).all() and (p.context_tokens > 0).all()


def _model_cfg(path, srv, **over):
    base = {"name": "sr", "dataset": {"path": str(path)},
            "answer": {"name": "session-recall", "model": "openai/scripted-reader", "params": {"max_units": 1}},
            "models": {"api_base": srv.api_base, "max_retries": 0}}
    return ExperimentConfig.from_dict(base).with_overrides(over)


def test_model_path_prompt_carries_the_loaded_session_and_usage_is_accounted(synthetic_path, tmp_path):
    with ScriptedServer(default=Reply(text="Rex", prompt_tokens=321, completion_tokens=4, cached_tokens=100)) as srv:
        cfg = _model_cfg(synthetic_path, srv, **{"dataset.conversations": ["syn-1"],
                                                 "dataset.categories": [4]})
        run = run_experiment(cfg, results=tmp_path, progress=False)
        assert len(srv.requests) == 1
        system = srv.requests[0]["messages"][0]["content"]
        assert srv.requests[0]["messages"][1]["content"] == "What is Bob's dog called?"
        # the whole of session 1 (with its date), and nothing of session 2
        assert "### Session 1 (1:56 pm on 8 May, 2023)" in system
        assert "Bob: Nice! I adopted a dog named Rex last week." in system
        assert "Alice: Look at my new vase. [shared a photo: a photo of a blue vase]" in system
        assert "Mount Tam" not in system and "Session 2" not in system
        row = run.predictions.iloc[0]
        assert row.prediction == "Rex" and row.calls == 1
        assert (row.prompt_tokens, row.completion_tokens, row.cached_tokens) == (321, 4, 100)
        s = run.summary.loc["overall 1-5"]
        assert s["answer_tokens_qa"] == 325 and s["calls_qa"] == 1 and s["cached_tokens_qa"] == 100
        # a rerun is served from the response cache: no new request, the cached call is counted as such
        again = run_experiment(cfg, results=tmp_path, progress=False)
        assert len(srv.requests) == 1 and again.predictions.iloc[0].cached_calls == 1


def test_model_path_window_unit(synthetic_path, tmp_path):
    with ScriptedServer(default=Reply(text="Rex")) as srv:
        cfg = _model_cfg(synthetic_path, srv, **{"dataset.conversations": ["syn-1"], "dataset.categories": [4],
                                                 "answer.params.unit": "window", "answer.params.window": 0})
        run = run_experiment(cfg, results=tmp_path, progress=False)
        system = srv.requests[0]["messages"][0]["content"]
        retr = [json.loads(x) for x in open(run.run_dir / "traces" / "retrieval.jsonl")][0]
        top = retr["queries"][0]["hits"][0]["source_ids"][0]
        assert retr["context_ids"] and len(retr["context_ids"]) == 1  # window 0: the hit turn alone
        turn = load_locomo(synthetic_path)["syn-1"].turn(top)
        assert f"{turn.speaker}: {turn.searchable_text}" in system and f", turns {top}-{top}" in system
        assert system.count("\nAlice: ") + system.count("\nBob: ") == 1


def test_empty_model_answer_is_an_error_not_an_abstention(synthetic_path, tmp_path):
    with ScriptedServer(default=Reply(text="")) as srv:
        cfg = _model_cfg(synthetic_path, srv, **{"dataset.conversations": ["syn-2"]})
        run = run_experiment(cfg, results=tmp_path, progress=False)
        assert run.predictions.error.str.contains("empty").all()  # never scored as an abstention
        assert run.summary.loc["overall 1-5", "errors"] == 2


def test_the_runs_index_section_reaches_the_arms_turn_index(syn, tmp_path):
    from memlab.run.clients import Clients
    from memlab.run.components import build_answerer

    cfg = ExperimentConfig.from_yaml("session-recall").with_overrides(
        {"index.params.factory": "HNSW32", "index.params.ef_search": 77, "index.params.ef_construction": 33,
         "index.keyword.name": "bm25", "index.sparse.name": "tfidf", "index.params.session_text": True,
         "answer.params.reader__max_words": 3})
    arm = build_answerer(cfg, Clients(cfg, tmp_path / "responses.sqlite"))
    svc, key = arm.turn_service(syn["syn-1"])
    idx = svc.searcher
    assert (idx.factory, idx.keyword, idx.sparse, idx.session_text) == ("HNSW32", "bm25", "tfidf", True)
    assert arm.reader.max_words == 3 and arm.get_params(deep=True)["reader__max_words"] == 3
    st = idx.ensure_built(key, lambda: svc.list(key))
    assert st.dense.index_.hnsw.efSearch == 77 and st.sparse is not None and st.session_kw is not None


@pytest.mark.parametrize("kw, named", [({"unit": "paragraph"}, "unit"), ({"window": -1}, "window"),
                                       ({"max_units": 0}, "max_units")])
def test_the_constructor_refuses_what_its_declaration_refuses(kw, named):
    from memlab.params import ParamError

    with pytest.raises(ParamError, match=f"{named} = "):
        SessionRecallAnswerer(reader=ExtractiveAnswerer(), **kw)
