"""What a run will ask of its models, before it asks anything (``memlab run CONFIG --plan``).

Per role: calls, prompt tokens and completion tokens, counted from the real prompts over the real data (o200k, as
memlab counts offline); dollars from litellm's price map or the user's table (``cost.prices``), "unknown price"
said plainly; for a local endpoint, the wall time from a short measured throughput probe (two small requests:
the one model call `--plan` makes, and only when asked for, `probe=True`). Every figure is a bound or an
estimate, and says which:

- extraction: one call per session (the worker's job; checkers can only merge or skip jobs). Its prompt is the
  extractor's own message list for the session's turns, rendered exactly, plus the old memories the worker
  shows it (up to `memlab.extract.worker.OLD_MEMORY_LIMIT`, estimated at the dataset's mean annotated-fact
  length: what they will say depends on the model's earlier replies);
- answering: per question, the arm's own prompt with ``retrieval.top_k`` memories of the mean length of the
  memories the extractor writes (turns: the turns; observations and model extraction: LoCoMo's annotated facts,
  the nearest stand-in for what a model writes); long-context: the whole transcript, exact; optimized: up to
  ``answer.params.max_rounds`` calls, each carrying the earlier rounds' results;
- judge: ``judge.repeats`` calls per judged question, the profile's prompt with the gold and a prediction of
  the reader's ``max_tokens`` (its bound);
- completion tokens: calls x the role's ``max_tokens``, an upper bound (a reply past it is an error).

The response cache is not consulted: a rerun that finds its replies there calls nothing, so this is the cost of
a cold run. `run.json` keeps the plan (``plan``) beside what the run used (``models.by_role``).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass, field
from statistics import mean
from typing import Any

from memlab.data import Conversation, Question
from memlab.llm import ModelClient, ModelError, count_tokens, is_local, prompt_tokens_estimate
from memlab.run.config import ExperimentConfig

#: The prompt and reply sizes of the throughput probe (words and tokens: about 600 prompt tokens).
PROBE_PROMPT_WORDS = 200
PROBE_REPLY_TOKENS = 48


@dataclass
class RolePlan:
    role: str
    model: str
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens_max: int = 0
    usd: float | None = 0.0
    price: str = ""
    """Where the price came from (litellm, user table, local, unknown: priced 0)."""
    seconds: tuple[float, float] | None = None
    """Local endpoint: (prompt processing alone, with every reply at its max_tokens), from the probe."""
    notes: list[str] = field(default_factory=list)


@dataclass
class Plan:
    questions: int
    conversations: int
    sessions: int
    roles: dict[str, RolePlan]
    embedding_texts: int = 0
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"questions": self.questions, "conversations": self.conversations, "sessions": self.sessions,
                "embedding_texts": self.embedding_texts, "notes": list(self.notes),
                "roles": {r: asdict(p) for r, p in self.roles.items()}}

    def table(self) -> list[dict[str, Any]]:
        """One row per role (what the CLI prints and a notebook shows)."""
        rows = []
        for p in self.roles.values():
            rows.append({"role": p.role, "model": p.model, "calls": p.calls, "prompt_tokens": p.prompt_tokens,
                         "completion_tokens_max": p.completion_tokens_max,
                         "usd": "unknown price" if p.usd is None else round(p.usd, 4), "price": p.price,
                         "wall_s": "-" if p.seconds is None else f"{p.seconds[0]:.0f}-{p.seconds[1]:.0f}"})
        return rows


def _mean_tokens(texts: list[str], fallback: int) -> float:
    return mean(count_tokens(t) for t in texts) if texts else float(fallback)


def _memory_tokens(cfg: ExperimentConfig, convs: list[Conversation]) -> tuple[float, str]:
    """Mean tokens of one memory line as a reader sees it (dated), and what it was measured on."""
    date = 8  # "- [7 May 2023] "
    turns = [f"{t.speaker}: {t.searchable_text}" for c in convs for t in c.turns]
    facts = [o.text for c in convs for o in c.observations]
    if cfg.extraction.name == "turns" or not facts:
        return _mean_tokens(turns, 30) + date, "turns"
    if cfg.extraction.name == "observations":
        return _mean_tokens(facts, 20) + date, "annotated facts"
    n_t, n_f = len(turns), len(facts)
    both = (_mean_tokens(turns, 30) * n_t + _mean_tokens(facts, 20) * n_f) / max(1, n_t + n_f)
    return both + date, "turns and annotated facts (stand-in for the model's memories)"


def _extraction(cfg: ExperimentConfig, convs: list[Conversation], extractor: Any, plan: RolePlan) -> int:
    from memlab.extract.extractors import ExtractionRequest, LLMExtractor, TurnsAndLLM
    from memlab.extract.messages import locomo_messages
    from memlab.extract.tool_calls import extraction_tools
    from memlab.extract.worker import OLD_MEMORY_LIMIT
    from memlab.memory.entry import UserKey

    facts = [o.text for c in convs for o in c.observations]
    per_old = _mean_tokens(facts, 20) + 10
    sessions = 0
    llm = extractor.llm if isinstance(extractor, TurnsAndLLM) else extractor  # turns+llm: its model part
    if not isinstance(llm, LLMExtractor):  # a user's own model extractor: its prompt is its own
        plan.notes.append(f"{type(extractor).__name__}: one call per session; its prompt is not memlab's, so its "
                          "tokens are not counted")
        llm = None
    tools = extraction_tools() if llm is not None and llm._client().structured_output == "tools" else None
    for conv in convs:
        seen = 0
        for s in conv.sessions:
            delta = locomo_messages(conv, session_index=s.index)
            if not delta:
                continue
            sessions += 1
            plan.calls += 1
            if llm is not None:
                msgs = llm.build_messages(ExtractionRequest(key=UserKey("plan", conv.sample_id), delta=delta,
                                                            old_memories=[]))
                plan.prompt_tokens += prompt_tokens_estimate(msgs, tools) + int(min(seen, OLD_MEMORY_LIMIT) * per_old)
            seen += len(delta)
    plan.notes.append(f"old memories shown to the extractor estimated at {per_old:.0f} tokens each (up to "
                      f"{OLD_MEMORY_LIMIT} a call)")
    if any(v is not None for v in asdict(cfg.extraction.checkers).values() if not isinstance(v, str)):
        plan.notes.append("checkers set: calls are an upper bound (a checker can merge or skip sessions)")
    return sessions


def _answering(cfg: ExperimentConfig, picks: list[tuple[Conversation, Question]], plan: RolePlan,
               mem_tokens: float, reader_cap: int) -> None:
    from memlab.answer import ANSWERERS
    from memlab.answer.llm_arms import reader_question, render_transcript
    from memlab.params import resolved_params
    from memlab.prompts import load_prompt, render

    arm = cfg.answer.name
    own = resolved_params(ANSWERERS.get(arm), cfg.answer.params)  # the arm's settings in force
    k = cfg.retrieval.top_k
    prompt_name = cfg.answer.prompt or arm
    for conv, q in picks:
        qtok = count_tokens(reader_question(q)) + 8
        speakers = " and ".join(conv.speakers)
        if arm == "long-context":
            sys_tok = count_tokens(render(load_prompt("answer", prompt_name), speakers=speakers,
                                          transcript=render_transcript(conv)))
            plan.calls += 1
            plan.prompt_tokens += sys_tok + qtok
        elif arm == "optimized":
            base = count_tokens(load_prompt("answer", prompt_name)) + qtok + 300  # the tools' schema
            rounds = own["max_rounds"]
            plan.calls += rounds
            # round r carries every earlier round's call and its k results
            plan.prompt_tokens += int(sum(base + (r - 1) * (k * (mem_tokens + 15) + reader_cap)
                                          for r in range(1, rounds + 1)))
        elif arm == "session-recall":
            per_session = mean(count_tokens(" ".join(t.searchable_text for t in s.turns)) + 10
                               for s in conv.sessions) if conv.sessions else 0
            n = own["max_units"] if own["unit"] == "session" else own["max_units"] * (
                2 * own["window"] + 1) * 25 / max(per_session, 1)
            plan.calls += 1
            plan.prompt_tokens += int(count_tokens(load_prompt("answer", prompt_name)) + n * per_session + qtok)
        else:  # original (and any arm built like it): the template and k memories
            plan.calls += 1
            plan.prompt_tokens += int(count_tokens(load_prompt("answer", prompt_name)) + k * mem_tokens + qtok)
    if arm == "optimized":
        plan.notes.append(f"optimized: up to {own['max_rounds']} calls a question (an answer ends it earlier)")


def _judging(cfg: ExperimentConfig, picks: list[tuple[Conversation, Question]], plan: RolePlan,
             reader_cap: int) -> None:
    from memlab.eval.profiles import get_profile

    prof = get_profile(cfg.scoring.profile)
    pred = "word " * reader_cap
    for _, q in picks:
        gold = prof.judge_gold(q.answer, q.category)
        if gold is None:
            continue
        msgs = prof.judge_messages(q.question, gold, pred, prof.judge_prompt_for(q.category, cfg.judge.prompt))
        plan.calls += cfg.judge.repeats
        plan.prompt_tokens += cfg.judge.repeats * prompt_tokens_estimate(msgs)


def probe_throughput(client: ModelClient) -> tuple[float, float]:
    """(prompt tokens/s, generated tokens/s) of a local endpoint, from two small requests (not cached; each is
    cut at its max_tokens on purpose, and what it computed is what is measured). Each prompt starts with a nonce: a
    server that keeps a prompt's KV cache (llama.cpp does) would otherwise serve a second probe's prompt from it and
    report a prefill rate a hundred times the real one."""
    probe = ModelClient(client.model, api_base=client.api_base, api_key=client.api_key, timeout=client.timeout,
                        max_retries=0, temperature=0.0)

    def measured(content: str, max_tokens: int) -> tuple[Any, float]:
        t0 = time.perf_counter()
        try:
            usage = probe.complete([{"role": "user", "content": content}], max_tokens=max_tokens,
                                   cache_tag=f"probe-{time.time()}").usage
        except ModelError as e:
            if not e.partial.usage.prompt_tokens:  # not an answer cut short: the endpoint failed
                raise
            usage = e.partial.usage
        return usage, max(time.perf_counter() - t0, 1e-3)

    nonce = f"{uuid.uuid4().hex[:12]}:"  # differs from its first character on (a shared prefix is cached)
    text = f"{nonce} Read this and reply with one word. " + " ".join(f"word{i}" for i in range(PROBE_PROMPT_WORDS))
    usage, took = measured(text, 1)
    prefill = usage.prompt_tokens / took
    usage, took = measured(f"{nonce} Count from one to one hundred in words.", PROBE_REPLY_TOKENS)
    return prefill, usage.completion_tokens / took


def make_plan(cfg: ExperimentConfig, picks: list[tuple[Conversation, Question]], convs: list[Conversation],
              comps: Any, clients: Any, probe: bool = False) -> Plan:
    """The run's plan (see the module); ``comps``/``clients``: the run's built components and model clients
    (building them calls no model; ``clients`` is only needed with ``probe``). ``probe``: measure each local
    endpoint's throughput for the wall time."""
    from memlab.eval.cost import PriceTable

    table = PriceTable.of(cfg.cost.prices)
    roles: dict[str, RolePlan] = {}
    reader_cap = cfg.models.resolve("reader")["max_tokens"] or 256
    mem_tokens, mem_source = _memory_tokens(cfg, convs)
    sessions = sum(len(c.sessions) for c in convs)
    needs_memory = comps.answerer.needs_memory
    if cfg.role_in_use("extractor") and needs_memory and comps.extractor is not None and not comps.on_system:
        p = roles["extractor"] = RolePlan("extractor", cfg.extraction.model or "")
        sessions = _extraction(cfg, convs, comps.extractor, p)
    elif comps.on_system and needs_memory and (cfg.system.params or {}).get("infer"):
        p = roles["extractor"] = RolePlan("extractor", (cfg.system.params or {}).get("model") or
                                          cfg.extraction.model or "")
        p.calls = 2 * sessions  # mem0: its fact extraction, then its update decision, per session ingested
        p.prompt_tokens = 2 * sum(count_tokens(" ".join(t.searchable_text for t in c.turns)) for c in convs)
        p.notes.append(f"{cfg.system.name}: 2 calls a session (its own extraction and update prompts, not counted: "
                       "prompt tokens are the sessions' turns twice)")
    if cfg.role_in_use("reader"):
        p = roles["reader"] = RolePlan("reader", cfg.answer.model or "")
        _answering(cfg, picks, p, mem_tokens, reader_cap)
        if comps.answerer.uses_retrieval:
            p.notes.append(f"retrieved memories estimated at {mem_tokens:.0f} tokens each ({mem_source})")
    if cfg.role_in_use("judge") and comps.judge is not None:
        p = roles["judge"] = RolePlan("judge", cfg.judge.model or "")
        _judging(cfg, picks, p, reader_cap)
    plan = Plan(questions=len(picks), conversations=len(convs), sessions=sessions, roles=roles)
    if cfg.index.embedder_model() is not None and needs_memory:
        plan.embedding_texts = sum(len(c.turns) for c in convs) + len(picks)
        plan.notes.append(f"embedder {cfg.index.embedder.name}: about {plan.embedding_texts:,} texts (the turns as a "
                          f"bound for the memories, and the questions)")
    rates: dict[str, tuple[float, float]] = {}
    for role, p in roles.items():
        ep = cfg.models.resolve(role)
        p.completion_tokens_max = p.calls * int(ep["max_tokens"] or 0)
        price = table.price(p.model, ep["api_base"])
        p.price = price.source
        p.usd = None if price.source.startswith("unknown") else price.cost(p.prompt_tokens, p.completion_tokens_max)
        if probe and ep["api_base"] and is_local(ep["api_base"]):
            key = ep["api_base"]
            if key not in rates:
                try:
                    rates[key] = probe_throughput(clients.for_role(role))
                except ModelError as e:
                    plan.notes.append(f"{key}: the throughput probe failed ({e}); no wall time")
                    rates[key] = (0.0, 0.0)
            pp, tg = rates[key]
            if not pp or not tg:
                continue
            low = p.prompt_tokens / pp
            p.seconds = (low, low + p.completion_tokens_max / tg)
    for base, (pp, tg) in rates.items():
        if pp and tg:
            plan.notes.append(f"{base}: measured {pp:.0f} prompt tokens/s and {tg:.1f} generated tokens/s "
                              f"(throughput probe, 2 requests)")
    if any(p.usd is None for p in roles.values()):
        plan.notes.append("unknown price: a model litellm's price map does not list; give cost.prices a table")
    plan.notes += cap_notes(cfg, roles)
    return plan


def cap_notes(cfg: ExperimentConfig, roles: dict[str, RolePlan]) -> list[str]:
    """The spend cap (``run.max_calls``, ``run.max_usd``) beside the plan: would a cold run stop before it ends?"""
    out = []
    calls = sum(p.calls for p in roles.values())
    if cfg.run.max_calls is not None:
        out.append(f"spend cap run.max_calls={cfg.run.max_calls:,}: the plan needs {calls:,} calls (retries add more): "
                   + ("a cold run stops before it ends (resume with a raised cap)" if calls > cfg.run.max_calls
                      else "within the cap"))
    if cfg.run.max_usd is not None and roles and all(p.usd is not None for p in roles.values()):
        bound = sum(p.usd or 0.0 for p in roles.values())
        out.append(f"spend cap run.max_usd={cfg.run.max_usd:g}: the plan's bound is ${bound:.4f} (every reply at "
                   f"max_tokens): " + ("a cold run may stop before it ends" if bound > cfg.run.max_usd
                                       else "within the cap"))
    return out


def format_plan(plan: Plan) -> str:
    rows = plan.table()
    head = (f"plan: {plan.questions} questions over {plan.conversations} conversation(s), {plan.sessions} "
            f"session(s); no model called{'' if not any(p.seconds for p in plan.roles.values()) else ' but the probe'}")
    if not rows:
        return head + "\nno model role in this config: nothing to call"
    cols = list(rows[0])
    width = {c: max(len(c), *(len(f"{r[c]:,}" if isinstance(r[c], int) else str(r[c])) for r in rows)) for c in cols}
    lines = [head, "  ".join(c.ljust(width[c]) for c in cols)]
    for r in rows:
        lines.append("  ".join((f"{r[c]:,}" if isinstance(r[c], int) else str(r[c])).ljust(width[c]) for c in cols))
    lines.append("completion_tokens_max: calls x the role's max_tokens (a bound); wall_s: prompt processing alone - "
                 "with every reply at max_tokens")
    for p in plan.roles.values():
        lines += [f"{p.role}: {n}" for n in p.notes]
    lines += plan.notes
    return "\n".join(lines)


def plan_config(cfg: ExperimentConfig, probe: bool = False) -> Plan:
    """The plan of a config as a run would build it (data loaded and questions selected, components built; no
    run folder, no model call but the optional probe)."""
    import tempfile
    from pathlib import Path

    from memlab.run.clients import Clients
    from memlab.run.steps import build_components, prepare

    p = prepare(cfg, {}, None)
    with tempfile.TemporaryDirectory() as tmp:
        clients = Clients(p.cfg, Path(tmp) / "responses.sqlite")
        comps = build_components(p.cfg, clients, p.errata)
        return make_plan(p.cfg, p.picks, p.convs, comps, clients, probe=probe)


PLAN_NOTE = ("Planned before any call (memlab run --plan); completion_tokens_max is the bound calls x max_tokens; "
             "actual counts every session of the run.")


def used_by_role(info: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """What each role used over every session of the run (a run stopped or interrupted, then resumed, counts all of
    them), else what its last session recorded (``models.by_role``, a run.json older than per-session counts)."""
    sessions = info.get("sessions") or []
    if not sessions or any("models_by_role" not in s for s in sessions):
        return (info.get("models") or {}).get("by_role") or {}
    out: dict[str, dict[str, Any]] = {}
    for s in sessions:
        for role, r in s["models_by_role"].items():
            acc = out.setdefault(role, {})
            for k, v in r.items():
                acc[k] = acc.get(k, 0) + v if isinstance(v, (int, float)) and not isinstance(v, bool) else v
    return out


def plan_vs_actual(info: dict[str, Any]) -> list[dict[str, Any]]:
    """Per role, the plan run.json kept (``plan``) beside what the run used (`used_by_role`): calls, prompt
    tokens, completion tokens (planned: the max_tokens bound)."""
    planned = (info.get("plan") or {}).get("roles") or {}
    used = used_by_role(info)
    rows = []
    for role in [r for r in ("extractor", "reader", "judge") if r in planned or r in used]:
        p, a = planned.get(role, {}), used.get(role, {})
        rows.append({"role": role, "calls_planned": p.get("calls"), "calls": a.get("calls"),
                     "prompt_tokens_planned": p.get("prompt_tokens"), "prompt_tokens": a.get("prompt_tokens"),
                     "completion_tokens_max": p.get("completion_tokens_max"),
                     "completion_tokens": a.get("completion_tokens"), "truncated": a.get("truncated")})
    return rows


def format_plan_vs_actual(info: dict[str, Any]) -> str | None:
    """One line: per role, planned / actual calls and tokens (None: the run kept no plan)."""
    rows = [r for r in plan_vs_actual(info) if r["calls_planned"] is not None]
    if not rows:
        return None
    return "plan vs actual (per role; planned completion tokens are the max_tokens bound): " + "; ".join(
        f"{r['role']} calls {r['calls_planned']:,} / {r['calls'] or 0:,}, prompt tokens {r['prompt_tokens_planned']:,}"
        f" / {r['prompt_tokens'] or 0:,}, completion tokens <= {r['completion_tokens_max']:,} / "
        f"{r['completion_tokens'] or 0:,}" for r in rows)
