"""Issue 37: every component family is one selector (``<family>.name``) and one settings mapping
(``<family>.params``); the index is a component whose settings are its constructor's; an old spelling is moved
with a warning naming both keys (a finished run's record quietly) and keeps every cache key."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import yaml

from memlab.answer.extractive import ExtractiveAnswerer
from memlab.answer.session_recall import SessionRecallAnswerer
from memlab.index.hybrid import HybridIndex
from memlab.params import ParamError, check_params, construct, resolved_params
from memlab.run import ConfigError, ExperimentConfig
from memlab.run.clients import Clients
from memlab.run.components import build_answerer
from memlab.run.config import recorded_dict
from memlab.run.config_migrate import MovedKey
from memlab.run.extraction import index_file
from memlab.run.results import read_config
from memlab.run.reuse import config_differences

OLD = Path(__file__).parent / "old_configs"


def _quiet_read(path: Path) -> ExperimentConfig:
    with warnings.catch_warnings():
        warnings.simplefilter("error", MovedKey)  # a run's own record is read without a word
        return read_config(path)


def test_a_finished_runs_old_config_loads_quietly_with_its_index_file_and_settings():
    old = _quiet_read(OLD / "retrieval-best.yaml")
    assert index_file(old) == "index-b534c0d81d.npz"  # what memlab named its saved index before the move
    assert old.index.params == {"append_citing": True, "session_text": True, "ef_search": 512}
    assert old.index.keyword.params == {"k1": 1.4} and old.index.sparse.name == "splade"
    assert old.answer.name == "extractive" and old.answer.params == {"rank_weight": 0.9}
    # the shipped config now also names its learned-reader family (read only with answer.params.scorer: learned),
    # which the old record predates: the overrides put back the record's recipe
    new = ExperimentConfig.from_yaml("retrieval-best").with_overrides(
        {"index.params.ef_search": 512, "index.keyword.params": {"k1": 1.4}, "answer.params": {"rank_weight": 0.9}})
    assert config_differences(old.to_dict(), new.to_dict()) == []  # report/compare see one recipe
    raw = yaml.safe_load((OLD / "retrieval-best.yaml").read_text())
    assert config_differences(recorded_dict(raw), new.to_dict()) == []  # labels and reuse read the raw record


def test_session_recalls_old_fields_reach_its_settings_and_its_reader(tmp_path):
    old = _quiet_read(OLD / "session-recall.yaml")
    assert index_file(old) == "index-7a5c7a3e60.npz"
    # recall_max 3 was the config's default and is the arm's; recall_window 3 its default; the reader's max_words
    # is the offline reader's setting; max_rounds (the optimized arm's) had no effect and is gone
    assert old.answer.params == {"unit": "window", "reader__max_words": 9}
    arm = build_answerer(old, Clients(old, tmp_path / "r.sqlite"))
    assert isinstance(arm, SessionRecallAnswerer) and (arm.unit, arm.window, arm.max_units) == ("window", 3, 3)
    assert arm.reader.max_words == 9 and arm.get_params(deep=True)["reader__max_words"] == 9


def test_an_old_spelling_in_a_users_file_is_moved_and_said():
    d = {"extraction": {"extractor": "turns"}, "answer": {"arm": "extractive", "span": "clause"},
         "judge": {"kind": "llm"}, "index": {"embedder": "minilm", "keyword": "bm25",
                                             "keyword_params": {"k1": 1.2}, "factory": "HNSW32"}}
    with pytest.warns(MovedKey) as said:
        cfg = ExperimentConfig.from_dict(d, where="my.yaml")
    text = [str(w.message) for w in said]
    for old, new in (("extraction.extractor", "extraction.name"), ("answer.arm", "answer.name"),
                     ("answer.span", "answer.params.span"), ("judge.kind", "judge.name"),
                     ("index.embedder (a name)", "index.embedder.name"),
                     ("index.keyword_params", "index.keyword.params"),
                     ("index.factory", "index.params.factory")):
        assert f"my.yaml: {old} is now {new}" in text, text
    assert (cfg.extraction.name, cfg.answer.params, cfg.index.embedder.name) == ("turns", {"span": "clause"}, "minilm")
    assert cfg.index.hybrid_params() == {"embedder": "minilm", "keyword": "bm25(k1=1.2)", "sparse": None,
                                         "factory": "HNSW32"}


def test_old_keys_on_the_command_line_and_in_a_grid_are_moved():
    cfg = ExperimentConfig.from_yaml("offline")
    with pytest.warns(MovedKey, match=r"--set: index.ef_search is now index.params.ef_search"):
        assert cfg.with_overrides(["index.ef_search=64"]).index.params == {"ef_search": 64}
    with pytest.warns(MovedKey, match=r"answer.max_words is now answer.params.max_words"):
        grid = ExperimentConfig.from_dict({"name": "g", "answer": {"name": "extractive"},
                                           "grid": {"answer.max_words": [5, 9]}}).expand()
    assert [c.answer.params for c in grid] == [{"max_words": 5}, {"max_words": 9}]
    with pytest.raises(ConfigError, match=r"answer.max_rounds is now a setting of the answer arm .* 'extractive' "
                                          r"does not take it"):
        cfg.with_overrides(["answer.max_rounds=2"])
    with pytest.raises(ConfigError, match=r"both answer.arm \(the old spelling\) and answer.name are given"):
        ExperimentConfig.from_dict({"answer": {"arm": "extractive", "name": "extractive"}})
    with pytest.raises(ConfigError, match=r"both index.ef_search \(the old spelling\) and index.params.ef_search"):
        ExperimentConfig.from_dict({"index": {"ef_search": 5, "params": {"ef_search": 6}}})


def test_a_setting_the_arm_never_read_is_dropped_out_loud_only_when_it_was_set():
    with warnings.catch_warnings():
        warnings.simplefilter("error", MovedKey)
        quiet = ExperimentConfig.from_dict({"answer": {"arm": "original", "model": "m", "span": "novel"}},
                                           recorded=True)
    assert quiet.answer.params == {}
    with pytest.warns(MovedKey, match=r"answer.span = 'clause' dropped: answer arm 'original' does not take it"):
        ExperimentConfig.from_dict({"answer": {"name": "original", "model": "m", "span": "clause"}})


def test_the_index_settings_are_its_constructors_and_checked_there():
    with pytest.raises(ConfigError, match=r"index.params.factory = 'HNSW0'; expected a string \(a FAISS factory"):
        ExperimentConfig.from_dict({"index": {"params": {"factory": "HNSW0"}}})
    with pytest.raises(ConfigError, match=r"index.params.refit_growth = 0; expected a number > 0 and <= 1"):
        ExperimentConfig.from_dict({"index": {"params": {"refit_growth": 0}}})
    with pytest.raises(ConfigError, match=r"index.params.keyword = 'bm25'; not a setting of the index .* from "
                                          r"index.keyword"):
        ExperimentConfig.from_dict({"index": {"params": {"keyword": "bm25"}}})
    assert set(resolved_params(HybridIndex)) == {"factory", "refit_growth", "date_in_text", "append_citing",
                                                 "ef_search", "ef_construction", "session_text"}


def test_the_saved_index_manifest_is_derived_and_a_new_setting_is_written_only_when_set(tmp_path):
    idx = HybridIndex(keyword="bm25(k1=1.5)", ef_search=64)
    assert idx.settings() == {"embedder": "tfidf-lsa", "index": "Flat", "keyword": "bm25(k1=1.5)",
                              "embedder_params": {}, "date_in_text": True, "append_citing": False, "ef_search": 64,
                              "ef_construction": 128}  # format 4 as written before HybridIndex was a component
    assert idx.clone(refit_growth=0.5).settings()["refit_growth"] == 0.5  # a later setting: written when set
    assert idx.twin().get_params() == {**idx.get_params(), "persist_path": None}
    assert "cache_path" not in idx.cache_params() and idx.cache_id().startswith("memlab.index.hybrid.HybridIndex(")


def test_a_part_is_given_by_its_settings_as_part__setting():
    with pytest.raises(ParamError, match=r"reader__max_words = 0; expected an integer >= 1"):
        check_params(SessionRecallAnswerer, {"reader__max_words": 0})
    with pytest.raises(ParamError, match=r"unknown setting\(s\) 'reader__bogus'"):
        check_params(SessionRecallAnswerer, {"reader__bogus": 1})
    arm = construct(SessionRecallAnswerer, {"reader__span": "clause", "unit": "window"})
    assert isinstance(arm.reader, ExtractiveAnswerer) and arm.reader.span == "clause" and arm.unit == "window"
    assert resolved_params(SessionRecallAnswerer)["reader__span"] == "novel"
    assert "reader" not in resolved_params(SessionRecallAnswerer)  # the object itself is no config value


def test_the_index_nests_its_parts_settings():
    idx = HybridIndex(keyword="bm25(k1=1.5)", embedder_params={"n_components": 64})
    deep = idx.get_params(deep=True)
    assert deep["keyword__k1"] == 1.5 and deep["keyword__b"] == 0.75  # given, and the part's default
    assert deep["embedder__n_components"] == 64 and deep["factory"] == "Flat"
    assert not any(k.startswith("sparse__") for k in deep)  # no sparse list, no settings
    assert {k: v for k, v in deep.items() if "__" not in k} == idx.get_params()  # shallow: the constructor's own


def test_only_a_declared_part_takes_part__setting():
    """A component held by another is a part a config may set only where its class says so (``nested_params``):
    turns+llm's model extractor takes its model and prompt from the extraction section, never ``llm__model``."""
    with pytest.raises(ConfigError, match=r"unknown setting\(s\) 'llm__timeout' for extractor 'turns\+llm'"):
        ExperimentConfig.from_dict({"extraction": {"name": "turns+llm", "model": "m",
                                                   "params": {"llm__timeout": 5}}})
