"""The offline reader reads the whole top-k: deeper memories can answer, so k changes predictions."""

from __future__ import annotations

from datetime import datetime

import pytest

from memlab.answer import AnswerContext, ExtractiveAnswerer
from memlab.answer.extractive import is_list_question
from memlab.data import Question, load_locomo
from memlab.memory import SearchOptions, UserKey
from memlab.memory.entry import MemoryEntry
from memlab.memory.search_types import SearchHit, SearchResult

KEY = UserKey("locomo", "syn-1")


class Ranked:
    """A service whose search returns fixed memories in a fixed order, cut at max_results."""

    def __init__(self, texts: list[tuple[str, datetime | None]]):
        self.entries = [MemoryEntry(id=f"m{i}", key=KEY, text=t, kind="episode", event_time=when,
                                    participants=("Bob",)) for i, (t, when) in enumerate(texts)]

    def search(self, key, opts: SearchOptions) -> SearchResult:
        hits = [SearchHit(entry=e, score=1.0 / (i + 1), rank=i + 1)
                for i, e in enumerate(self.entries[: opts.max_results])]
        return SearchResult(query=opts.query, options=opts, hits=hits)


def ask(svc, text, k, **kw):
    conv = load_locomo(ask.path)["syn-1"]
    ctx = AnswerContext(service=svc, key=KEY, conversation=conv, search=SearchOptions(max_results=k))
    reader = ExtractiveAnswerer(**{"abstain": False, "scorer": "weights", **kw})
    return reader.answer(Question("syn-1", 0, text, "x", None, (), (), 4, "x"), ctx)


@pytest.fixture(autouse=True)
def _path(synthetic_path):
    ask.path = synthetic_path


def test_a_deeper_memory_that_matches_much_better_wins_so_k_matters():
    svc = Ranked([("Bob: I like the weather today.", None),
                  ("Bob: Rex is fine.", None),
                  ("Bob: My blue guitar strings from Fender broke at the Boston jazz concert, so I bought Gibson.",
                   None)])
    q = "Which strings broke on the blue guitar at the Boston jazz concert?"
    top1 = ask(svc, q, k=1)
    assert "weather" in top1.prediction.lower() and "rank 1" in top1.rule
    deep = ask(svc, q, k=3)
    assert "Fender" in deep.prediction and "rank 3" in deep.rule
    assert ask(svc, q, k=3, rank_weight=50.0).prediction == top1.prediction  # a huge rank penalty: top-1 again


def test_list_question_joins_spans_of_several_memories():
    assert is_list_question("What activities does Melanie partake in?")
    assert not is_list_question("What kind of flooring is Jon looking for?")
    svc = Ranked([("Bob: My favourite activities are pottery.", None), ("Bob: Activities like camping too.", None),
                  ("Bob: I also love swimming activities.", None)])
    a = ask(svc, "What activities does Bob enjoy?", k=3)
    parts = [p.strip().lower() for p in a.prediction.split(",")]
    assert len(parts) == 3 and any("pottery" in p for p in parts) and any("camping" in p for p in parts)
    assert a.rule.startswith("span: list")
    assert "," not in ask(svc, "What activities does Bob enjoy?", k=3, list_spans=1).prediction


def test_temporal_prefers_a_dated_phrase_deeper_down():
    svc = Ranked([("Bob: The concert was fun.", datetime(2023, 6, 1)),
                  ("Bob: We went to the concert yesterday.", datetime(2023, 5, 8))])
    assert ask(svc, "When did Bob go to the concert?", k=1).prediction == "1 June 2023"
    a = ask(svc, "When did Bob go to the concert?", k=2)
    assert a.prediction == "7 May 2023" and a.rule == "temporal: 'yesterday' at rank 2"
