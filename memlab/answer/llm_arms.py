"""Model-backed arms over litellm: long-context, original (one retrieval), optimized (memory tools).
Every call goes through `memlab.llm.ModelClient` (cache, retries, usage). The LLM judge is the scoring
profile's (`memlab.eval.profiles.ProfileJudge`, registered as ``llm``): one verdict rule per profile."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any

from memlab.answer.base import (
    ANSWERERS,
    Answer,
    AnswerContext,
    Answerer,
    QueryTrace,
    preload,
    retrieve,
)
from memlab.data.locomo import Conversation, Question, format_day
from memlab.llm import (
    Completion,
    MalformedToolCall,
    ModelClient,
    ModelError,
    ToolCall,
    ToolLoopExhausted,
    calls_from_json,
    count_tokens,
    tools_as_schema,
)
from memlab.memory.entry import MemoryEntry
from memlab.params import PromptName, Range, Trust, settings
from memlab.prompts import load_prompt, render

log = logging.getLogger(__name__)
#: What a ``json_schema`` endpoint is told of the optimized arm's steps (``memlab/prompts/replies/``).
JSON_ACTIONS_PROMPT = "optimized-json"


def render_context(entries: list[MemoryEntry]) -> str:
    """Memories as the reader sees them: dated lines, no ids."""
    if not entries:
        return "(no memories)"
    lines = []
    for e in entries:
        when = f"[{format_day(e.event_time)}] " if e.event_time else ""
        old = f" (superseded on {format_day(e.superseded_at)})" if e.superseded_at else ""
        lines.append(f"- {when}{e.text}{old}")
    return "\n".join(lines)


def render_transcript(conv: Conversation) -> str:
    parts = []
    for s in conv.sessions:
        parts.append(f"### Session {s.index} ({s.date_time_raw})")
        parts.extend(f"{t.speaker}: {t.searchable_text}" for t in s.turns)
    return "\n".join(parts)


def _speakers(conv: Conversation) -> str:
    return " and ".join(conv.speakers)


def _account(ans: Answer, comp: Completion) -> None:
    ans.usage = ans.usage + comp.usage
    if comp.from_cache:
        ans.cached_calls += 1
    else:
        ans.calls += comp.calls
    ans.malformed_tool_calls += comp.malformed_tool_calls


def _complete(client: ModelClient, ans: Answer, msgs: list[dict[str, Any]], **kw: Any) -> Completion:
    """One call; a failure carries every earlier round's cost in ``partial`` and is re-raised."""
    try:
        comp = client.complete(msgs, **kw)
    except ModelError as e:
        e.partial = ans.stats() + e.partial
        raise
    _account(ans, comp)
    return comp


def reader_question(question: Question) -> str:
    """The question as a reader model gets it. A LongMemEval question carries the date it is asked on, which
    the official reader prompt states and temporal questions ("how many days ago ...") need; LoCoMo's do not."""
    date = getattr(question, "question_date_raw", None)
    return f"{question.question}\n(Current date: {date}.)" if date else question.question


@ANSWERERS.register("long-context")
class LongContextAnswerer(Answerer):
    """The whole transcript (with session dates) in one prompt."""

    name = "long-context"
    requires_model = True
    needs_memory = False
    uses_top_k = False
    uses_retrieval = False
    answer_settings = ("model", "prompt")

    @classmethod
    def from_config(cls, section: Any, client_for: Callable[[str], Any]) -> Answerer:
        return cls(client_for("reader"), **settings(section, prompt=section.prompt or cls.name))

    def __init__(self, client: ModelClient, prompt: Annotated[str, PromptName("answer"), Trust.file] = "long-context"):
        self.client = client
        self.prompt = prompt

    def answer(self, question: Question, ctx: AnswerContext) -> Answer:
        system = render(load_prompt("answer", self.prompt), speakers=_speakers(ctx.conversation),
                        transcript=render_transcript(ctx.conversation))
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": reader_question(question)}]
        ans = Answer(prediction="", prompt=system, rule="model")
        comp = _complete(self.client, ans, msgs)  # an empty reply raises EmptyReply: never an abstention
        ans.prediction, ans.response = comp.text.strip(), comp.text
        ans.context_tokens = count_tokens(system)
        return ans


@ANSWERERS.register("original")
class OriginalAnswerer(Answerer):
    """One retrieval with the question; the top-k memories (plus any preloaded) into one call."""

    name = "original"
    requires_model = True
    uses_preload = True
    answer_settings = ("model", "prompt")

    @classmethod
    def from_config(cls, section: Any, client_for: Callable[[str], Any]) -> Answerer:
        return cls(client_for("reader"), **settings(section, prompt=section.prompt or cls.name))

    def __init__(self, client: ModelClient, prompt: Annotated[str, PromptName("answer"), Trust.file] = "original"):
        self.client = client
        self.prompt = prompt

    def answer(self, question: Question, ctx: AnswerContext) -> Answer:
        pre, pinfo = preload(ctx, question.question)
        res, trace = retrieve(ctx, question.question)
        seen = {e.id for e in res.entries}
        context = res.entries + [e for e in pre if e.id not in seen]
        system = render(load_prompt("answer", self.prompt), speakers=_speakers(ctx.conversation),
                        memories=render_context(context))
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": reader_question(question)}]
        ans = Answer(prediction="", context=context, queries=[trace], prompt=system, preload=pinfo, rule="model")
        comp = _complete(self.client, ans, msgs)
        ans.prediction, ans.response = comp.text.strip(), comp.text
        ans.context_tokens = count_tokens(system)
        return ans


def memory_tools() -> list[dict[str, Any]]:
    return [
        {"type": "function", "function": {
            "name": "memory_search", "description": "Search the conversation's memories.",
            "parameters": {"type": "object", "properties": {
                "query": {"type": "string"},
                "kind": {"type": "string", "enum": ["fact", "episode"]},
                "after": {"type": "string", "description": "Only memories dated on/after (YYYY-MM-DD)."},
                "before": {"type": "string", "description": "Only memories dated on/before (YYYY-MM-DD)."},
                "top_k": {"type": "integer", "minimum": 1, "maximum": 50}},
                "required": ["query"]}}},
        {"type": "function", "function": {
            "name": "memory_load", "description": "Load the most recent memories.",
            "parameters": {"type": "object", "properties": {"limit": {"type": "integer", "minimum": 1,
                                                                       "maximum": 100}}}}},
    ]


@ANSWERERS.register("optimized")
class OptimizedAnswerer(Answerer):
    """The model drives ``memory_search`` / ``memory_load`` for up to ``max_rounds`` rounds, then answers.

    The last round offers no tools (``tool_choice="none"``); a model still calling tools then raises
    `ToolLoopExhausted`. A tool call written as text is parsed or re-asked with the tool forced (by
    the client) and counted in ``malformed_tool_calls``; one that stays unusable raises `MalformedToolCall`.

    On an endpoint declared ``structured_output: json_schema`` each round's reply is one JSON object, a tool
    call or the answer (``{"action": "answer", "answer": ...}``), held to a schema derived from the tools; a
    tool's result comes back as the next user message, and the last round's schema admits only the answer.
    """

    name = "optimized"
    requires_model = True
    uses_preload = True
    answer_settings = ("model", "prompt")

    @classmethod
    def from_config(cls, section: Any, client_for: Callable[[str], Any]) -> Answerer:
        return cls(client_for("reader"), **settings(section, prompt=section.prompt or cls.name))

    def __init__(self, client: ModelClient, prompt: Annotated[str, PromptName("answer"), Trust.file] = "optimized",
                 max_rounds: Annotated[int, Range(1)] = 4):
        self.client = client
        self.prompt = prompt
        self.max_rounds = max_rounds

    def _tool(self, name: str, raw: str, ctx: AnswerContext, ans: Answer) -> str:
        """Run one tool call; errors come back to the model as tool errors, never crash the question."""
        try:
            args = json.loads(raw or "{}")
        except json.JSONDecodeError as e:
            return json.dumps({"error": f"arguments are not valid JSON: {e.msg}"})
        if name == "memory_search":
            q = str(args.get("query") or "").strip()
            if not q:
                return json.dumps({"results": []})  # empty query: empty result
            over: dict[str, Any] = {}
            try:
                if args.get("kind") in ("fact", "episode"):
                    over["kind"] = args["kind"]
                for k in ("after", "before"):
                    if args.get(k):
                        over[k] = datetime.strptime(str(args[k])[:10], "%Y-%m-%d")
                if args.get("top_k"):
                    over["max_results"] = max(1, min(50, int(args["top_k"])))
                res, trace = retrieve(ctx, q, **over)
            except Exception as e:
                ans.queries.append(QueryTrace(query=q, options=over, hits=[], error=str(e)))
                return json.dumps({"error": f"memory_search failed: {e}"})
            ans.queries.append(trace)
            self._add_context(ans, res.entries)
            return json.dumps({"results": [self._mem(e) for e in res.entries]})
        if name == "memory_load":
            try:
                entries = ctx.service.read_recent(ctx.key, max(1, min(100, int(args.get("limit") or 10))))
            except Exception as e:
                log.warning("memory_load tool failed for %s: %s: %s", ctx.key, type(e).__name__, e)
                return json.dumps({"error": f"memory_load failed: {e}"})
            self._add_context(ans, entries)
            return json.dumps({"results": [self._mem(e) for e in entries]})
        return json.dumps({"error": f"unknown tool {name!r}"})

    @staticmethod
    def _mem(e: MemoryEntry) -> dict[str, Any]:
        return {"id": e.id, "text": e.text, "kind": e.kind,
                "date": e.event_time.strftime("%Y-%m-%d") if e.event_time else None,
                "participants": list(e.participants)}

    @staticmethod
    def _add_context(ans: Answer, entries: list[MemoryEntry]) -> None:
        have = {e.id for e in ans.context}
        ans.context.extend(e for e in entries if e.id not in have)

    def answer(self, question: Question, ctx: AnswerContext) -> Answer:
        pre, pinfo = preload(ctx, question.question)
        pre_text = f"## Preloaded memories\n{render_context(pre)}" if pre else ""
        system = render(load_prompt("answer", self.prompt), speakers=_speakers(ctx.conversation), preloaded=pre_text)
        json_mode = self.client.structured_output == "json_schema"
        if json_mode:
            system += "\n\n" + load_prompt("replies", JSON_ACTIONS_PROMPT)
        msgs: list[dict[str, Any]] = [{"role": "system", "content": system},
                                      {"role": "user", "content": reader_question(question)}]
        ans = Answer(prediction="", context=list(pre), prompt=system, preload=pinfo)
        if json_mode:
            return self._answer_json(msgs, ctx, ans)
        tools = memory_tools()
        def no_more_tools(comp: Completion) -> None:  # the last round's reply; checked before it is cached
            if comp.tool_calls:
                names = ", ".join(tc.name for tc in comp.tool_calls)
                raise ToolLoopExhausted(f"{self.client.model}: still calling tools ({names}) after the last round "
                                        f"({self.max_rounds}), though offered none")

        for round_ in range(1, self.max_rounds + 1):
            last = round_ == self.max_rounds
            try:
                comp = _complete(self.client, ans, msgs, tools=tools, tool_choice="none" if last else "auto",
                                 **({"check": no_more_tools} if last else {}))
            except MalformedToolCall as e:
                if not last:
                    raise
                raise ToolLoopExhausted(f"still calling tools after the last round ({self.max_rounds}): {e}",
                                        e.partial) from e
            if not comp.tool_calls:
                ans.prediction, ans.response = comp.text.strip(), comp.text
                ans.rule = f"model answered in round {round_}"
                break
            # ``content`` always sent (litellm drops a None one, and llama.cpp's template then fails with 500)
            msgs.append({"role": "assistant", "content": comp.text or "", "tool_calls": [
                {"id": tc.id, "type": "function", "function": {"name": tc.name, "arguments": tc.arguments}}
                for tc in comp.tool_calls]})
            for tc in comp.tool_calls:
                ans.tool_calls.append({"round": round_, "name": tc.name, "arguments": tc.arguments})
                msgs.append({"role": "tool", "tool_call_id": tc.id, "content": self._tool(tc.name, tc.arguments, ctx,
                                                                                           ans)})
        ans.context_tokens = count_tokens(json.dumps(msgs, default=str))
        return ans

    def _answer_json(self, msgs: list[dict[str, Any]], ctx: AnswerContext, ans: Answer) -> Answer:
        """The tool loop with each step one JSON object (``structured_output: json_schema``)."""
        answer_only = {"type": "object", "required": ["action", "answer"], "properties": {
            "action": {"type": "string", "const": "answer"},
            "answer": {"type": "string", "minLength": 1, "maxLength": 300}}}
        steps = tools_as_schema(memory_tools(), "action", [answer_only])
        got: list[ToolCall] = []

        def read(comp: Completion) -> None:  # also run on a cached reply; unreadable: BadReply, not cached
            got[:] = calls_from_json(comp.text, "action")
            if got[0].name == "answer" and not str(json.loads(got[0].arguments).get("answer", "")).strip():
                raise ValueError(f"the answer is empty: {comp.text[:120]!r}")

        for round_ in range(1, self.max_rounds + 1):
            last = round_ == self.max_rounds
            comp = _complete(self.client, ans, msgs, check=read, response_format={
                "type": "json_schema", "json_schema": {"name": "step", "schema": answer_only if last else steps}})
            step = got[0]
            if step.name == "answer":
                ans.prediction = str(json.loads(step.arguments)["answer"]).strip()
                ans.response, ans.rule = comp.text, f"model answered in round {round_}"
                break
            ans.tool_calls.append({"round": round_, "name": step.name, "arguments": step.arguments})
            msgs.append({"role": "assistant", "content": comp.text})
            msgs.append({"role": "user", "content": f"{step.name} returned: "
                                                    f"{self._tool(step.name, step.arguments, ctx, ans)}"})
        ans.context_tokens = count_tokens(json.dumps(msgs, default=str))
        return ans
