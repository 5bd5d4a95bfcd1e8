"""What the offline run's speed-ups reuse is never stale (issue 24): the last fused ranking, query vector and
keyword scores are served only for an identical request over unchanged rows, and the faster `plain` and the
reader's per-clause caches give exactly what the straightforward code gives."""

from __future__ import annotations

import dataclasses
from collections import namedtuple
from datetime import datetime, timezone

import numpy as np
import pytest

from memlab.answer import extractive
from memlab.answer.extractive import ExtractiveAnswerer
from memlab.index import HybridIndex
from memlab.index.keyword import BM25Scorer, TfidfScorer
from memlab.index.text import stem, stop_words
from memlab.memory import InMemoryMemoryService, SearchOptions, SQLiteMemoryService, UserKey
from memlab.plain import plain

K = UserKey("app", "u")
TEXTS = ["Caroline went to the LGBTQ support group on Sunday", "Melanie painted a sunrise over the lake",
         "Caroline is researching adoption agencies", "Melanie runs charity races for mental health",
         "The support group met again in May", "Caroline gave a talk at the school event",
         "Caroline said the support group helped her a lot"]


def _hits(svc, **opts) -> list[tuple]:
    res = svc.search(K, SearchOptions(query="Caroline support group", **opts))
    return [dataclasses.astuple(dataclasses.replace(h, entry=None)) + (h.id,) for h in res.hits]


def _fresh(texts: list[str]) -> InMemoryMemoryService:
    svc = InMemoryMemoryService(HybridIndex())
    for t in texts:
        svc.add(K, t, kind="fact")
    return svc


def test_a_deeper_search_after_a_search_ranks_as_a_fresh_index_does():
    svc = _fresh(TEXTS)
    first = _hits(svc, max_results=3, dedupe=True)
    deep = _hits(svc, max_results=100, dedupe=False)  # served from the first search's fused order
    assert deep == _hits(_fresh(TEXTS), max_results=100, dedupe=False)
    assert first == _hits(_fresh(TEXTS), max_results=3, dedupe=True)
    assert svc.searcher.ensure_built(K, lambda: svc.list(K)).last_fused is not None


def test_the_reused_ranking_follows_a_write_and_other_options():
    new = "Caroline support group support group Caroline"
    svc, same = _fresh(TEXTS), _fresh(TEXTS)  # same: built at the same point, but by another query
    before = _hits(svc, max_results=100, dedupe=False)
    same.search(K, SearchOptions(query="Melanie lake"))
    for s in (svc, same):  # as many rows as before (the same list depth), one of them new and the best match
        s.delete(K, next(e.id for e in s.list(K) if e.text == TEXTS[1]))
        s.add(K, new, kind="fact")
    after = _hits(svc, max_results=100, dedupe=False)
    assert after == _hits(same, max_results=100, dedupe=False)
    assert len(after) == len(before) and after[0][-1] != before[0][-1]
    # another fusion, another filter: never the fused order of the last request
    same2 = _fresh(TEXTS)
    same2.search(K, SearchOptions(query="Melanie lake"))
    same2.delete(K, next(e.id for e in same2.list(K) if e.text == TEXTS[1]))
    same2.add(K, new, kind="fact")
    assert _hits(svc, hybrid=False, dedupe=False) == _hits(same2, hybrid=False, dedupe=False)
    assert _hits(svc, kind="episode", kind_fallback=False) == []


def test_keyword_scores_are_kept_for_the_last_query_only_and_never_across_a_refit():
    for scorer in (TfidfScorer(), BM25Scorer()):
        scorer.fit(TEXTS[:4])
        a = scorer.score("Caroline support group")
        assert scorer.score("Caroline support group") is a and not a.flags.writeable
        with pytest.raises(ValueError):
            a[0] = 1.0  # shared with the next identical call: read-only
        scorer.fit(TEXTS)  # refit on more documents: new scores, of the new length
        b = scorer.score("Caroline support group")
        assert b is not a and len(b) == len(TEXTS)
        assert np.array_equal(b, type(scorer)().fit(TEXTS).score("Caroline support group"))
        assert not np.array_equal(scorer.score("Melanie lake"), b)


def test_sqlite_count_is_the_number_of_stored_memories(tmp_path):
    svc = SQLiteMemoryService(tmp_path / "s.db")
    ids = [svc.add(K, t, kind="fact") for t in TEXTS]
    assert svc.count(K) == len(svc.list(K)) == len(TEXTS)
    svc.delete(K, ids[0].id)
    assert svc.count(K) == len(svc.list(K)) == len(TEXTS) - 1
    assert svc.count(UserKey("app", "other")) == 0


CLAUSES = ["Caroline's really into (pottery) now!", "I've just 'finally' finished the Sunday painting...", "", "  ",
           "It was the best, really... named it 'Sunrise'", "''", "Mel & Caroline's kids' races"]
QUESTIONS = ["What did Caroline paint on Sunday?", "Who named the painting?", "What races did Mel run?"]


def _qstems(q: str) -> set[str]:
    return {stem(w) for w in q.lower().replace("?", "").split() if w not in stop_words()}


@pytest.mark.parametrize("drop_filler", [True, False])
def test_novel_words_from_the_clause_cache_equal_the_uncached_rule(drop_filler, monkeypatch):
    """The per-clause cache (`_word_stems`, keyed by the clause text alone) serves every question and both filler
    settings: what the reader reads from it equals what its own rule gives uncached (``__wrapped__``), read in an
    interleaved order so that a cached entry is reused under other questions and the other setting."""
    readers = {df: ExtractiveAnswerer(drop_filler=df) for df in (True, False)}
    pairs = [(q, c) for q in QUESTIONS for c in CLAUSES]
    cached = [(readers[not drop_filler].novel_words(c, _qstems(q)), readers[drop_filler].novel_words(c, _qstems(q)))
              for q, c in pairs]
    assert extractive._word_stems.cache_info().hits > 0  # the cache was read, not only filled
    monkeypatch.setattr(extractive, "_word_stems", extractive._word_stems.__wrapped__)
    uncached = [(readers[not drop_filler].novel_words(c, _qstems(q)), readers[drop_filler].novel_words(c, _qstems(q)))
                for q, c in pairs]
    assert cached == uncached


def test_novel_words_keep_the_words_as_written_without_stop_words_question_stems_or_filler():
    """The rule on hand-checked examples: a word is kept as written (punctuation too) and compared by the stem of
    its core; the question's stems ("Caroline's", "painting" for "paint"), stop words and, with ``drop_filler``,
    filler ("really", "just", "finally") are left out."""
    qs = _qstems("What did Caroline paint on Sunday?")
    with_filler, without = ExtractiveAnswerer(drop_filler=False), ExtractiveAnswerer(drop_filler=True)
    assert without.novel_words("Caroline's really into (pottery) now!", qs) == (["(pottery)"], {"potteri"})
    assert with_filler.novel_words("Caroline's really into (pottery) now!", qs)[0] == ["really", "(pottery)"]
    clause = "I've just 'finally' finished the Sunday painting..."
    assert without.novel_words(clause, qs)[0] == ["I've", "finished"]
    assert with_filler.novel_words(clause, qs)[0] == ["I've", "just", "'finally'", "finished"]
    assert without.novel_words("", qs) == ([], set()) and without.novel_words("''", qs) == ([], set())


@dataclasses.dataclass
class _Inner:
    a: int
    b: list


@dataclasses.dataclass
class _Outer:
    name: str
    inner: _Inner
    items: list
    table: dict
    pair: tuple
    when: datetime


class _Dict(dict):
    pass


def test_plain_converts_as_asdict_without_copying_leaves():
    P = namedtuple("P", "x y")
    when = datetime(2023, 5, 8, tzinfo=timezone.utc)
    o = _Outer("n", _Inner(1, [_Inner(2, [])]), [1.5, None, True, {"k": _Inner(3, ["s"])}],
               _Dict(z=[_Inner(4, [])]), (P(1, _Inner(5, [])), "t"), when)
    out = plain(o)
    assert out == dataclasses.asdict(o)
    assert type(out["table"]) is dict and type(out["pair"][0]) is P and out["when"] is when
    assert plain(_Inner) is _Inner  # a dataclass type is a value, not a record
    assert list(out) == [f.name for f in dataclasses.fields(_Outer)]


def test_a_refit_embedder_projects_the_query_again():
    more = [f"{t} again in June" for t in TEXTS] + [f"Melanie told Caroline about {w}" for w in ("art", "races")]
    svc, same = _fresh(TEXTS), _fresh(TEXTS)
    _hits(svc)
    same.search(K, SearchOptions(query="Melanie lake"))
    st = svc.searcher.ensure_built(K, lambda: svc.list(K))  # built: the adds below make it refit
    v = st.fit_version
    for s in (svc, same):
        for t in more:  # more than doubles the key: the tfidf-lsa fit is redone (a new query projection)
            s.add(K, t, kind="fact")
    assert _hits(svc) == _hits(same)
    assert st.fit_version > v
