"""The learned reader: its forests are exactly scikit-learn's, its decisions are the fit script's, and it
composes and abstains by the rules its model file declares."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest

from memlab.answer import ExtractiveAnswerer
from memlab.answer.base import ABSTAIN
from memlab.answer.learned import FAMILIES, FamilyModel, Forest, Scored, compose, decide, family_model, load_models
from memlab.answer.reading_features import FEATURE_NAMES, QTYPE_NAMES, question_type
from memlab.memory import UserKey
from memlab.memory.entry import MemoryEntry

KEY = UserKey("locomo", "syn-1")
D = datetime(2023, 5, 8)


def mem(i: int, text: str, who: str, when: datetime | None = D) -> MemoryEntry:
    return MemoryEntry(id=f"m{i}", key=KEY, text=text, kind="episode", event_time=when, participants=(who,))


def _learning():
    here = Path(__file__).parents[1] / "benchmarks"
    sys.path.insert(0, str(here))
    try:
        spec = importlib.util.spec_from_file_location("reader_learning", here / "reader_learning.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["reader_learning"] = mod
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(here))


def test_an_exported_forest_predicts_what_scikit_learn_predicts_missing_values_included():
    rl = _learning()
    rng = np.random.default_rng(3)
    X = rng.normal(size=(600, 5))
    X[rng.random(X.shape) < 0.1] = np.nan
    y = np.nan_to_num(X[:, 0]) * 2 + (np.nan_to_num(X[:, 1]) > 0) + rng.normal(scale=0.1, size=600)
    forest, spec, est = rl.fit_forest(X, y, [f"x{i}" for i in range(5)])
    again = Forest(json.loads(json.dumps(spec)))  # through JSON, as the shipped file
    assert np.allclose(again.predict(X), est.predict(X), atol=1e-9)
    full = np.nan_to_num(X)  # rows without a missing value take the walk that skips the missing-value test
    assert np.allclose(again.predict(full), est.predict(full), atol=1e-9)


def test_the_shipped_model_holds_fitted_families_with_their_held_out_figures():
    data = load_models()
    assert data["families"] and set(data["families"]) <= set(FAMILIES)
    for name, spec in data["families"].items():
        fit = spec["fit"]
        assert fit["command"].startswith("python benchmarks/fit_reader.py --learned " + name)
        assert all("overall 1-4" in fit["held_out"][str(k)] for k in fit["ks"])
        assert isinstance(family_model(name), FamilyModel)
    with pytest.raises(ValueError, match="reader_family: expected one of .* got 'nope'"):
        family_model("nope")
    with pytest.raises(ValueError, match="reader_family.*expected one of"):  # the declared parameter's check
        ExtractiveAnswerer(scorer="learned", reader_family="nope")
    missing = [f for f in FAMILIES if f not in data["families"]]
    if missing:  # a declared family the model file does not hold is an error naming the file's families
        with pytest.raises(ValueError, match=f"reader_family: expected one of .*got '{missing[0]}'"):
            ExtractiveAnswerer(scorer="learned", reader_family=missing[0])


def _constant(value: float, extra: list[str] | None = None) -> Forest:
    return Forest({"base": value, "features": list(FEATURE_NAMES) + (extra or []), "trees": []})


def _model(**kw) -> FamilyModel:
    names = tuple(f"q_{n}" for n in QTYPE_NAMES) + ("best", "best_owned", "gap", "owned_none", "owned_share",
                                                     "q_people")
    base = dict(sentence=_constant(0.1), span=_constant(0.2, ["parent"]), top=2, longest=3, compose_max=1,
                compose_ratio=0.0, compose_types=(), abstain_coef=np.zeros(len(names)), abstain_intercept=0.0,
                abstain_threshold=1.01, abstain_names=names)
    return FamilyModel(**(base | kw))


def test_composition_joins_the_best_spans_of_different_memories_above_the_ratio():
    reader = ExtractiveAnswerer(scorer="weights")
    hits = [(1, mem(0, "Bob: I love pottery.", "Bob")), (2, mem(1, "Bob: Camping with the kids.", "Bob")),
            (3, mem(2, "Bob: Swimming in the lake.", "Bob"))]
    r = reader.read("What activities does Bob enjoy?", hits, ("Alice", "Bob"))
    assert r.list_question
    spans = [Scored(c.answer, "novel", i, np.zeros(1), score) for i, (c, score) in
             enumerate(zip(r.candidates, (0.9, 0.6, 0.2)))]
    order = np.array([0, 1, 2])
    assert compose(spans, order, r, _model(compose_max=3, compose_ratio=0.5))[0] == "love pottery, Camping kids"
    assert compose(spans, order, r, _model(compose_max=3, compose_ratio=0.1))[1] == [0, 1, 2]
    assert compose(spans, order, r, _model(compose_max=1))[0] == "love pottery"
    # a question type the family composes (not a list question) composes too
    r2 = reader.read("What does Bob enjoy?", hits, ("Alice", "Bob"))
    assert not r2.list_question and question_type(r2.question) == "what"
    assert "," not in compose(spans, order, r2, _model(compose_max=3, compose_ratio=0.1))[0]
    assert "," in compose(spans, order, r2, _model(compose_max=3, compose_ratio=0.1, compose_types=("what",)))[0]


def test_the_abstain_rule_reads_who_owns_the_best_span():
    reader = ExtractiveAnswerer(scorer="weights")
    hits = [(1, mem(0, "Bob: I adopted a dog named Rex.", "Bob"))]
    r = reader.read("What is the name of Alice's dog?", hits, ("Alice", "Bob"))
    m = _model()
    owned_none = m.abstain_names.index("owned_none")
    coef = np.zeros(len(m.abstain_names))
    coef[owned_none] = 4.0
    d = decide(r, 10, _model(abstain_coef=coef, abstain_intercept=-2.0, abstain_threshold=0.5))
    assert d["abstain_p"] > 0.5  # Alice owns no span: p = sigmoid(4 - 2)
    info: dict = {}
    from memlab.answer.learned import choose_learned

    pred, rule, info = choose_learned(r, 10, _model(abstain_coef=coef, abstain_intercept=-2.0,
                                                     abstain_threshold=0.5), True, info)
    assert pred == ABSTAIN and rule.startswith("abstain: learned rule p=0.88")
    r_bob = reader.read("What is the name of Bob's dog?", hits, ("Alice", "Bob"))
    pred, rule, _ = choose_learned(r_bob, 10, _model(abstain_coef=coef, abstain_intercept=-2.0,
                                                      abstain_threshold=0.5), True, {})
    assert pred != ABSTAIN and rule.startswith("learned:")


def test_the_fit_scripts_held_out_answers_are_the_readers_answers():
    rl = _learning()
    ctx = [mem(0, "Alice: Bob loves the guitar concerts in town.", "Alice"),
           mem(1, "Bob: I play the guitar with a Fender amplifier every weekend.", "Bob"),
           mem(2, "Bob: We went to the concert yesterday. It was loud.", "Bob"),
           mem(3, "Alice: Activities like pottery and camping, and swimming too.", "Alice")]
    questions = [("What guitar amplifier does Bob play with?", 4, "Fender"), ("When did Bob go to the concert?", 2,
                 "7 May 2023"), ("What activities does Alice enjoy?", 1, "pottery, camping, swimming"),
                 ("What amplifier does Alice play with?", 5, "Fender"), ("Does Bob play the guitar?", 1, "Yes"),
                 ("Does Bob play the drums or the guitar?", 3, "guitar")] * 3
    store = [{"qid": f"q{i}", "conversation_id": f"c{i % 3}", "category": c, "question": q, "answer": a,
              "speakers": ("Alice", "Bob"),
              "contexts": {k: [(j + 1, e) for j, e in enumerate(ctx[:k])] for k in (2, 4)}}
             for i, (q, c, a) in enumerate(questions)]
    reader = ExtractiveAnswerer(scorer="weights")
    groups = rl.read_groups(store, [2, 4], reader)
    rl.FOREST["min_samples_leaf"], saved = 2, rl.FOREST["min_samples_leaf"]
    try:
        m, spec = rl.fit_family(groups, store, np.arange(len(groups)))
    finally:
        rl.FOREST["min_samples_leaf"] = saved
    got = rl.predict_family(groups, store, np.arange(len(groups)), m)
    again = FamilyModel(**{**m.__dict__, "sentence": Forest(json.loads(json.dumps(spec["sentence"]))),
                           "span": Forest(json.loads(json.dumps(spec["span"])))})
    from memlab.answer.learned import choose_learned

    for g, (kind, answer, _) in zip(groups, got):
        q = store[g.qi]
        r = reader.read(q["question"], q["contexts"][g.k], q["speakers"])
        expect = choose_learned(r, g.k, again, True, {})[0] if r.candidates else r.top_memory
        assert answer == expect, (q["question"], g.k, kind)
        typed = {"Does Bob play the guitar?": "Yes", "Does Bob play the drums or the guitar?": "guitar"}
        assert (kind == "typed") == (typed.get(q["question"]) == answer), (q, kind, answer)
    assert np.mean([f for _, _, f in got]) > 0.5  # it learned the synthetic answers
    assert spec["yes_no"] == {"answer": "Yes", "n": 3, "mean_f1": {"Yes": 1.0, "No": 0.0, "Likely yes": 0.6667,
                                                                  "Likely no": 0.0}}


def test_the_multi_part_gate_decides_which_questions_are_composed():
    reader = ExtractiveAnswerer(scorer="weights")
    hits = [(1, mem(0, "Bob: I love pottery.", "Bob")), (2, mem(1, "Bob: Camping with the kids.", "Bob"))]
    spans_of = lambda r: [Scored(c.answer, "novel", i, np.zeros(1), s)  # noqa: E731
                          for i, (c, s) in enumerate(zip(r.candidates, (0.9, 0.8)))]
    gate = {"vocab": {"hobbies": 3.0}, "intercept": -1.0, "threshold": 0.5}
    m = _model(compose_max=3, compose_ratio=0.5, multi=gate)
    asks = reader.read("What hobbies does Bob have?", hits, ("Alice", "Bob"))
    plain = reader.read("What does Bob love?", hits, ("Alice", "Bob"))
    assert "," in compose(spans_of(asks), np.array([0, 1]), asks, m)[0]  # p = sigmoid(3 - 1) > .5
    assert "," not in compose(spans_of(plain), np.array([0, 1]), plain, m)[0]  # p = sigmoid(-1) < .5


class _Ranked:
    """A service with fixed memories in a fixed order, cut at max_results."""

    def __init__(self, entries: list[MemoryEntry]):
        self.entries = entries

    def search(self, key, opts):
        from memlab.memory.search_types import SearchHit, SearchResult

        hits = [SearchHit(entry=e, score=1.0 / (i + 1), rank=i + 1)
                for i, e in enumerate(self.entries[: opts.max_results])]
        return SearchResult(query=opts.query, options=opts, hits=hits)

    def list(self, key) -> list[MemoryEntry]:
        return list(self.entries)


def test_the_shipped_learned_reader_reads_deeper_memories_and_abstains_on_the_wrong_person(synthetic_path):
    from memlab.answer import AnswerContext
    from memlab.data import Question, load_locomo
    from memlab.memory import SearchOptions
    from memlab.trace import format_reading

    conv = load_locomo(synthetic_path)["syn-1"]

    def ask(entries, text, k, category=4):
        ctx = AnswerContext(service=_Ranked(entries), key=KEY, conversation=conv, search=SearchOptions(max_results=k))
        return ExtractiveAnswerer(scorer="learned").answer(Question("syn-1", 0, text, "x", None, (), (), category, "x"),
                                                           ctx)

    deep = [mem(0, "Bob: I like the weather today.", "Bob", None), mem(1, "Bob: Rex is fine.", "Bob", None),
            mem(2, "Bob: My blue guitar strings from Fender broke at the Boston jazz concert, so I bought Gibson.",
                "Bob", None)]
    q = "Which strings broke on the blue guitar at the Boston jazz concert?"
    assert "weather" in ask(deep, q, 1).prediction
    a = ask(deep, q, 3)
    assert "Fender" in a.prediction and a.rule.startswith("learned:") and "rank 3" in a.rule
    dated = [mem(0, "Bob: The concert was fun.", "Bob", datetime(2023, 6, 1)),
             mem(1, "Bob: We went to the concert yesterday.", "Bob", D)]
    assert ask(dated, "When did Bob go to the concert?", 2).prediction == "7 May 2023"
    wrong = ask([mem(0, "Bob: I adopted a dog named Rex.", "Bob"), mem(1, "Alice: I love pottery.", "Alice")],
                "What is the name of Alice's dog?", 2, category=5)
    assert wrong.prediction == ABSTAIN and wrong.rule.startswith("abstain: learned rule")
    assert "learned abstain rule" in "\n".join(format_reading(wrong.reading))


@pytest.mark.parametrize("config,family", [("offline", "offline"), ("retrieval-best", "retrieval-best")])
def test_answer_scorer_learned_reads_with_its_configs_own_family(config, family, synthetic_path):
    """``answer.params.scorer: learned`` on a shipped config builds the reader of its own family, which answers."""
    from memlab.answer import AnswerContext
    from memlab.data import Question, load_locomo
    from memlab.memory import SearchOptions
    from memlab.run import ExperimentConfig

    cfg = ExperimentConfig.from_yaml(config).with_overrides({"answer.params.scorer": "learned"})
    reader = ExtractiveAnswerer.from_config(cfg.answer, lambda role: None)
    assert reader.scorer == "learned" and reader.reader_family == family and reader.model is family_model(family)
    conv = load_locomo(synthetic_path)["syn-1"]
    hits = [mem(0, "Bob: We went to the concert yesterday.", "Bob"), mem(1, "Bob: I play a Fender guitar.", "Bob")]
    ctx = AnswerContext(service=_Ranked(hits), key=KEY, conversation=conv, search=SearchOptions(max_results=2))
    a = reader.answer(Question("syn-1", 0, "When did Bob go to the concert?", "x", None, (), (), 2, "x"), ctx)
    assert a.prediction == "7 May 2023" and a.rule.startswith("learned:")
    shipped = ExtractiveAnswerer.from_config(ExperimentConfig.from_yaml(config).answer, lambda role: None)
    # the default stays the hand weights on both (retrieval-best's learned family is opt-in, with context_citing)
    assert shipped.scorer == "weights" and shipped.model is None and not shipped.context_citing


_ROWS_SCRIPT = """
import json
from memlab.answer.extractive import ExtractiveAnswerer
from memlab.answer.learned import sentence_rows
from memlab.answer.reading_features import INDEX
from memlab.memory.entry import MemoryEntry, UserKey
K = UserKey("locomo", "syn-1")
texts = ["Alice: I researched adoption agencies and counseling options.", "Alice: Support groups and painting classes.",
         "Bob: Counseling, painting, adoption, agencies, research, groups, classes and support all week.",
         "Alice: Painting classes helped.", "Bob: Agencies called back about adoption."]
hits = [(i + 1, MemoryEntry(id=f"m{i}", key=K, text=t, kind="episode", participants=(t.split(":")[0],)))
        for i, t in enumerate(texts)]
q = "What did Alice research about adoption agencies, counseling, support groups and painting classes?"
r = ExtractiveAnswerer(scorer="weights").read(q, hits, ("Alice", "Bob"))
print(json.dumps([float(s.row[INDEX["idf_overlap"]]).hex() for s in sentence_rows(r, 5)]))
"""


def test_the_learned_readers_features_do_not_depend_on_the_hash_seed():
    """A set's iteration order follows PYTHONHASHSEED; a float sum in that order differed in the last bit from
    process to process, enough to flip a forest split (one retrieval-best answer changed run to run)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    # with the plain sum, seeds 0-5 gave three different rows ({0}, {1, 2, 3}, {4, 5}): one seed of each
    outs = {subprocess.run([sys.executable, "-c", _ROWS_SCRIPT], env={**env, "PYTHONHASHSEED": str(seed)},
                           capture_output=True, text=True, check=True, timeout=120).stdout for seed in (0, 1, 4)}
    assert len(outs) == 1, outs


def test_a_yes_no_question_gets_the_fits_answer_and_keeps_its_support():
    from memlab.answer.learned import choose_learned, family_from_spec
    from memlab.answer.typed_answers import yes_no_question

    assert yes_no_question("Would Caroline likely have Dr. Seuss books on her bookshelf?")
    assert yes_no_question("Did Jon and Gina both participate in dance competitions?")
    assert not yes_no_question("Does John live close to a beach or the mountains?")  # a choice names its answers
    assert not yes_no_question("What does Bob play?") and not yes_no_question("How many dogs does Bob have?")
    reader = ExtractiveAnswerer(scorer="weights")
    hits = [(1, mem(0, "Alice: Nice weather.", "Alice")), (2, mem(1, "Bob: I play the guitar every weekend.", "Bob"))]
    r = reader.read("Does Bob play the guitar?", hits, ("Alice", "Bob"))
    pred, rule, info = choose_learned(r, 2, _model(yes_no="Likely yes"), True, {})
    assert pred == "Likely yes" and "yes/no question" in rule and info["support"] in (1, 2)
    assert choose_learned(r, 2, _model(), True, {})[0] not in ("Yes", "Likely yes")  # fit without it: a span
    # the model file's field, absent in a family fit before it
    spec = json.loads(json.dumps(load_models()["families"]["offline"]))
    assert family_from_spec({**spec, "yes_no": {"answer": "No"}}).yes_no == "No"
    assert family_from_spec({k: v for k, v in spec.items() if k != "yes_no"}).yes_no is None


def test_a_choice_question_gets_the_option_its_context_supports():
    from memlab.answer.learned import choose_learned
    from memlab.answer.typed_answers import choice_options

    assert choice_options("Does John live close to a beach or the mountains?") == ("a beach", "the mountains")
    assert choice_options("Which pet did Jolene adopt first - Susie or Seraphim?") == ("Susie", "Seraphim")
    assert choice_options("Would Tim enjoy reading books by C. S. Lewis or John Greene?") == ("C. S. Lewis",
                                                                                              "John Greene")
    assert choice_options("Would Melanie be more interested in going to a national park or a theme park?") == (
        "a national park", "a theme park")
    assert choice_options("Was September a good month for Nate? Answer yes or no.") is None  # a yes/no question
    assert choice_options("What kind of classes or groups has Audrey joined to take care of her dogs?") is None
    assert choice_options("Does John like hiking?") is None
    reader = ExtractiveAnswerer(scorer="weights")
    hits = [(1, mem(0, "Alice: The mountains are my favourite place.", "Alice")),
            (2, mem(1, "Bob: Our house is a short walk from the beach, I swim every morning.", "Bob")),
            (3, mem(2, "Bob: We watched the sunset at the beach again.", "Bob"))]
    r = reader.read("Does Bob live close to a beach or the mountains?", hits, ("Alice", "Bob"))
    pred, rule, info = choose_learned(r, 3, _model(choice=True), True, {})
    # the mountains line is Alice's: only the sentences of the person asked about count
    assert pred == "beach" and "choice question" in rule and info["options"] == ["a beach", "the mountains"]
    assert info["option_support"][0] > 0 and info["option_support"][1] == 0
    assert choose_learned(r, 3, _model(), True, {})[0] != "beach"  # a family fit without it: a span
