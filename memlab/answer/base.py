"""What every answerer gets and returns, retrieval with its trace, and the preload rule."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from memlab.data.locomo import Conversation, Question
from memlab.index.memory_fields import citing_pairs, is_turn_record
from memlab.llm import CallStats, ModelError, Usage, count_tokens
from memlab.memory.capabilities import MemoryView
from memlab.memory.entry import MemoryEntry, UserKey
from memlab.memory.search_types import HitRecord, SearchOptions, SearchResult
from memlab.memory.service import MemoryService
from memlab.params import Component, construct, param_specs, settable_specs, settings
from memlab.registry import Registry

log = logging.getLogger(__name__)

ABSTAIN = "Not mentioned in the conversation."
"""The one abstain phrase every arm and baseline uses (the official scorer accepts it for category 5)."""


@dataclass
class QueryTrace:
    """One search the arm issued, with every hit's ranks (the retrieval trace layer)."""

    query: str
    options: dict[str, Any]
    hits: list[dict[str, Any]]
    dropped_by_dedupe: list[tuple[str, str, float]] = field(default_factory=list)
    fallback_added: list[str] = field(default_factory=list)
    error: str | None = None

    @classmethod
    def from_result(cls, res: SearchResult) -> QueryTrace:
        return cls(
            query=res.query,
            options=res.options.to_dict(),
            hits=[HitRecord.of(h).to_dict() for h in res.hits],
            dropped_by_dedupe=list(res.dropped_by_dedupe),
            fallback_added=list(res.fallback_added),
        )


@dataclass
class Answer:
    prediction: str
    context: list[MemoryEntry] = field(default_factory=list)
    """The memories the reader was given (what retrieval recall and attribution look at)."""
    queries: list[QueryTrace] = field(default_factory=list)
    calls: int = 0
    cached_calls: int = 0
    usage: Usage = field(default_factory=Usage)
    context_tokens: int = 0
    """Tokens of the reader's context as counted offline (o200k); what an offline arm would cost a model."""
    latency_s: float = 0.0
    prompt: str = ""
    response: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    preload: dict[str, Any] | None = None
    rule: str = ""
    """Which rule produced the answer (extractive arm) or how the model finished (model arms)."""
    reading: dict[str, Any] | None = None
    """What an offline reader read of its context (candidates, owners, scores, the abstain test): the trace
    says why it answered or abstained from the context it was given, nothing else."""
    malformed_tool_calls: int = 0
    """Tool calls the model wrote as text (recovered by parsing or a forced re-ask); a run sums them."""

    def stats(self) -> CallStats:
        return CallStats(usage=self.usage, calls=self.calls, cached_calls=self.cached_calls,
                         latency_s=self.latency_s, malformed_tool_calls=self.malformed_tool_calls)

    @property
    def prompt_hash(self) -> str:
        return hashlib.sha256(self.prompt.encode("utf-8")).hexdigest()[:16] if self.prompt else ""

    @property
    def context_source_ids(self) -> list[str]:
        return list(dict.fromkeys(s for e in self.context for s in e.source_ids))


@dataclass
class AnswerContext:
    """The world an answerer sees for one question."""

    service: MemoryView | None
    """What the arm reads memory through (memlab's store or a memory system's view, `MemoryView`); None for an
    arm that reads none (``needs_memory`` False) when the run has no store."""
    key: UserKey
    conversation: Conversation
    search: SearchOptions
    """Base search options (top-k, hybrid, RRF k, dedupe, kind fallback ...); the query is filled per search."""
    preload_budget: int = 0
    now: datetime | None = None
    context_tokens: int | None = None
    """``retrieval.context_tokens``: each search's hits are cut to this many tokens (`within_budget`); None: k."""


class Answerer(Component, ABC):
    """One verb, `answer`; registered in `ANSWERERS` under its ``answer.name`` name."""

    name = "answerer"
    needs_memory = True
    #: Whether the arm's answer depends on ``retrieval.top_k`` (a sweep over k is flat otherwise).
    uses_top_k = True
    #: Whether the arm calls a model (then ``answer.model`` is required).
    requires_model = False
    #: Whether the arm reads with a model when ``answer.model`` is set (every arm that requires one; session-recall
    #: reads offline without one): the ``reader`` role is in use then (its endpoint checked, planned, trusted).
    model_optional = False
    #: The ``answer.*`` config fields the arm reads (`memlab.run.checks` says a change to another has no effect).
    answer_settings: tuple[str, ...] = ()
    #: Whether ``retrieval.*`` settings change its answers (False: it never searches).
    uses_retrieval = True
    #: Whether it injects preloaded memories (``retrieval.preload``).
    uses_preload = False

    #: Whether the arm keeps its own index over the conversation's turns (session-recall): the run then gives
    #: it the ``index`` settings (`use_index`), an embedder endpoint, and logs what it embedded (`build_texts`).
    own_index = False

    @classmethod
    def from_config(cls, section: Any, client_for: Callable[[str], Any]) -> Answerer:
        """Build from the ``answer`` config section (its ``params`` are the constructor's settings, `memlab.params`);
        ``client_for(role)`` gives a model client."""
        return construct(cls, settings(section))

    def use_index(self, **params: Any) -> None:
        """Take the run's index settings before the first question (called only when `own_index`)."""
        raise NotImplementedError(f"{type(self).__name__} has own_index set but does not take index settings")

    def build_texts(self, conv: Conversation) -> list[str] | None:
        """The texts the arm's own index embeds for ``conv`` (its memory-building cost); None: no own index."""
        return None

    def prepare(self, questions: Sequence[str]) -> int:
        """Work done once for a batch of questions before they are answered (every executor calls it per
        conversation, `memlab.run.answering.answer_batch`): a reader that encodes each question does it here in
        one pass, far cheaper per question than one encode each. Returns how many it prepared; the answers do
        not depend on it. Its time counts in the run's answering time, not in any question's ``latency_s`` (as
        the searchers' `prepare_queries`)."""
        return 0

    @abstractmethod
    def answer(self, question: Question, ctx: AnswerContext) -> Answer: ...

    def timed(self, question: Question, ctx: AnswerContext) -> Answer:
        """`answer` with its wall time; a `ModelError`'s ``partial`` gets the wall time spent too."""
        t0 = time.perf_counter()
        try:
            a = self.answer(question, ctx)
        except ModelError as e:
            e.partial.latency_s = time.perf_counter() - t0
            raise
        a.latency_s = time.perf_counter() - t0
        return a


class Judge(Component, ABC):
    """Scores a prediction against the gold answer; registered in `JUDGES` under its ``judge.name`` name. Its
    settings are its constructor's parameters (`memlab.params`), given by ``judge.params``; a ``judge.*`` field
    of the same name (``prompt``, ``repeats``, ``temperature``) is that setting's spelling in the section."""

    name = "judge"
    #: Corrected gold answers the judge sees, and invalid questions it skips (`memlab.eval.errata.Errata`);
    #: the run sets it from ``scoring.errata`` (and records that file, so it is no part of `cache_id`).
    errata: Any = None
    cache_exclude = ("errata",)

    @classmethod
    def from_config(cls, section: Any, client_for: Callable[[str], Any], **fixed: Any) -> Judge:
        """Build from the ``judge`` config section: ``fixed`` are the parameters the run decides (`fixed_params`),
        then the section's fields named like a setting, then ``judge.params``. A constructor parameter named
        ``client`` gets the judge role's model client (``client_for("judge")``)."""
        own = {"client": client_for("judge")} if "client" in param_specs(cls) else {}
        return cls(**own, **fixed, **settings(section, **section_settings(cls, section)))

    @abstractmethod
    def judge(self, question: Question, prediction: str) -> tuple[float | None, Usage, bool]:
        """One verdict in [0, 1] (None: not judged), its usage, and whether it came from the cache."""

    def judge_repeats(self, question: Question, prediction: str) -> tuple[list[float] | None, Usage]:
        """The verdicts whose mean is the question's J (None: not judged); one `judge` call by default."""
        v, usage, _ = self.judge(question, prediction)
        return (None if v is None else [v]), usage

    def judge_recorded(self, question: Question, prediction: str) -> tuple[list[float] | None, Usage, list[str]]:
        """`judge_repeats` and the reply text behind each verdict, for the run's record (a judge without
        model replies: none)."""
        verdicts, usage = self.judge_repeats(question, prediction)
        return verdicts, usage, []


def section_settings(cls: type, section: Any) -> dict[str, Any]:
    """The ``judge.*`` fields that name one of ``cls``'s settings (`memlab.params.settable_specs`), by value:
    ``judge.repeats`` is the setting ``repeats``, so ``judge.params`` may not give it again (the config says so)."""
    specs = settable_specs(cls)
    return {f.name: getattr(section, f.name) for f in dataclasses.fields(section)
            if f.name != "params" and f.name in specs}


#: Answer arms by config name (``answer.name``).
ANSWERERS: Registry[Answerer] = Registry("answer arm")
#: Judges by config name (``judge.name``).
JUDGES: Registry[Judge] = Registry("judge")


def retrieve(ctx: AnswerContext, query: str, **overrides: Any) -> tuple[SearchResult, QueryTrace]:
    """Search the question's key with the run's options (``overrides`` for one call, e.g. a tool's top_k), the hits
    cut to ``ctx.context_tokens`` where set (the trace's options then carry the budget and the tokens kept)."""
    opts = replace(ctx.search, query=query, **overrides)
    res = ctx.service.search(ctx.key, opts)
    if ctx.context_tokens is None:
        return res, QueryTrace.from_result(res)
    res, used = within_budget(res, ctx.context_tokens)
    trace = QueryTrace.from_result(res)
    trace.options.update(context_tokens=ctx.context_tokens, context_tokens_used=used)
    return res, trace


def within_budget(res: SearchResult, budget: int) -> tuple[SearchResult, int]:
    """The hits in rank order while their texts fit ``budget`` tokens (o200k, the count behind
    ``context_tokens_qa``; each text plus its line break), and the tokens they use. The first hit that does not fit
    ends the context: a later, shorter one is not taken instead (the context stays a prefix of the ranking, so a
    system's order decides what it reads, as with k)."""
    n, used = prefix_within([h.entry.text for h in res.hits], budget)
    return replace(res, hits=res.hits[:n]), used


def prefix_within(texts: list[str], budget: int) -> tuple[int, int]:
    """How many of ``texts``, in order, fit ``budget`` o200k tokens (each plus its line break; the first that does
    not fit ends them), and the tokens those use."""
    n = used = 0
    for t in texts:
        c = count_tokens(t + "\n")
        if used + c > budget:
            break
        n, used = n + 1, used + c
    return n, used


def with_citing(hits: list[tuple[int, MemoryEntry]], entries: list[MemoryEntry]) -> list[tuple[int, MemoryEntry]]:
    """``hits`` ((rank, memory), best first) with, after each dialog turn, the notes of ``entries`` citing it
    (LoCoMo's observations, extracted memories: the citation link of ``index.params.append_citing`` and the
    ``note_dense`` list) at that turn's rank, each note once (after the first turn it cites) and none already a
    hit. A turn-unit search ranks turns only; this lets its reader also read the short facts stated about them
    while what was retrieved stays the same (``answer.params.context_citing``)."""
    rows = list(entries)
    notes_of: dict[str, list[MemoryEntry]] = {}
    for note, rec in citing_pairs(rows, [is_turn_record(e) for e in rows]):
        notes_of.setdefault(rows[rec].id, []).append(rows[note])
    seen = {e.id for _, e in hits}
    out: list[tuple[int, MemoryEntry]] = []
    for rank, e in hits:
        out.append((rank, e))
        for n in notes_of.get(e.id, ()):
            if n.id not in seen:
                seen.add(n.id)
                out.append((rank, n))
    return out


def retrieve_citing(ctx: AnswerContext, query: str, **overrides: Any
                    ) -> tuple[list[tuple[int, MemoryEntry]], QueryTrace]:
    """`retrieve`, then `with_citing` over the key's memories (the search index's in-memory view where there is
    one): the lines the reader reads, (rank, memory). A ``context_tokens`` budget binds those lines, notes
    included (in order while they fit: the first that does not ends the context), and the trace keeps the
    retrieved memories read."""
    res, trace = retrieve(replace(ctx, context_tokens=None), query, **overrides)
    lines = with_citing([(h.rank, h.entry) for h in res.hits], _entries(ctx))
    if ctx.context_tokens is None:
        return lines, trace
    n, used = prefix_within([e.text for _, e in lines], ctx.context_tokens)
    read = {e.id for _, e in lines[:n]}
    trace = QueryTrace.from_result(replace(res, hits=[h for h in res.hits if h.entry.id in read]))
    trace.options.update(context_tokens=ctx.context_tokens, context_tokens_used=used)
    return lines[:n], trace


def preload(ctx: AnswerContext, message: str) -> tuple[list[MemoryEntry], dict[str, Any]]:
    """DESIGN's preload rule with budget N (0 = off, -1 = all).

    Read N+1 memories; if at most N exist, inject them all; else search with the current message
    (hybrid + dedupe, at most N); a search error or empty result injects the N most recent; the
    first probe failing injects nothing and the run goes on.
    """
    n = ctx.preload_budget
    info: dict[str, Any] = {"budget": n}
    if n == 0:
        info["mode"] = "off"
        return [], info
    try:
        probe = ctx.service.read_recent(ctx.key, -1 if n < 0 else n + 1)
    except Exception as e:
        log.warning("preload probe failed for %s: %s: %s", ctx.key, type(e).__name__, e)
        info.update(mode="probe-failed", error=str(e))
        return [], info
    if n < 0 or len(probe) <= n:
        info["mode"] = "all"
        return probe, info
    try:
        res = ctx.service.search(ctx.key, replace(ctx.search, query=message, max_results=n, hybrid=True, dedupe=True))
        if res.hits:
            info["mode"] = "search"
            return res.entries, info
        info["mode"] = "recent (search empty)"
    except Exception as e:
        log.warning("preload search failed for %s, using recent memories: %s: %s", ctx.key, type(e).__name__, e)
        info.update(mode="recent (search failed)", error=str(e))
    return probe[:n], info


TRACE_DEPTH = 100
"""How deep the trace-only ranking goes: an evidence memory below this rank is recorded as absent."""


def _options_of(trace: QueryTrace, base: SearchOptions) -> SearchOptions:
    """The `SearchOptions` a traced query ran with (``trace.options`` is its ``to_dict``)."""
    opts = dict(trace.options or {})
    for k in ("after", "before"):
        if isinstance(opts.get(k), str):
            opts[k] = datetime.fromisoformat(opts[k])
    known = {f for f in SearchOptions.__dataclass_fields__}
    return replace(base, **{k: v for k, v in opts.items() if k in known})


def _entries(ctx: AnswerContext) -> list[MemoryEntry]:
    """The key's memories, from the search index's in-memory view when it has one (it is kept in
    sync with the store by the write hooks; reading SQLite per question cost 0.14 s at LoCoMo size)."""
    svc = ctx.service
    if isinstance(svc, MemoryService) and svc.searcher is not None:
        return svc.searcher.entries(ctx.key, lambda: svc.list(ctx.key))
    return svc.list(ctx.key)


def evidence_ranks(ctx: AnswerContext, queries: list[QueryTrace], evidence: set[str], context_ids: set[str],
                   depth: int = TRACE_DEPTH) -> dict[str, Any]:
    """Where every memory sourced from the evidence sits in each query's full ranking (trace only).

    Each traced query is searched again with its own options but ``max_results = depth``, no
    event-time ordering and no near-duplicate removal, so a rank is the position in the ranking
    the searcher fused before dedupe: the reader's hits are its top k minus the near-duplicates, so
    a memory at rank r is reached by k = r at the latest (equal ranks when nothing was deduped).
    Dedupe is left out because it is a quadratic pass: at depth 100 it cost 73 ms per question on
    LoCoMo, ten times the offline answer. The reader's context is not touched: this runs after the
    answer. Returns the evidence memories (id, source ids, whether the reader was given it) and,
    per query, ``memory_ranks`` (memory id -> rank or None = not within ``depth``) and
    ``evidence_ranks`` (evidence dialog id -> best rank of a memory sourced from it, or None).
    """
    mems = [e for e in _entries(ctx) if not evidence.isdisjoint(e.source_ids)]
    out: dict[str, Any] = {"depth": depth, "evidence_memories": [
        {"id": e.id, "source_ids": list(e.source_ids), "in_context": e.id in context_ids} for e in mems],
        "queries": []}
    for t in queries:
        if t.error is not None or not t.query.strip():
            out["queries"].append(None)
            continue
        opts = replace(_options_of(t, ctx.search), query=t.query, max_results=max(depth, 1),
                       order_by_event_time=False, dedupe=False)
        res = ctx.service.search(ctx.key, opts)
        rank = {h.id: h.rank for h in res.hits}
        mranks = {e.id: rank.get(e.id) for e in mems}
        best: dict[str, int | None] = {}
        for e in mems:
            for s in e.source_ids:
                if s in evidence:
                    r = mranks[e.id]
                    if r is not None and (best.get(s) is None or r < best[s]):
                        best[s] = r
                    else:
                        best.setdefault(s, None)
        q_out: dict[str, Any] = {"memory_ranks": mranks, "evidence_ranks": best}
        if not out["queries"]:  # the first query's whole ranking as source ids: turn/session-level metrics
            q_out["ranked_sources"] = [list(h.entry.source_ids) for h in res.hits]  # (memlab.eval.longmemeval_tables)
        out["queries"].append(q_out)
    return out
