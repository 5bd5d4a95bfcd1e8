"""The session-recall arm: find the question's turns, then read whole sessions (or turn windows) once.

1. Hybrid search (dense + keyword ranks fused by RRF, the run's index settings) over the raw turns of
   the question's conversation — not over extracted memories: nothing is lost to extraction;
2. the sessions of the top hits, in hit order, up to ``max_units`` distinct sessions
   (``unit="session"``), or the turns within ``window`` of each hit, merged where they overlap,
   up to ``max_units`` windows (``unit="window"``);
3. the loaded turns, in conversation order with their session dates, go into one prompt and one
   answer call (`memlab.prompts` ``answer/session-recall``). Offline (no model) the extractive reader
   reads the loaded turns instead, ranked by the same search restricted to them.

The reference report measures this arm as its best (F1 0.549 at 3,694 tokens/QA, vs 0.469 at
17,182 for its optimized arm). The turn index is built once per conversation and kept.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Annotated, Any

from memlab.answer.base import ABSTAIN, ANSWERERS, Answer, AnswerContext, Answerer, retrieve
from memlab.answer.extractive import ExtractiveAnswerer
from memlab.data.locomo import Conversation, Question
from memlab.extract.memory_sets import turn_memories
from memlab.index import HybridIndex, index_text, open_service
from memlab.llm import ModelClient, count_tokens
from memlab.memory.entry import MemoryEntry, UserKey
from memlab.memory.search_types import SearchOptions, SearchResult
from memlab.memory.service import MemoryService
from memlab.params import OneOf, PromptName, Range, Trust, check_params, construct, settings
from memlab.prompts import load_prompt, render

UNITS = ("session", "window")
APP_NAME = "session-recall"


def _session_of(dia_id: str) -> int:
    return int(dia_id[1:].split(":")[0])


def _turn_no(dia_id: str) -> int:
    return int(dia_id.split(":")[1])


class _Restricted:
    """A `MemoryView` of the loaded turns only (what the offline reader may read): searches with ranks renumbered."""

    def __init__(self, service: MemoryService, allowed: set[str]):
        self.service = service
        self.allowed = allowed

    def search(self, key: UserKey, options: SearchOptions) -> SearchResult:
        full = self.service.search(key, replace(options, max_results=max(len(self.allowed) * 4, 200)))
        hits = [h for h in full.hits if h.id in self.allowed][: options.max_results]
        full.hits = [replace(h, rank=i) for i, h in enumerate(hits, start=1)]
        full.options = options
        return full

    def list(self, key: UserKey) -> list[MemoryEntry]:
        return [e for e in self.service.list(key) if e.id in self.allowed]

    def count(self, key: UserKey) -> int:
        return len(self.list(key))

    def read_recent(self, key: UserKey, limit: int = 10) -> list[MemoryEntry]:
        es = [e for e in self.service.read_recent(key, -1) if e.id in self.allowed]
        return es if limit < 0 else es[:limit]

    def recovered_ids(self, key: UserKey) -> set[str] | None:
        return self.service.recovered_ids(key)


@ANSWERERS.register("session-recall")
class SessionRecallAnswerer(Answerer):
    """Turn search -> sessions (or windows) around the top hits -> one read (model or extractive)."""

    name = "session-recall"
    needs_memory = False  # it searches the raw turns, never the extracted store
    requires_model = False  # with answer.model it reads with the model, without it offline
    model_optional = True
    own_index = True
    #: Its turn index is the run's index (`use_index`: `memlab.index.hybrid.HybridIndex` keywords), so no index
    #: setting is an ``answer.params`` setting.
    fixed_params = {"index": "index (the run's index section)", "turn_style": "extraction.turn_style",
                    "embedding_cache": "the machine cache (run.cache_dir; memlab.index.machine_cache)"}
    answer_settings = ("model", "prompt")
    #: The offline reader's settings are given as ``reader__<setting>`` (`memlab.params`).
    nested_params = ("reader",)

    @classmethod
    def from_config(cls, section: Any, client_for: Callable[[str], Any]) -> Answerer:
        """``answer`` section: ``model`` (optional: without one the offline reader reads), ``prompt``, and
        ``params`` (``unit``, ``window``, ``max_units``, the offline reader's as ``reader__<setting>``)."""
        return construct(cls, {"client": client_for("reader") if section.model else None,
                               "prompt": section.prompt or "session-recall", "reader": ExtractiveAnswerer(),
                               **settings(section)})

    def use_index(self, index: dict[str, Any], turn_style: str, embedding_cache: str | None) -> None:
        """The run's index settings (`memlab.index.hybrid.HybridIndex` keywords), turn style and embedding cache,
        before the first question (``append_citing`` does not apply: this index holds turns only)."""
        if self._built:
            raise RuntimeError("session-recall: index settings change after turns were indexed")
        self.index = {**index, "append_citing": False}
        self.turn_style = turn_style
        self.embedding_cache = embedding_cache

    def __init__(self, client: ModelClient | None = None,
                 prompt: Annotated[str, PromptName("answer"), Trust.file] = "session-recall",
                 reader: ExtractiveAnswerer | None = None, unit: Annotated[str, OneOf(UNITS)] = "session",
                 window: Annotated[int, Range(0)] = 3, max_units: Annotated[int, Range(1)] = 3,
                 index: dict[str, Any] | None = None, turn_style: str = "speaker",
                 embedding_cache: str | None = None):
        # the declared constraints (OneOf, Range above), the one check a config's answer.params also meets
        check_params(SessionRecallAnswerer, {"unit": unit, "window": window, "max_units": max_units}, "session-recall")
        if client is None and reader is None:
            raise ValueError("session-recall needs a model client or an offline reader (e.g. ExtractiveAnswerer)")
        self.client = client
        self.prompt = prompt
        self.reader = reader
        self.unit = unit
        self.window = window
        self.max_units = max_units
        self.index = index or {}
        self.turn_style = turn_style
        self.embedding_cache = embedding_cache
        self._service: MemoryService | None = None
        self._built: dict[str, list[MemoryEntry]] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------------------ the turn index
    def turn_service(self, conv: Conversation) -> tuple[MemoryService, UserKey]:
        """The private turn store (one key per conversation), filled and indexed on first use."""
        key = UserKey(APP_NAME, conv.sample_id)
        with self._lock:
            if self._service is None:
                self._service = open_service("memory", embedding_cache=self.embedding_cache, **self.index)
            if conv.sample_id not in self._built:
                for m in turn_memories(conv, self.turn_style):
                    self._service.add(key, **m)
                entries = self._service.list(key)
                self._service.searcher.ensure_built(key, lambda: entries)
                self._built[conv.sample_id] = entries
        return self._service, key

    def build_texts(self, conv: Conversation) -> list[str]:
        """The texts this arm embeds for a conversation (its memory-building cost): every turn as indexed."""
        key = UserKey(APP_NAME, conv.sample_id)
        dated = HybridIndex(**self.index).date_in_text  # the index's own default where the run gives none
        return [index_text(MemoryEntry(id=m["source_ids"][0], key=key, text=m["text"], event_time=m["event_time"]),
                           dated) for m in turn_memories(conv, self.turn_style)]

    # ------------------------------------------------------------------------------ loading
    def select(self, conv: Conversation, hit_ids: list[str]) -> list[tuple[int, list[str]]]:
        """The units to load for ranked hit dialog ids: ``[(session, [dia_id, ...]), ...]`` in hit order."""
        units: list[tuple[int, list[str]]] = []
        by_session = {s.index: [t.dia_id for t in s.turns] for s in conv.sessions}
        for did in hit_ids:
            if len(units) >= self.max_units:
                break
            s = _session_of(did)
            turns = by_session.get(s, [])
            if self.unit == "session":
                if all(u[0] != s for u in units):
                    units.append((s, list(turns)))
                continue
            pos = turns.index(did) if did in turns else None
            if pos is None:
                continue
            span = turns[max(0, pos - self.window): pos + self.window + 1]
            merged = False
            for i, (us, ids) in enumerate(units):  # overlapping or adjacent windows of one session merge
                lo, hi = _turn_no(span[0]), _turn_no(span[-1])
                if us == s and lo <= _turn_no(ids[-1]) + 1 and _turn_no(ids[0]) <= hi + 1:
                    units[i] = (s, [t for t in turns if t in set(ids) | set(span)])
                    merged = True
                    break
            if not merged:
                units.append((s, span))
        return units

    @staticmethod
    def render(conv: Conversation, units: list[tuple[int, list[str]]]) -> str:
        parts = []
        for s, ids in sorted(units, key=lambda u: (u[0], _turn_no(u[1][0]) if u[1] else 0)):
            sess = conv.session_by_index[s]
            partial = len(ids) < len(sess.turns)
            parts.append(f"### Session {s} ({sess.date_time_raw})" + (f", turns {ids[0]}-{ids[-1]}" if partial else ""))
            parts.extend(f"{conv.turn(d).speaker}: {conv.turn(d).searchable_text}" for d in ids)
        return "\n".join(parts)

    # ------------------------------------------------------------------------------ answering
    def prepare(self, questions: Sequence[str]) -> int:
        """The offline reader's (no model client) batch work, as when it is the arm."""
        return self.reader.prepare(questions) if self.client is None and self.reader is not None else 0

    def answer(self, question: Question, ctx: AnswerContext) -> Answer:
        conv = ctx.conversation
        svc, key = self.turn_service(conv)
        search = replace(ctx.search, kind=None, kind_fallback=False, dedupe=False)
        tctx = replace(ctx, service=svc, key=key, search=search, preload_budget=0)
        res, trace = retrieve(tctx, question.question)
        units = self.select(conv, [h.entry.source_ids[0] for h in res.hits])
        loaded = [d for _, ids in units for d in ids]
        by_dia = {e.source_ids[0]: e for e in self._built[conv.sample_id]}
        context = [by_dia[d] for d in sorted(loaded, key=lambda d: (_session_of(d), _turn_no(d))) if d in by_dia]
        text = self.render(conv, units) if units else "(nothing found)"
        info = {"unit": self.unit, "loaded": [{"session": s, "turns": len(ids), "first": ids[0], "last": ids[-1]}
                                              for s, ids in units if ids]}
        if self.client is None:
            allowed = {e.id for e in context}
            rctx = replace(tctx, service=_Restricted(svc, allowed))
            a = self.reader.answer(question, rctx)  # type: ignore[union-attr]
            a.queries = [trace] + a.queries[1:] if a.queries else [trace]
            a.context = context
            a.context_tokens = count_tokens(text + "\n" + question.question)
            a.rule = f"{a.rule} [over {len(units)} {self.unit}(s), {len(context)} turns]"
            a.preload = info
            return a
        system = render(load_prompt("answer", self.prompt), speakers=" and ".join(conv.speakers), sessions=text)
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": question.question}]
        comp = self.client.complete(msgs)
        if not comp.text.strip():
            raise RuntimeError(f"{self.client.model}: empty answer for {question.qid} (session-recall)")
        ans = Answer(prediction=comp.text.strip(), context=context, queries=[trace], prompt=system,
                     response=comp.text, preload=info, rule=f"model over {len(units)} {self.unit}(s)")
        ans.context_tokens = count_tokens(system)
        ans.usage = comp.usage
        if comp.from_cache:
            ans.cached_calls = 1
        else:
            ans.calls = 1
        return ans


__all__ = ["ABSTAIN", "SessionRecallAnswerer", "UNITS"]
