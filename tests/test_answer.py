"""The offline reader's rules and the relative-time resolver, on hand-built memories."""

from __future__ import annotations

from datetime import datetime

import pytest

from memlab.answer import ABSTAIN, AnswerContext, ExtractiveAnswerer
from memlab.answer.temporal import is_temporal_question, resolve
from memlab.data import load_locomo
from memlab.index import open_service
from memlab.memory import MemoryEntry, SearchOptions, UserKey

D = datetime(2023, 5, 8, 13, 56)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("I went to a support group yesterday", "7 May 2023"),
        ("We had a great night out last night", "7 May 2023"),
        ("My grandma passed away last week", "the week before 8 May 2023"),
        ("We tried scuba diving last Friday", "the Friday before 8 May 2023"),
        ("Last Fri I took a pottery class", "the Friday before 8 May 2023"),
        ("I painted that sunrise last year", "2022"),
        ("I started this job 3 years ago", "2020"),
        ("I ran a marathon two weeks ago", "24 April 2023"),
        ("So much happened last month", "April 2023"),  # not "the Monday before"
        ("Last Tues we met", "the Tuesday before 8 May 2023"),
        ("I'm going to Tokyo next month", "June 2023"),
        ("We went camping last weekend", "the weekend before 8 May 2023"),
        ("I adopted a dog", "8 May 2023"),  # no phrase: the memory's own date
    ],
)
def test_resolve_relative_time(text, expected):
    assert resolve(text, D)[0] == expected


def test_temporal_question_detection():
    assert is_temporal_question("When did Caroline go to the LGBTQ support group?")
    assert is_temporal_question("In which month did John score?") and is_temporal_question("What year did she move?")
    assert not is_temporal_question("What did Melanie paint?")


@pytest.fixture
def ctx(synthetic_path):
    data = load_locomo(synthetic_path)
    conv = data["syn-1"]
    svc = open_service("memory")
    key = UserKey("locomo", "syn-1")
    svc.add(key, "Alice: I went to a pottery class yesterday.", kind="episode", event_time=D, participants=["Alice"])
    svc.add(key, "Bob: Nice! I adopted a dog named Rex last week.", kind="episode", event_time=D,
            participants=["Bob"])
    svc.add(key, "Bob: Rex and I hiked Mount Tam on Sunday. It was great.", kind="episode",
            event_time=datetime(2023, 6, 19), participants=["Bob"])
    return AnswerContext(service=svc, key=key, conversation=conv, search=SearchOptions(max_results=3))


def q(text, data_q=None):
    from memlab.data import Question

    return Question("syn-1", 0, text, "x", None, (), (), 4, "single-hop")


def test_temporal_answer_from_memory_date(ctx):
    a = ExtractiveAnswerer(scorer="weights").answer(q("When did Alice go to a pottery class?"), ctx)
    assert a.prediction == "7 May 2023" and a.rule.startswith("temporal: 'yesterday'")


def test_abstains_when_named_person_is_not_the_speaker(ctx):
    a = ExtractiveAnswerer(scorer="weights").answer(q("What is the name of Alice's dog Rex adopted?"), ctx)
    assert a.prediction == ABSTAIN and "outscores Alice's best" in a.rule
    b = ExtractiveAnswerer(scorer="weights", abstain=False).answer(
        q("What is the name of Alice's dog Rex adopted?"), ctx)
    assert b.prediction != ABSTAIN


def test_an_observation_is_owned_by_the_person_it_is_about():
    # issue 21's observations-only arm never abstained on category 5 (conv-26: 0 of 47). Not an ownership fault:
    # each observation is owned by its one speaker, and the test abstains once the other person's matching
    # observation is in the context; the participant boost had left only the named person's observations there
    # (Their name in an observation also counts as a question term for them, which a turn's stripped "Name: "
    # does not: with Melanie's line at rank 3 the reader answers. Left as it is; see the issue 21 report.)
    key = UserKey("locomo", "c")
    car = [MemoryEntry(id=str(i), key=key, text=t, participants=("Caroline",), source_ids=(f"D1:{i}",))
           for i, t in ((1, "Caroline expresses appreciation for her friendship with Melanie."),
                        (2, "Caroline loves horses."))]
    mel = MemoryEntry(id="3", key=key, text="Melanie realized after her charity race that self-care is important.",
                      participants=("Melanie",), source_ids=("D2:3",))
    reader, question = ExtractiveAnswerer(scorer="weights"), "What did Caroline realize after her charity race?"
    r = reader.read(question, [(1, mel), (2, car[0]), (3, car[1])], ["Caroline", "Melanie"])
    assert {c.owners for c in r.candidates} == {frozenset({"Caroline"}), frozenset({"Melanie"})}
    pred, rule, _ = reader.choose(r)
    assert pred == ABSTAIN and "rank 1, Melanie's" in rule
    pred, _, _ = reader.choose(reader.read(question, [(1, car[0]), (2, car[1])], ["Caroline", "Melanie"]))
    assert pred != ABSTAIN  # a context of the named person's memories alone cannot show the premise is wrong


def test_span_keeps_the_new_words_of_the_best_sentence(ctx):
    a = ExtractiveAnswerer(scorer="weights").answer(q("Where did Bob and Rex hike on Sunday?"), ctx)
    assert a.prediction == "Mount Tam" and a.rule.startswith("span")  # "hiked" stems to the question's "hike"
    top = ExtractiveAnswerer(span="memory", abstain=False).answer(q("Where did Bob and Rex hike on Sunday?"), ctx)
    assert top.prediction == "Rex and I hiked Mount Tam on Sunday. It was great."
    assert a.context_tokens > 0 and len(a.queries) == 1 and a.queries[0].hits


def test_nothing_retrieved_abstains(synthetic_path):
    data = load_locomo(synthetic_path)
    c = AnswerContext(service=open_service("memory"), key=UserKey("locomo", "none"), conversation=data["syn-1"],
                      search=SearchOptions())
    a = ExtractiveAnswerer().answer(q("What did Bob adopt?"), c)
    assert a.prediction == ABSTAIN and a.rule == "abstain: no memory retrieved"
