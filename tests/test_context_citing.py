"""``answer.params.context_citing``: the reader of a turn-unit search also reads the notes (LoCoMo's observations)
citing each retrieved turn, at that turn's rank; what was retrieved stays the same, the context (and its token
count) grows by exactly those notes."""

from __future__ import annotations

from datetime import datetime

import pytest

from memlab.answer import AnswerContext, ExtractiveAnswerer
from memlab.answer.base import with_citing
from memlab.data import Question, load_locomo
from memlab.llm import count_tokens
from memlab.memory import SearchOptions, UserKey
from memlab.memory.entry import MemoryEntry
from memlab.memory.search_types import SearchHit, SearchResult
from memlab.params import ParamError
from memlab.run import ExperimentConfig
from memlab.run.config import ConfigError

KEY = UserKey("locomo", "syn-1")
WHEN = datetime(2023, 5, 8)
PINNED = dict(scorer="weights", rank_weight=1.0, memory_weight=0.0, agreement_weight=0.0, speaker_weight=1.0,
              date_weight=0.0, length_weight=0.0, phrase_bonus=4.0, temporal_rank_weight=1.0, abstain_margin=0.5)


def turn(i: int, who: str, text: str) -> MemoryEntry:
    return MemoryEntry(id=f"t{i}", key=KEY, text=f"{who}: {text}", kind="episode", event_time=WHEN,
                       participants=(who,), source_ids=(f"D1:{i}",))


def note(i: int, who: str, text: str, *cites: int) -> MemoryEntry:
    return MemoryEntry(id=f"o{i}", key=KEY, text=text, kind="fact", event_time=WHEN, participants=(who,),
                       source_ids=tuple(f"D1:{c}" for c in cites))


T1 = turn(1, "Alice", "I finally did it yesterday, so exciting!")
T2 = turn(2, "Bob", "Nice weather today.")
T3 = turn(3, "Bob", "Good luck with that.")
O1 = note(1, "Alice", "Alice researched adoption agencies.", 1)
O2 = note(2, "Alice", "Alice and Bob talked about the next step.", 1, 3)  # cites two retrieved turns
O3 = note(3, "Bob", "Bob visited Paris.", 9)  # cites a turn that was not retrieved
O4 = note(4, "Bob", "Bob wished Alice luck.", 3)
ALL = [T1, T2, T3, O1, O2, O3, O4]


def test_each_retrieved_turn_is_followed_by_exactly_its_citing_notes_at_its_rank_each_note_once():
    hits = [(1, T1), (2, T2), (3, T3)]
    got = with_citing(hits, ALL)
    assert [(r, e.id) for r, e in got] == [(1, "t1"), (1, "o1"), (1, "o2"), (2, "t2"), (3, "t3"), (3, "o4")]
    # T2 is cited by nothing; O2 cites T1 and T3 and comes once, after the first; O3's turn was not retrieved
    assert with_citing([(1, T2)], ALL) == [(1, T2)]
    assert [e.id for _, e in with_citing([(1, T3), (2, T1)], ALL)] == ["t3", "o2", "o4", "t1", "o1"]


def test_a_note_already_retrieved_is_not_read_twice_and_no_notes_leaves_the_hits_as_they_are():
    got = with_citing([(1, T1), (2, O1)], ALL)
    assert [(r, e.id) for r, e in got] == [(1, "t1"), (1, "o2"), (2, "o1")]
    assert with_citing([(1, T1), (2, T3)], [T1, T2, T3]) == [(1, T1), (2, T3)]


class TurnsOnly:
    """A turn-unit search: ranks the turns only; `list` is every memory of the key (turns and notes)."""

    def __init__(self, entries: list[MemoryEntry]):
        self.entries = entries

    def search(self, key, opts: SearchOptions) -> SearchResult:
        turns = [e for e in self.entries if e.id.startswith("t")][: opts.max_results]
        return SearchResult(query=opts.query, options=opts,
                            hits=[SearchHit(entry=e, score=1.0 / (i + 1), rank=i + 1) for i, e in enumerate(turns)])

    def list(self, key) -> list[MemoryEntry]:
        return list(self.entries)


def _ask(path, citing: bool, text: str = "What did Alice research?"):
    conv = load_locomo(path)["syn-1"]  # speakers Alice and Bob
    ctx = AnswerContext(service=TurnsOnly(ALL), key=KEY, conversation=conv, search=SearchOptions(max_results=10))
    q = Question("syn-1", 0, text, "adoption agencies", None, (), (), 4, "x")
    return ExtractiveAnswerer(**PINNED, context_citing=citing).answer(q, ctx)


def test_the_reader_reads_the_citing_notes_and_the_context_and_its_tokens_hold_them(synthetic_path):
    off, on = _ask(synthetic_path, False), _ask(synthetic_path, True)
    assert [e.id for e in off.context] == ["t1", "t2", "t3"]
    assert [e.id for e in on.context] == ["t1", "o1", "o2", "t2", "t3", "o4"]
    assert on.queries[0].hits == off.queries[0].hits  # what was retrieved is the same
    q = "What did Alice research?"
    assert on.context_tokens == count_tokens("\n".join(e.text for e in on.context) + "\n" + q)
    assert on.context_tokens > off.context_tokens == count_tokens("\n".join(e.text for e in off.context) + "\n" + q)
    assert "adoption agencies" in on.prediction and "adoption" not in off.prediction
    assert on.context_source_ids == ["D1:1", "D1:3", "D1:2"]  # the notes cite only retrieved turns here


def test_a_token_budget_binds_the_lines_read_notes_included_and_the_trace_keeps_the_turns_read(synthetic_path):
    conv = load_locomo(synthetic_path)["syn-1"]
    budget = count_tokens(T1.text + "\n") + count_tokens(O1.text + "\n") + 1  # t1 and o1 fit, o2 does not
    ctx = AnswerContext(service=TurnsOnly(ALL), key=KEY, conversation=conv, search=SearchOptions(max_results=10),
                        context_tokens=budget)
    q = Question("syn-1", 0, "What did Alice research?", "adoption agencies", None, (), (), 4, "x")
    a = ExtractiveAnswerer(**PINNED, context_citing=True).answer(q, ctx)
    assert [e.id for e in a.context] == ["t1", "o1"] and [h["id"] for h in a.queries[0].hits] == ["t1"]
    assert a.queries[0].options["context_tokens_used"] == budget - 1 <= a.queries[0].options["context_tokens"]
    plain = ExtractiveAnswerer(**PINNED).answer(q, ctx)  # without the notes the same budget reads the next turn
    assert [e.id for e in plain.context] == ["t1", "t2"]


def test_the_setting_is_declared_so_it_changes_the_cache_id_and_the_record_and_a_bad_value_names_it():
    on, off = ExtractiveAnswerer(context_citing=True), ExtractiveAnswerer()
    assert off.context_citing is False and on.get_params()["context_citing"] is True
    assert on.cache_id() != off.cache_id() and on.cache_id().endswith(",true)")
    cfg = ExperimentConfig.from_dict({"answer": {"params": {"context_citing": True}}})
    assert ExtractiveAnswerer.from_config(cfg.answer, lambda role: None).context_citing is True
    with pytest.raises(ParamError, match=r"context_citing = 'yes'; expected true or false"):
        ExtractiveAnswerer(context_citing="yes")
    with pytest.raises(ConfigError, match=r"answer\.params\.context_citing = 1; expected true or false"):
        ExperimentConfig.from_dict({"answer": {"params": {"context_citing": 1}}})
