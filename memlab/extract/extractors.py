"""Extractors: ``extract(request) -> ExtractionResult`` (proposed ops). The model only proposes.

- `TurnsExtractor` (no model): each delta turn one episode memory;
- `ObservationsExtractor` (no model): LoCoMo's annotated facts of the delta's turns;
- `LLMExtractor`: one model call with the tools add/update/delete/clear, parsed into typed ops
  (`memlab.extract.tool_calls`: the tools, the parsing and the prompt's rendering).

Each is registered in `EXTRACTORS` under its config name and builds itself from the config's
``extraction`` section (`Extractor.from_config`); `Extractor.bind` gives the per-conversation
instance (the model-free extractors read that conversation's annotations).
"""

from __future__ import annotations

import copy
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any

from memlab.data.locomo import Conversation
from memlab.extract.memory_sets import TURN_STYLES, observation_memories, turn_memories
from memlab.extract.messages import Message
from memlab.extract.ops import ACTIONS, ExtractionResult, MemoryOp
from memlab.extract.tool_calls import (  # noqa: F401  (re-exported: they were defined here)
    UnreadableArguments,
    extraction_schema,
    extraction_tools,
    first_person,
    parse_event_time,
    parse_tool_call,
    render_messages,
    render_old_memories,
    speakers_of,
    tool_arguments,
    unreadable,
)
from memlab.llm import (
    CallStats,
    Completion,
    MalformedToolCall,
    ModelClient,
    ModelError,
    ToolCall,
    calls_from_json,
    normalise_endpoint,
)
from memlab.memory.entry import MemoryEntry, UserKey
from memlab.params import MODEL_NAME, Component, OneOf, PromptName, Range, Trust, settings
from memlab.prompts import load_prompt, render
from memlab.registry import Registry

#: Extractors by config name (``extraction.name``).
EXTRACTORS: Registry[Extractor] = Registry("extractor")
#: ``client_for(role)``: the model client of a role ("extractor", "reader", "judge", "embedder").
ClientFor = Callable[[str], ModelClient]
#: What a ``json_schema`` endpoint is told of the reply's form (``memlab/prompts/replies/``).
JSON_REPLY_PROMPT = "extract-json"


@dataclass(frozen=True)
class ExtractionRequest:
    key: UserKey
    delta: Sequence[Message]
    old_memories: Sequence[MemoryEntry]
    now: datetime | None = None

    @property
    def source_ids(self) -> tuple[str, ...]:
        return tuple(m.id for m in self.delta if m.id)


class Extractor(Component, ABC):
    name: str = "extractor"
    #: Whether the worker reconciles this extractor's adds. Verbatim turn records opt out: each turn is
    #: its own memory (keyed by its dialog id), and turns quoting their neighbours would merge.
    reconciles: bool = True
    #: Whether the extractor reads the old memories. Model-free extractors do not, and the worker then
    #: skips the lookup (it would only cost an index rebuild per job; results are identical).
    reads_old_memories: bool = True
    #: Whether the extractor calls a model (then ``extraction.model`` is required).
    requires_model: bool = False
    #: Whether the extractor writes the verbatim turns beside its own memories (`ExtractionResult.verbatim`);
    #: the worker's old-memory lookup and reconcile then search its own memories only.
    keeps_turns: bool = False
    #: The op actions the extractor can propose (`memlab.extract.ops.ACTIONS`). One that only adds leaves the
    #: update policy nothing to decide unless reconcile rewrites its adds (`memlab.extract.policy`), so its
    #: extraction cache is shared across policies. Default: every action (a new extractor is assumed to edit).
    proposes: frozenset[str] = frozenset(ACTIONS)

    @classmethod
    def from_config(cls, section: Any, client_for: ClientFor) -> Extractor:
        """Build from the ``extraction`` config section: its ``params`` are the constructor's settings."""
        return cls(**settings(section))

    def bind(self, conversation: Conversation) -> Extractor:
        """The instance that extracts one conversation (itself unless it reads per-conversation data)."""
        return self

    #: Constructor arguments that do not decide the ops (a key, a timeout): left out of `cache_id`, which
    #: (`memlab.params.Component`) names the class and its settings, so two extractors, or one with two
    #: settings, never share cached memories.
    cache_exclude: tuple[str, ...] = ()

    @abstractmethod
    def extract(self, request: ExtractionRequest) -> ExtractionResult: ...


class ConversationExtractor(Extractor):
    """An extractor that reads the conversation's own records; `bind` gives a copy holding it."""

    def __init__(self) -> None:
        self.conversation: Conversation | None = None

    def bind(self, conversation: Conversation) -> Extractor:
        bound = copy.copy(self)
        bound.conversation = conversation
        bound._reset()
        return bound

    def _reset(self) -> None:
        """Drop per-conversation lookups built lazily by `extract`."""


def _op(item: dict[str, Any]) -> MemoryOp:
    return MemoryOp(action="add", text=item["text"], kind=item["kind"], topics=tuple(item.get("topics", ())),
                    event_time=item.get("event_time"), participants=tuple(item.get("participants", ())),
                    location=item.get("location"), source_ids=tuple(item["source_ids"]))


@EXTRACTORS.register("turns")
class TurnsExtractor(ConversationExtractor):
    """Every delta turn becomes one episode at its session date (text style of `turn_memories`)."""

    name = "turns"
    reconciles = False
    reads_old_memories = False
    proposes = frozenset({"add"})

    def __init__(self, style: Annotated[str, OneOf(TURN_STYLES)] = "speaker-context"):
        super().__init__()
        self.style = style
        self._by_id: dict[str, dict[str, Any]] | None = None

    @classmethod
    def from_config(cls, section: Any, client_for: ClientFor) -> Extractor:
        return cls(**settings(section, style=section.turn_style))

    def _reset(self) -> None:
        self._by_id = None

    def extract(self, request: ExtractionRequest) -> ExtractionResult:
        if self.conversation is not None and self._by_id is None:
            self._by_id = {m["source_ids"][0]: m for m in turn_memories(self.conversation, self.style)}
        ops = []
        for m in request.delta:
            item = (self._by_id or {}).get(m.id)
            if item is None:
                item = {"text": f"{m.speaker or m.role}: {m.text}", "kind": "episode", "event_time": m.timestamp,
                        "participants": (m.speaker,) if m.speaker else (), "source_ids": (m.id,) if m.id else ()}
            ops.append(_op(item))
        return ExtractionResult(ops=ops)


@EXTRACTORS.register("observations")
class ObservationsExtractor(ConversationExtractor):
    """LoCoMo's annotated observations whose first dialog id is in the delta (kind by
    `memlab.extract.memory_sets.observation_kind`)."""

    name = "observations"
    reads_old_memories = False
    proposes = frozenset({"add"})

    def __init__(self) -> None:
        super().__init__()
        self._by_first: dict[str, list[dict[str, Any]]] | None = None

    def _reset(self) -> None:
        self._by_first = None

    def extract(self, request: ExtractionRequest) -> ExtractionResult:
        if self.conversation is None:
            raise ValueError("ObservationsExtractor reads a conversation's annotations: bind(conversation) first")
        if self._by_first is None:
            self._by_first = {}
            for item in observation_memories(self.conversation):
                if item["source_ids"]:
                    self._by_first.setdefault(item["source_ids"][0], []).append(item)
        ops = [_op(item) for mid in request.source_ids for item in self._by_first.get(mid, [])]
        return ExtractionResult(ops=ops)


@EXTRACTORS.register("llm")
class LLMExtractor(Extractor):
    """One model call through litellm; a proposal that cannot become an op is dropped with its reason.

    A memory in the first person ("I went ...") is dropped with its reason: it cannot say whose it
    is. Tool calls whose arguments are not a JSON object are counted (``malformed_tool_calls``) and
    re-asked once, the model shown each error beside its calls (as the answer path re-asks a tool call
    written as text); still malformed, the job fails with `memlab.llm.MalformedToolCall` and that reply
    is not cached. A reply with no text and no tool call, or a tool call written as text that neither
    parses nor comes back well-formed when re-asked with ``tool_choice`` forced, raises a
    `memlab.llm.ModelError` too (the job fails and is retried on rerun; nothing failed is cached).

    An endpoint declared ``structured_output: json_schema`` (a model without a tool-call template, e.g. on
    llama.cpp) gets the same calls as one JSON object constrained by a schema derived from the tools
    (`memlab.extract.tool_calls.extraction_schema`), read into the same ops; a reply that is not that JSON
    (or was cut off at ``max_tokens``) fails the job, never an empty extraction.
    """

    name = "llm"
    requires_model = True

    @classmethod
    def from_config(cls, section: Any, client_for: ClientFor) -> Extractor:
        return cls(**settings(section, model=section.model, prompt=section.prompt, client=client_for("extractor")))

    def __init__(self, model: Annotated[str, MODEL_NAME],
                 prompt: Annotated[str, PromptName("extract"), Trust.file] = "structured",
                 api_base: Annotated[str | None, Trust.endpoint] = None,
                 api_key: Annotated[str | None, Trust.secret] = None,
                 timeout: Annotated[float, Range(0, lo_open=True)] = 30.0, max_retries: Annotated[int, Range(0)] = 3,
                 backoff: Annotated[float, Range(0)] = 0.5, cache_path: Annotated[str | None, Trust.file] = None,
                 client: ModelClient | None = None):
        self.model = model
        self.prompt = prompt
        self.api_base = api_base
        self.api_key = api_key
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.cache_path = cache_path
        self.client = client

    cache_exclude = ("api_key", "timeout", "max_retries", "backoff", "cache_path", "client", "api_base")

    def cache_params(self) -> dict[str, Any]:
        """Model, prompt (with its text's hash) and the endpoint that answers (with a non-default temperature):
        what decides the ops; a key, timeouts and retries do not."""
        import hashlib

        params = super().cache_params()
        h = hashlib.sha256(load_prompt("extract", self.prompt).encode()).hexdigest()[:12]
        params["prompt"] = f"{self.prompt}@{h}"
        client = self.client
        if client is not None and client.structured_output == "json_schema":  # another request, other ops
            jh = hashlib.sha256(load_prompt("replies", JSON_REPLY_PROMPT).encode()).hexdigest()[:12]
            params["structured_output"] = f"json_schema@{jh}"
        endpoint = normalise_endpoint(client.api_base if client is not None else self.api_base)
        if endpoint is not None:  # a provider's own API is named by the model (keys stay as they were)
            params["endpoint"] = endpoint
        if client is not None and client.temperature not in (0.0, None):
            params["temperature"] = client.temperature
        return params

    def _client(self) -> ModelClient:
        if self.client is None:
            self.client = ModelClient(self.model, api_base=self.api_base, api_key=self.api_key, timeout=self.timeout,
                                      max_retries=self.max_retries, backoff=self.backoff, cache_path=self.cache_path)
        return self.client

    def build_messages(self, request: ExtractionRequest) -> list[dict[str, Any]]:
        today = (request.now or (request.delta[-1].timestamp if request.delta else datetime.now()))
        who = speakers_of(request.delta)
        values = {"today": f"{today:%Y-%m-%d}", "speaker": who[0] if who else "Alice"}
        text = render(load_prompt("extract", self.prompt), old_memories=render_old_memories(request.old_memories),
                      messages=render_messages(request.delta), speakers=" and ".join(who) or "the speakers", **values)
        if self._client().structured_output == "json_schema":
            text += "\n\n" + render(load_prompt("replies", JSON_REPLY_PROMPT), **values)
        return [{"role": "system", "content": text},
                {"role": "user", "content": "Extract the memories from the new messages now."}]

    def extract(self, request: ExtractionRequest) -> ExtractionResult:
        client, msgs = self._client(), self.build_messages(request)
        if client.structured_output == "json_schema":
            return self._extract_json(client, msgs, request)
        tools = extraction_tools()
        comp = client.complete(msgs, tools=tools, tool_choice="auto")
        stats, calls = comp.stats(), list(comp.tool_calls)
        bad = unreadable(calls)
        dropped: list[str] = []
        if bad:
            stats.malformed_tool_calls += len(bad)
            again = self._reask(client, msgs, tools, calls, bad, stats)
            stats = stats + again.stats()
            calls = [tc for i, tc in enumerate(calls) if i not in bad] + list(again.tool_calls)
            if not again.tool_calls:  # the model declined to send them again: dropped, with the reason
                dropped += [f"{why} (re-asked with the error shown; no corrected call came back)"
                            for why in bad.values()]
        return self._result(calls, request, stats, dropped)

    def _extract_json(self, client: ModelClient, msgs: list[dict[str, Any]],
                      request: ExtractionRequest) -> ExtractionResult:
        """The calls as one JSON object under a schema (``structured_output: json_schema``)."""
        calls: list[ToolCall] = []

        def read(comp: Completion) -> None:  # also run on a cached reply; unreadable: BadReply, not cached
            calls[:] = calls_from_json(comp.text, "tool", "operations")

        comp = client.complete(msgs, response_format={"type": "json_schema", "json_schema": {
            "name": "memory_operations", "schema": extraction_schema()}}, check=read)
        return self._result(calls, request, comp.stats(), [])

    def _result(self, calls: list[ToolCall], request: ExtractionRequest, stats: CallStats,
                dropped: list[str]) -> ExtractionResult:
        """The calls as ops; one that cannot become an op (malformed, first person) is dropped with its reason."""
        ops: list[MemoryOp] = []
        ids = request.source_ids
        for tc in calls:
            try:
                op = parse_tool_call(tc.name, tc.arguments, ids)
                word = (first_person(op.text, speakers_of(request.delta))
                        if op.action in ("add", "update") and op.text else None)
                if word:
                    raise ValueError(f"{tc.name}: first-person memory ({word!r} in {op.text[:60]!r}); expected "
                                     "third person naming the speaker")
                ops.append(op)
            except ValueError as e:
                dropped.append(str(e))
        return ExtractionResult(ops=ops, dropped=dropped, usage=stats.usage, calls=stats.calls,
                                malformed_tool_calls=stats.malformed_tool_calls)

    def _reask(self, client: ModelClient, msgs: list[dict[str, Any]], tools: list[dict[str, Any]],
               calls: list[ToolCall], bad: dict[int, str], spent: CallStats) -> Completion:
        """Ask once more, showing the model its calls and each malformed one's error; a reply whose calls
        are still malformed raises `MalformedToolCall` (carrying ``spent`` and the count) and is not cached."""
        turn = {"role": "assistant", "content": "", "tool_calls": [
            {"id": tc.id, "type": "function", "function": {"name": tc.name, "arguments": tc.arguments}}
            for tc in calls]}
        results = [{"role": "tool", "tool_call_id": tc.id,
                    "content": json.dumps({"error": f"{bad[i]}; send this call again with its arguments as "
                                                    "one valid JSON object"} if i in bad else {"ok": True})}
                   for i, tc in enumerate(calls)]
        still: dict[int, str] = {}

        def well_formed(comp: Completion) -> None:  # also run on a cached reply: only its own calls count
            still.clear()
            still.update(unreadable(comp.tool_calls))
            if still:
                raise MalformedToolCall(f"{client.model}: {len(bad)} extraction tool call(s) had unreadable "
                                        f"arguments and, re-asked with the errors shown, {len(still)} still do: "
                                        f"{'; '.join(list(still.values())[:3])}")

        try:
            return client.complete([*msgs, turn, *results], tools=tools, tool_choice="auto", check=well_formed)
        except ModelError as e:
            e.partial = spent + e.partial
            e.partial.malformed_tool_calls += len(still)
            raise


class CombinedExtractor(Extractor):
    """Several extractors' ops for the same delta (e.g. turns + observations).

    Not reconciled: a verbatim turn and an annotated fact about it are different memories, and
    reconciling would fold the facts into the turns they summarise."""

    reconciles = False

    def __init__(self, parts: list[Extractor]):
        self.parts = parts
        self.name = "+".join(p.name for p in parts)
        self.reads_old_memories = any(p.reads_old_memories for p in parts)
        self.proposes = frozenset().union(*(p.proposes for p in parts))

    def bind(self, conversation: Conversation) -> Extractor:
        return CombinedExtractor([p.bind(conversation) for p in self.parts])

    def cache_id(self) -> str:
        return "+".join(p.cache_id() for p in self.parts)

    def extract(self, request: ExtractionRequest) -> ExtractionResult:
        out = ExtractionResult()
        for p in self.parts:
            r = p.extract(request)
            out.ops += r.ops
            out.dropped += r.dropped
            out.calls += r.calls
        return out


@EXTRACTORS.register("turns+observations")
class TurnsAndObservations(CombinedExtractor):
    """Every turn verbatim plus LoCoMo's annotated observations (the offline default)."""

    def __init__(self, style: Annotated[str, OneOf(TURN_STYLES)] = "speaker-context"):
        self.style = style
        super().__init__([TurnsExtractor(style=style), ObservationsExtractor()])

    @classmethod
    def from_config(cls, section: Any, client_for: ClientFor) -> Extractor:
        return cls(**settings(section, style=section.turn_style))


@EXTRACTORS.register("turns+llm")
class TurnsAndLLM(Extractor):
    """Every turn verbatim plus the model's memories (`LLMExtractor`), each citing its source turns.

    What observation-aware indexing (``index.params.append_citing``, ``retrieval.unit: turn``) needs without LoCoMo's
    annotations: the extracted memories play the observations' part. The turns are written as they are
    (`ExtractionResult.verbatim`); the model reads, and reconcile compares against, only its own earlier
    memories (``keeps_turns``: the worker's searches leave the turn records out), so a memory that restates
    its turn is never skipped as that turn's duplicate and the model never edits a turn.
    """

    name = "turns+llm"
    requires_model = True
    keeps_turns = True

    def __init__(self, llm: LLMExtractor, style: Annotated[str, OneOf(TURN_STYLES)] = "speaker-context"):
        self.llm = llm
        self.style = style
        self.turns = TurnsExtractor(style=style)
        self.proposes = llm.proposes | self.turns.proposes

    @classmethod
    def from_config(cls, section: Any, client_for: ClientFor) -> Extractor:
        llm = LLMExtractor(model=section.model, prompt=section.prompt, client=client_for("extractor"))
        return cls(llm, **settings(section, style=section.turn_style))

    def bind(self, conversation: Conversation) -> Extractor:
        bound = copy.copy(self)
        bound.turns = self.turns.bind(conversation)
        bound.llm = self.llm.bind(conversation)
        return bound

    def cache_id(self) -> str:
        return f"{self.turns.cache_id()}+{self.llm.cache_id()}"

    def extract(self, request: ExtractionRequest) -> ExtractionResult:
        out = self.llm.extract(request)  # a failed call raises: the job fails, and no turn is written either
        out.verbatim = self.turns.extract(request).ops
        return out
