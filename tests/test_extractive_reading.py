"""The offline reader reasons over the context it was given, records what it read, and owns its answer
by speaker: a quoted neighbour turn belongs to the person quoted, not to the one replying."""

from __future__ import annotations

import importlib.util
import sys
from datetime import datetime
from pathlib import Path

import pytest

from memlab.answer import AnswerContext, ExtractiveAnswerer
from memlab.answer.base import ABSTAIN
from memlab.answer.extractive import FEATURES, segments
from memlab.answer.reader_weights import WEIGHTS
from memlab.data import Question, load_locomo
from memlab.memory import SearchOptions, UserKey
from memlab.memory.entry import MemoryEntry
from memlab.memory.search_types import SearchHit, SearchResult
from memlab.run import ExperimentConfig
from memlab.run.config import ConfigError
from memlab.trace import format_reading

KEY = UserKey("locomo", "syn-1")
#: Weights pinned for these tests (the shipped ones are refit by benchmarks/fit_reader.py).
PINNED = dict(scorer="weights", rank_weight=1.0, memory_weight=0.0,
              agreement_weight=0.0, speaker_weight=1.0, date_weight=0.0,
              length_weight=0.0, phrase_bonus=4.0, temporal_rank_weight=1.0, abstain_margin=0.5)


def mem(i: int, text: str, who: str, when: datetime | None = None) -> MemoryEntry:
    return MemoryEntry(id=f"m{i}", key=KEY, text=text, kind="episode", event_time=when, participants=(who,))


class Counting:
    """A service with a fixed ranking that counts the searches made against it."""

    def __init__(self, entries: list[MemoryEntry]):
        self.entries = entries
        self.searches: list[SearchOptions] = []

    def search(self, key, opts: SearchOptions) -> SearchResult:
        self.searches.append(opts)
        hits = [SearchHit(entry=e, score=1.0 / (i + 1), rank=i + 1)
                for i, e in enumerate(self.entries[: opts.max_results])]
        return SearchResult(query=opts.query, options=opts, hits=hits)


def ask(path, svc, text, category=4, **kw):
    conv = load_locomo(path)["syn-1"]  # speakers Alice and Bob
    ctx = AnswerContext(service=svc, key=KEY, conversation=conv,
                        search=SearchOptions(max_results=10, participant_boost=True))
    return ExtractiveAnswerer(**(PINNED | kw)).answer(Question("syn-1", 0, text, "x", None, (), (), category, "x"), ctx)


def test_a_reply_turn_quoting_the_other_person_is_theirs_so_the_wrong_person_question_abstains(synthetic_path):
    # LoCoMo's adversarial form: the race was Alice's; Bob only replied to it. The old reader passed this
    # (Bob's reply turn is Bob's memory) and answered from Alice's words.
    svc = Counting([mem(0, "Bob: That charity race sounds great, Alice! (replying to Alice: I ran a charity race "
                           "for mental health and realized self-care matters.)", "Bob")])
    assert segments(svc.entries[0])[1][1] == frozenset({"Alice"})
    a = ask(synthetic_path, svc, "What did Bob realize after his charity race?", category=5)
    assert a.prediction == ABSTAIN and "outscores Bob's best" in a.rule
    assert a.reading["abstain_test"]["best_owned"] is not None
    # asked about the right person, the quoted words answer
    b = ask(synthetic_path, svc, "What did Alice realize after her charity race?")
    assert b.prediction != ABSTAIN and "self-care" in b.prediction


def test_the_named_persons_answer_below_rank_1_is_read_not_abstained(synthetic_path):
    # The old speaker-ownership test abstained whenever the top memory was not the named person's, although
    # the answer sat at rank 2 (7 of 15 abstain-errors in a hand check were of this kind).
    svc = Counting([mem(0, "Alice: Bob loves the guitar concerts in town.", "Alice"),
                    mem(1, "Bob: I play the guitar with a Fender amplifier every weekend.", "Bob")])
    a = ask(synthetic_path, svc, "What guitar amplifier does Bob play with?")
    assert a.prediction != ABSTAIN and "Fender" in a.prediction and "rank 2" in a.rule


def test_the_reader_searches_once_and_records_what_it_read(synthetic_path):
    svc = Counting([mem(0, "Bob: I adopted a dog named Rex.", "Bob"), mem(1, "Alice: I love pottery.", "Alice")])
    a = ask(synthetic_path, svc, "What is the name of Alice's dog?", category=5)
    assert len(svc.searches) == 1  # no hidden second search (the old abstain test searched again unboosted)
    assert svc.searches[0].participant_boost
    r = a.reading
    assert r["people"] == ["Alice"] and r["candidates_read"] >= 2 and "abstain_test" in r
    assert {c["rank"] for c in r["top_candidates"]} == {1, 2}
    assert "overlap" in r["top_candidates"][0]["features"] and set(r["top_candidates"][0]["features"]) <= set(FEATURES)
    shown = "\n".join(format_reading(r))
    assert "abstain test" in shown and "Bob" in shown and "Rex" in shown
    assert format_reading(None) == [] and format_reading(float("nan")) == []


def test_weights_are_constructor_parameters_with_the_fitted_defaults():
    r = ExtractiveAnswerer()
    assert r.weights == {k: float(v) for k, v in WEIGHTS.items()}
    assert ExtractiveAnswerer(rank_weight=7.0).rank_weight == 7.0
    with pytest.raises(ValueError, match="rank_weight = -1.0; expected a number >= 0"):
        ExtractiveAnswerer(rank_weight=-1.0)
    with pytest.raises(ValueError, match="abstain_margin = nan; expected a number"):
        ExtractiveAnswerer(abstain_margin=float("nan"))
    cfg = ExperimentConfig.from_dict({"answer": {"params": {"abstain_margin": 2.5}}})
    built = ExtractiveAnswerer.from_config(cfg.answer, lambda role: None)
    assert built.abstain_margin == 2.5 and built.rank_weight == WEIGHTS["rank_weight"]


def test_old_run_configs_with_speaker_window_still_load_but_a_set_window_is_an_error():
    assert ExperimentConfig.from_dict({"answer": {"speaker_window": 1}}).answer.params == {}
    with pytest.raises(ConfigError, match="speaker_window was removed.*abstain_margin"):
        ExperimentConfig.from_dict({"answer": {"speaker_window": 3}})


def _fit_module():
    spec = importlib.util.spec_from_file_location("fit_reader", Path(__file__).parents[1] / "benchmarks" /
                                                  "fit_reader.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["fit_reader"] = mod  # its dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(mod)
    return mod


def test_the_fit_scripts_vectorised_choice_is_the_readers():
    fit = _fit_module()
    d = datetime(2023, 5, 8)
    ctx = [mem(0, "Alice: Bob loves the guitar concerts in town.", "Alice", d),
           mem(1, "Bob: I play the guitar with a Fender amplifier every weekend.", "Bob", d),
           mem(2, "Bob: We went to the concert yesterday. It was loud.", "Bob", d),
           mem(3, "Alice: Activities like pottery and camping, and swimming too.", "Alice", d)]
    questions = [("What guitar amplifier does Bob play with?", 4), ("When did Bob go to the concert?", 2),
                 ("What activities do they enjoy?", 1), ("What amplifier does Alice play with?", 5)]
    store = [{"qid": f"q{i}", "conversation_id": "syn-1", "category": c, "question": q, "answer": "Fender",
              "speakers": ("Alice", "Bob"),
              "contexts": {k: [(j + 1, e) for j, e in enumerate(ctx[:k])] for k in (2, 4)}}
             for i, (q, c) in enumerate(questions)]
    table = fit.read_all(store, [2, 4], ExtractiveAnswerer(scorer="weights"))
    kinds = set()
    for w in (PINNED, dict(PINNED, abstain_margin=-1.0, length_weight=1.0), dict(WEIGHTS)):
        f1, preds = fit.predict(table, w, fit.np.arange(len(table.start)), store, 3, {})
        reader = ExtractiveAnswerer(**{"scorer": "weights", **w})
        kinds |= {kind for kind, _ in preds}
        for g, (kind, answer) in enumerate(preds):
            q = store[table.qi[g]]
            expect, _, _ = reader.choose(reader.read(q["question"], q["contexts"][int(table.k[g])], q["speakers"]))
            assert answer == expect, (q["question"], w, kind)
    assert kinds >= {"span", "list", "abstain"}  # every path of choose was compared


def test_fit_script_captures_contexts_per_k_and_fits_on_them(synthetic_path, tmp_path):
    fit = _fit_module()
    store = fit.capture([1, 3], tmp_path, {"dataset.path": str(synthetic_path)})
    assert store and all(len(q["contexts"][1]) <= 1 and len(q["contexts"][3]) <= 3 for q in store)
    assert all([r for r, _ in q["contexts"][3]] == list(range(1, len(q["contexts"][3]) + 1)) for q in store)
    assert len(list(tmp_path.glob("contexts-k1-3-*.pkl"))) == 1  # retrieved once, cached for the next fit
    again = fit.capture([1, 3], tmp_path, {"dataset.path": str(synthetic_path)})
    assert [q["qid"] for q in again] == [q["qid"] for q in store]
    table = fit.read_all(store, [1, 3], ExtractiveAnswerer(scorer="weights"))
    groups = fit.np.arange(len(table.start))
    w, best = fit.fit(table, groups, store, dict(WEIGHTS), 3)
    assert set(w) == set(WEIGHTS) and best >= fit.predict(table, dict(WEIGHTS), groups, store, 3, {})[0].mean()


def test_a_reader_weight_set_for_a_model_arm_is_said_to_do_nothing():
    from memlab.run.checks import inert_knobs
    from memlab.run.config_migrate import MovedKey

    with pytest.raises(ConfigError, match="unknown setting.*'rank_weight' for answer arm 'original'"):
        ExperimentConfig.from_dict({"answer": {"name": "original", "model": "m", "params": {"rank_weight": 2.0}}})
    with pytest.warns(MovedKey, match="answer.rank_weight = 2.0 dropped: answer arm 'original' does not take it"):
        ExperimentConfig.from_dict({"answer": {"name": "original", "model": "m", "rank_weight": 2.0}})
    assert not inert_knobs(ExperimentConfig.from_dict({"answer": {"params": {"scorer": "weights",
                                                                             "rank_weight": 2.0}}}), warn=False)
    learned = inert_knobs(ExperimentConfig.from_dict({"answer": {"params": {"scorer": "learned",
                                                                            "rank_weight": 2.0}}}), warn=False)
    assert any("answer.params.rank_weight is not read by the learned scorer" in n for n in learned)
