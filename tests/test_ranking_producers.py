"""The fused lists are pluggable producers (`memlab.index.ranking`): their order is the fusion order, a
`HybridIndex` subclass may set its own, and the declared Searcher/Answerer/Judge hooks have their defaults."""

from __future__ import annotations

import numpy as np

from memlab.answer import Answer, Answerer, Judge
from memlab.index import HybridIndex
from memlab.index.fusion import LIST_NAMES, RankedList
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


def test_producers_are_in_fusion_order():
    req_names = [p.__name__.removesuffix("_list") for p in PRODUCERS]
    assert req_names == list(LIST_NAMES)  # RRF sums in this order: reordering would move scores


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
