"""The fused lists are pluggable producers (`memlab.index.ranking`): their order is the fusion order, a
`HybridIndex` subclass may set its own, and the declared Searcher/Answerer/Judge hooks have their defaults."""

from __future__ import annotations

from datetime import datetime, timezone

import numpy as np

from memlab.answer import Answer, Answerer, Judge
from memlab.index import HybridIndex
from memlab.index.fusion import LIST_NAMES, RankedList, RRFFusion
from memlab.index.ranking import PRODUCERS, RankRequest, dense_list, keyword_list
from memlab.llm import Usage
from memlab.memory import InMemoryMemoryService, SearchOptions, UserKey

K = UserKey("app", "u")
TEXTS = ["Caroline went to the LGBTQ support group on Sunday", "Melanie painted a sunrise over the lake",
         "Caroline is researching adoption agencies", "Melanie runs charity races for mental health",
         "The support group met again in May", "Caroline gave a talk at the school event"]


def _service(searcher: HybridIndex) -> InMemoryMemoryService:
    svc = InMemoryMemoryService(searcher)
    for t in TEXTS:
        svc.add(K, t, kind="fact")
    return svc


def _ids(svc, **opts) -> list[tuple[str, float, int | None, int | None]]:
    res = svc.search(K, SearchOptions(query="Caroline support group", dedupe=False, **opts))
    return [(h.id, round(h.score, 6), h.keyword_rank, h.fused_rank) for h in res.hits]


def test_each_producer_makes_the_list_named_at_its_place_and_fusion_sums_them_in_that_order(monkeypatch):
    """What the producers make on a real search with every list on (turn unit over turns and the notes citing them,
    a sparse scorer, session text), and what the fusion receives: RRF sums in this order, so a producer moved,
    or a list renamed, would move scores."""
    made: list[str | None] = []

    def recorded(producer):
        def produce(req: RankRequest) -> RankedList | None:
            lst = producer(req)
            made.append(None if lst is None else lst.name)
            return lst
        return produce

    class Recording(HybridIndex):
        producers = tuple(recorded(p) for p in PRODUCERS)

    fused: list[list[str]] = []
    fuse = RRFFusion.fuse
    monkeypatch.setattr(RRFFusion, "fuse", lambda self, lists, n: fused.append([x.name for x in lists])
                        or fuse(self, lists, n))
    svc = InMemoryMemoryService(Recording(sparse="bm25", session_text=True))
    day = datetime(2023, 5, 7, tzinfo=timezone.utc)
    for i, (who, text) in enumerate([("Caroline", "I went to the LGBTQ support group yesterday"),
                                     ("Melanie", "I painted a sunrise over the lake"),
                                     ("Caroline", "The support group helped me a lot")], start=1):
        svc.add(K, f"{who}: {text}", kind="episode", event_time=day, participants=[who], source_ids=[f"D1:{i}"])
    svc.add(K, "Caroline attends a support group", kind="fact", source_ids=["D1:1", "D1:3"])
    svc.search(K, SearchOptions(query="Caroline support group", unit="turn", dedupe=False))
    assert made == list(LIST_NAMES)  # every producer made a list, the one named at its place
    assert fused == [list(LIST_NAMES)]  # and the fusion got them in that order


def test_an_index_with_the_dense_producer_only_ranks_as_dense_search():
    class DenseOnly(HybridIndex):
        producers = (dense_list,)

    assert _ids(_service(DenseOnly())) == _ids(_service(HybridIndex()), hybrid=False)
    assert _ids(_service(HybridIndex())) != _ids(_service(HybridIndex()), hybrid=False)  # fused scores, keyword ranks


def test_a_new_producer_is_fused_by_name():
    def last_first(req: RankRequest) -> RankedList:  # a list that ranks the newest memory first
        rows = np.flatnonzero(req.mask)[::-1]
        scores = np.full(req.n, np.nan, dtype=np.float32)
        scores[rows] = np.arange(len(rows), 0, -1)
        return RankedList("session", rows, scores)

    class WithRecency(HybridIndex):
        producers = (dense_list, keyword_list, last_first)

    plain, recent = _ids(_service(HybridIndex())), _ids(_service(WithRecency()))
    assert {h[0] for h in plain} == {h[0] for h in recent} and [h[0] for h in plain] != [h[0] for h in recent]
    hit = _service(WithRecency()).search(K, SearchOptions(query="Caroline support group", dedupe=False)).hits[0]
    assert hit.dense_rank is not None and hit.keyword_rank is not None  # the named lists still fill the trace


def test_declared_hooks_have_defaults():
    class Plain(Answerer):
        def answer(self, question, ctx):
            return Answer(prediction="x")

    class OneVerdict(Judge):
        def judge(self, question, prediction):
            return 0.5, Usage(prompt_tokens=3), False

    assert Plain.own_index is False and Plain().build_texts(None) is None
    assert OneVerdict().judge_repeats(None, "x") == ([0.5], Usage(prompt_tokens=3))
    assert OneVerdict.errata is None
    svc = _service(HybridIndex())
    assert svc.recovered_ids(K) is None  # memlab's own store knows every memory's dialog ids
    assert {e.text for e in svc.searcher.entries(K, lambda: svc.list(K))} == set(TEXTS)
