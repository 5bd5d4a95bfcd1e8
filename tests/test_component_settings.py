"""Issue 22: a component's settings are its constructor's parameters, declared once (`memlab.params`), and reach
config validation, the cache keys and run.json; each example in tests/example_components is one file."""

from __future__ import annotations

import json
import sqlite3
from typing import Annotated, Literal

import pytest

import tests.example_components.hashing_embedder  # noqa: F401  (each import registers one component)
import tests.example_components.overlap_scorer  # noqa: F401
import tests.example_components.rating_judge  # noqa: F401
import tests.example_components.sentence_extractor  # noqa: F401
import tests.example_components.top_memory_answerer  # noqa: F401
from memlab.extract.extractors import LLMExtractor, TurnsAndObservations
from memlab.index.embedders import TfidfLSAEmbedder, embedder_model, make_embedder, parse_embedder_spec
from memlab.index.keyword import BM25Scorer, make_keyword_scorer
from memlab.params import Component, OneOf, ParamError, Range, check_params, param_specs, parse_spec, spec_text
from memlab.run import ConfigError, ExperimentConfig, run_experiment
from memlab.run.clients import role_model
from tests.example_components.sentence_extractor import FirstSentenceExtractor
from tests.example_components.top_memory_answerer import TopMemoryAnswerer

EXAMPLES = {"extraction": {"name": "example-first-sentence"}, "answer": {"name": "example-top-memory"},
            "index": {"embedder": {"name": "example-hashing"}, "keyword": {"name": "example-overlap"}}}
#: What run.json records of the index's own settings when none is given: its constructor's defaults.
INDEX_DEFAULTS = {"factory": "Flat", "refit_growth": 0.25, "date_in_text": True, "append_citing": False,
                  "ef_search": 1024, "ef_construction": 128, "session_text": False}


def cfg_with(path=None, **settings) -> ExperimentConfig:
    d = json.loads(json.dumps(EXAMPLES))
    d["name"] = "settings"
    if path is not None:
        d["dataset"] = {"path": str(path)}
    for key, value in settings.items():  # ``index__embedder__params``: d["index"]["embedder"]["params"]
        *path, name = key.split("__")
        at = d
        for part in path:
            at = at.setdefault(part, {})
        at[name] = value
    return ExperimentConfig.from_dict(d)


@pytest.mark.parametrize("key, value, message", [
    ("index__embedder__params", {"dim": 2}, r"index\.embedder\.params\.dim = 2; expected an integer >= 8 and <= 4096"),
    ("index__keyword__params", {"min_chars": 0}, r"index\.keyword\.params\.min_chars = 0; expected an integer >= 1"),
    ("extraction__params", {"sentences": "two"}, r"extraction\.params\.sentences = 'two'; expected an integer"),
    ("answer__params", {"rank": 0}, r"answer\.params\.rank = 0; expected an integer >= 1 and <= 100"),
    ("extraction__params", {"sentence": 2},
     r"extraction\.params: unknown setting\(s\) 'sentence' for extractor 'example-first-sentence'; settings: "
     r"sentences"),
    ("answer__params", [1], r"answer\.params = \[1\]; expected a mapping"),
])
def test_a_bad_setting_is_a_config_error_naming_it(key, value, message):
    with pytest.raises(ConfigError, match=message):
        cfg_with(**{key: value})


DEFAULT_PARAMS = {"extractor": {"sentences": 1}, "answerer": {"rank": 1}, "judge": None, "embedder": {"dim": 64},
                  "keyword": {"min_chars": 1}, "sparse": None, "index": INDEX_DEFAULTS}


def _signature(run, root) -> dict:
    """What a setting can reach: each component's recorded settings, the extraction cache key and the labels, the
    answers' rules, and the saved indexes and embedding ids in the machine cache (both so far under ``root``)."""
    db = root / "machine-cache" / "embeddings.sqlite"
    return {"params": run.info["components"]["params"], "cache_key": run.info["extraction"]["cache_key"],
            "extractor": run.info["extraction"]["extractor"], "answerer": run.info["components"]["answerer"],
            "rules": set(run.predictions.rule),
            "indexes": {str(p.relative_to(root)) for p in root.rglob("index-*.npz")},
            "memories": {json.loads(x)["text"] for x in open(run.run_dir / "traces" / "memories.jsonl")},
            "eids": {r[0] for r in sqlite3.connect(db).execute("SELECT DISTINCT eid FROM emb")}}


#: One setting changed from its default, and what that alone must change in the run (`_signature`'s keys).
ONE_SETTING = [
    ("extraction__params", {"sentences": 2}, {"extractor": {"sentences": 2}},
     {"cache_key", "extractor", "memories", "indexes"}),
    ("answer__params", {"rank": 2}, {"answerer": {"rank": 2}}, {"answerer", "rules"}),
    ("index__embedder__params", {"dim": 32}, {"embedder": {"dim": 32}}, {"indexes", "eids"}),
    ("index__keyword__params", {"min_chars": 4}, {"keyword": {"min_chars": 4}}, {"indexes"}),
    ("index__params", {"ef_search": 7}, {"index": {**INDEX_DEFAULTS, "ef_search": 7}}, {"indexes"}),
]


@pytest.mark.parametrize(("key", "value", "params", "changes"), ONE_SETTING, ids=[c[0] for c in ONE_SETTING])
def test_one_setting_reaches_its_cache_keys_and_run_json(synthetic_path, tmp_path, monkeypatch, key, value, params,
                                                          changes):
    """Each setting changed alone from a run at the defaults: run.json records it (the others keep their defaults)
    and it moves exactly the cache keys, labels and saved state it belongs to, so a setting that stopped reaching
    its component, or reached another's, fails."""
    monkeypatch.setenv("MEMLAB_CACHE_DIR", str(tmp_path / "machine-cache"))
    base = run_experiment(cfg_with(synthetic_path), results=tmp_path, progress=False)
    before = _signature(base, tmp_path)
    run = run_experiment(cfg_with(synthetic_path, **{key: value}), results=tmp_path, progress=False)
    after = _signature(run, tmp_path)
    assert before["params"] == DEFAULT_PARAMS and after["params"] == {**DEFAULT_PARAMS, **params}
    recorded = run.info["config"]
    for part in key.split("__"):
        recorded = recorded[part]
    assert recorded == value
    assert {k for k in before if k != "params" and before[k] != after[k]} == changes
    if "memories" in changes:  # the extractor keeps two sentences of a turn now
        assert any(t.count(".") + t.count("!") + t.count("?") >= 2 for t in after["memories"])
        assert after["extractor"] == "example-first-sentence(2)"
    if "rules" in changes:  # the answer comes from rank 2
        assert after["answerer"] == "example-top-memory(2)" and after["rules"] == {"memory at rank 2"}
    if "eids" in changes:  # the embedder's id in the machine cache carries its setting
        assert after["eids"] - before["eids"] == {"example-hashing(32)"}


def test_sparse_settings_reach_validation_the_index_and_run_json(synthetic_path, tmp_path):
    """``index.sparse_params`` are the sparse scorer's constructor settings: checked against its declaration, in the
    index's spec (so in the saved index's file name and manifest) and in run.json."""
    from memlab.index.persist import read_index_file

    with pytest.raises(ConfigError, match=r"index\.sparse\.params\.min_chars = 0; expected an integer >= 1 and <= 40"):
        cfg_with(index__sparse__name="example-overlap", index__sparse__params={"min_chars": 0})
    with pytest.raises(ConfigError, match=r"index\.sparse\.params = \{'min_chars': 2\} without index\.sparse\.name"):
        cfg_with(index__sparse__params={"min_chars": 2})
    with pytest.raises(ConfigError, match=r"index\.sparse\.params\.k1 = -1; expected a number >= 0"):
        cfg_with(index__sparse__name="bm25", index__sparse__params={"k1": -1})
    with pytest.raises(ConfigError, match=r"index\.sparse\.params\.cache_path = 'x'; not a setting of keyword scorer "
                                          r"'splade': the run gives it from the machine cache"):
        cfg_with(index__sparse__name="splade", index__sparse__params={"cache_path": "x"})
    one = run_experiment(cfg_with(synthetic_path, index__sparse__name="example-overlap"), results=tmp_path,
                         progress=False)
    five = run_experiment(cfg_with(synthetic_path, index__sparse__name="example-overlap",
                                   index__sparse__params={"min_chars": 5}), results=tmp_path, progress=False)
    assert one.info["components"]["params"]["sparse"] == {"min_chars": 1}
    assert five.info["components"]["params"]["sparse"] == {"min_chars": 5}
    assert five.config.index.hybrid_params()["sparse"] == "example-overlap(min_chars=5)"
    indexes = {p.name: read_index_file(p)[0]["config"].get("sparse") for p in tmp_path.rglob("index-*.npz")}
    assert sorted(indexes.values()) == ["example-overlap", "example-overlap(min_chars=5)"], indexes


def test_param_specs_read_the_constructor():
    class Widget(Component):
        name = "widget"

        def __init__(self, size: Annotated[int, Range(1, 9)] = 3, mode: Literal["a", "b"] = "a",
                     colour: Annotated[str, OneOf(("red", "blue"))] = "red", scale: float | None = None,
                     client: object = None):
            self.size, self.mode, self.colour, self.scale, self.client = size, mode, colour, scale, client

    specs = param_specs(Widget)
    assert list(specs) == ["size", "mode", "colour", "scale", "client"]
    assert specs["size"].default == 3 and specs["size"].constraints == (Range(1, 9),)
    assert not specs["client"].settable  # an object: never from a config file
    assert check_params(Widget, {"size": 9, "scale": 2}) == {"size": 9, "scale": 2.0}
    for bad, want in (({"size": 10}, "size = 10; expected an integer >= 1 and <= 9"),
                      ({"mode": "c"}, "mode = 'c'; expected one of a, b"),
                      ({"colour": "green"}, "colour = 'green'; expected one of red, blue"),
                      ({"size": True}, "size = True; expected an integer >= 1 and <= 9"),
                      ({"client": 1}, "unknown setting(s) 'client' for component; settings: size, mode, colour, "
                                      "scale")):
        with pytest.raises(ParamError) as e:
            check_params(Widget, bad)
        assert str(e.value) == want
    w = Widget(size=4)
    assert w.get_params() == {"size": 4, "mode": "a", "colour": "red", "scale": None, "client": None}
    twin = w.clone(mode="b")
    assert twin is not w and twin.get_params()["mode"] == "b" and twin.size == 4
    assert w.cache_id() == 'widget(4,a,red,null,null)'
    with pytest.raises(ParamError, match="no parameter sized"):
        w.clone(sized=1)


def test_existing_cache_ids_are_unchanged():
    """The extraction cache and embedding cache of every existing run stay valid (ids as before the lift)."""
    assert TurnsAndObservations().cache_id() == "turns(speaker-context)+observations"
    llm = LLMExtractor("openai/m", api_base="http://127.0.0.1:9/v1/", api_key="k", timeout=5)
    assert llm.cache_id().startswith("llm(openai/m,structured@") and \
        llm.cache_id().endswith(",http://127.0.0.1:9/v1)")  # key, timeout: not in it
    assert TfidfLSAEmbedder().fit(["a cat", "a dog sat"]).embedder_id.startswith(
        "tfidf-lsa(k=256,ng=2,sub=True,seed=0)@")
    assert FirstSentenceExtractor(sentences=3).cache_id() != FirstSentenceExtractor().cache_id()
    assert TopMemoryAnswerer(rank=2).clone().rank == 2


def test_model_embedder_spelling_is_read_in_one_place():
    assert parse_embedder_spec("litellm:text-embedding-3-small") == ("litellm", {"model": "text-embedding-3-small"})
    assert embedder_model("litellm", {"model": "m"}) == "m" and embedder_model("tfidf-lsa") is None
    cfg = ExperimentConfig.from_dict({"index": {"embedder": {"name": "litellm", "params": {"model": "e"}}}})
    assert role_model(cfg, "embedder") == "e" and cfg.role_in_use("embedder")
    assert role_model(ExperimentConfig.from_dict({"index": {"embedder": {"name": "litellm:e"}}}), "embedder") == "e"
    with pytest.raises(ConfigError, match=r"index.embedder.name = 'litellm'; .*needs the setting\(s\) model"):
        ExperimentConfig.from_dict({"index": {"embedder": {"name": "litellm"}}})
    with pytest.raises(ConfigError, match="give it once"):
        ExperimentConfig.from_dict({"index": {"embedder": {"name": "litellm:e", "params": {"model": "f"}}}})
    with pytest.raises(ConfigError, match=r"index.embedder.name = 'minilm:x'; allowed: tfidf-lsa, minilm, "
                                          r"litellm:<model>"):
        ExperimentConfig.from_dict({"index": {"embedder": {"name": "minilm:x"}}})
    emb = make_embedder("example-hashing", dim=16)
    assert emb.embed(["a cat sat"]).shape == (1, 16) and emb.embedder_id == "example-hashing(16)"


def test_keyword_settings_travel_as_one_spec():
    cfg = ExperimentConfig.from_dict({"index": {"keyword": {"name": "bm25", "params": {"k1": 2, "b": 0.5}}}})
    spec = cfg.index.hybrid_params()["keyword"]
    assert spec == "bm25(k1=2.0,b=0.5)" and parse_spec(spec) == ("bm25", {"k1": 2.0, "b": 0.5})
    scorer = make_keyword_scorer(spec)
    assert isinstance(scorer, BM25Scorer) and (scorer.k1, scorer.b) == (2.0, 0.5)
    assert ExperimentConfig().index.hybrid_params()["keyword"] == "tfidf"  # no settings: the name as before
    assert spec_text("x", {"s": "a,b"}) == 'x(s="a,b")' and parse_spec('x(s="a,b")') == ("x", {"s": "a,b"})
    with pytest.raises(ConfigError, match=r"index.keyword.params.b = 2; expected a number >= 0 and <= 1"):
        ExperimentConfig.from_dict({"index": {"keyword": {"name": "bm25", "params": {"b": 2}}}})


def test_inert_settings_are_read_from_the_arm_declarations():
    """`memlab.run.checks` reads what an arm declares (answer_settings, uses_retrieval, uses_preload), not arm names."""
    from memlab.answer import ANSWERERS, Answerer
    from memlab.run.checks import inert_knobs

    with ANSWERERS.scoped():
        @ANSWERERS.register("example-span-only")
        class SpanOnly(Answerer):
            answer_settings = ("model",)
            uses_preload = True

            def answer(self, question, ctx):
                raise NotImplementedError

        @ANSWERERS.register("example-no-search")
        class NoSearch(SpanOnly):
            uses_retrieval = False

        notes = inert_knobs(ExperimentConfig.from_dict({"answer": {"name": "example-span-only", "model": "m",
                                                                   "prompt": "original"},
                                                        "retrieval": {"preload": 2}}), warn=False)
        assert notes == ["answer.prompt is not read by the example-span-only arm (it reads: answer.model)"]
        notes = inert_knobs(ExperimentConfig.from_dict({"answer": {"name": "example-no-search"},
                                                        "retrieval": {"top_k": 5}}), recall_ks=(10,), warn=False)
        assert notes == ["the example-no-search arm does not search memory: retrieval settings do not change its "
                         "answers (set here: retrieval.top_k)"]


def test_a_setting_can_be_set_and_swept_by_its_dotted_name():
    cfg = ExperimentConfig.from_dict({"answer": {"name": "example-top-memory"}})
    assert cfg.with_overrides(["answer.params.rank=3"]).answer.params == {"rank": 3}
    with pytest.raises(ConfigError, match=r"answer\.params\.rank = 0; expected an integer >= 1"):
        cfg.with_overrides(["answer.params.rank=0"])
    with pytest.raises(ConfigError, match=r"unknown setting\(s\) 'rnak'"):
        cfg.with_overrides({"answer.params.rnak": 3})
    grid = ExperimentConfig.from_dict({"name": "g", "answer": {"name": "example-top-memory"},
                                       "grid": {"answer.params.rank": [1, 2]}}).expand()
    assert [c.answer.params for c in grid] == [{"rank": 1}, {"rank": 2}] and grid[1].name == "g-rank2"


def judged(path, srv, **judge) -> ExperimentConfig:
    """The example arms, judged by ``judge`` (a judge section) with the scripted server as the judge model."""
    return ExperimentConfig.from_dict({**EXAMPLES, "name": "judged", "dataset": {"path": str(path)},
                                       "judge": {"model": "openai/scripted", **judge},
                                       "models": {"api_base": srv.api_base, "max_retries": 0, "timeout": 5.0}})


@pytest.mark.parametrize("judge, message", [
    ({"name": "example-rating", "params": {"pass_mark": 11}},
     r"judge\.params\.pass_mark = 11; expected an integer >= 0 and <= 10"),
    ({"name": "example-rating", "params": {"pass": 1}},
     r"judge\.params: unknown setting\(s\) 'pass' for judge 'example-rating'; settings: pass_mark"),
    ({"params": {"profile": "longmemeval"}},  # decided by scoring.profile: never a judge setting
     r"judge\.params\.profile = 'longmemeval'; not a setting of judge 'llm': the run gives it from scoring\.profile"),
    ({"params": {"repeats": 3}}, r"judge\.params\.repeats = 3; set judge\.repeats instead"),
    ({"params": {"temperature": -1}}, r"judge\.params\.temperature = -1; set judge\.temperature instead"),
    ({"params": "strict"}, r"judge\.params = 'strict'; expected a mapping"),
])
def test_a_bad_judge_setting_is_a_config_error_naming_it(judge, message):
    with pytest.raises(ConfigError, match=message):
        ExperimentConfig.from_dict({"judge": {"model": "m", **judge}})


def test_judge_settings_are_listed_and_its_fields_are_its_settings():
    from memlab.run.components import describe_components

    text = describe_components()
    assert "judge.name (settings under judge.params;" in text
    assert "  example-rating: pass_mark = 5 (an integer >= 0 and <= 10)" in text
    assert ("  llm: prompt = null (a string (a prompt under memlab/prompts/judge/ or a prompt file) or null); "
            "repeats = 1 (an integer >= 1); temperature = null") in text
    assert "profile" not in text.split("judge.name", 1)[1].split("system.name")[0]  # the run decides it


def test_judge_settings_reach_the_judge_its_label_and_run_json(synthetic_path, tmp_path):
    """The judge model rates every answer 7: a pass mark of 5 makes each correct, of 8 each wrong. The second run's
    verdicts come from the response cache (the request does not carry the pass mark), yet J follows the setting;
    run.json names the judge with its settings (its cache id) and records them with defaults filled in."""
    from memlab.testing import Reply, ScriptedServer

    with ScriptedServer(responder=lambda body: Reply(text="7")) as srv:
        five = run_experiment(judged(synthetic_path, srv, name="example-rating"), results=tmp_path, progress=False)
        calls = len(srv.requests)
        eight = run_experiment(judged(synthetic_path, srv, name="example-rating", params={"pass_mark": 8}),
                               results=tmp_path, progress=False)
        assert len(srv.requests) == calls  # served from the response cache
        llm = run_experiment(judged(synthetic_path, srv, repeats=2, temperature=0.5), results=tmp_path,
                             progress=False)
        endpoint = f"openai/scripted@{srv.api_base.rstrip('/')}"
    assert five.predictions.j.eq(1.0).all() and eight.predictions.j.eq(0.0).all()
    assert five.info["components"]["params"]["judge"] == {"pass_mark": 5}
    assert eight.info["components"]["params"]["judge"] == {"pass_mark": 8}
    assert eight.info["components"]["judge"] == f"example-rating({endpoint},8)"
    assert five.info["components"]["judge"] == f"example-rating({endpoint},5)"
    # the llm judge: judge.repeats / judge.temperature are its settings repeats / temperature
    assert llm.info["components"]["params"]["judge"] == {"prompt": "default", "repeats": 2, "temperature": 0.5}
    assert llm.info["components"]["judge"] == f"llm({endpoint},locomo,default,2,0.5)"
