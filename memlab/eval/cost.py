"""Cost as the reference should have counted it: answering *and* building the memory, in tokens and dollars.

The reference reports Tokens/QA of the answering calls only. A memory system also pays, once per
conversation, for extraction calls and for embeddings (every memory written, every reconcile search,
every old-memory lookup), and a run pays for its judge. Here each is its own column, per question:

- ``answer_tokens_qa``: answering prompt + completion tokens sent to and returned by a model (0 for an
  offline reader: it sends nothing; what it read is ``context_tokens_qa``, a column of its own);
- ``extract_tokens_qa``: extraction calls' prompt + completion tokens, amortized (below);
- ``embedding_tokens_qa``: tokens of the texts embedded to build the memory (o200k count of each written
  memory's index text, each reconcile query, each old-memory lookup query), amortized; for an arm
  that indexes raw turns itself (session-recall), the turn texts it embedded;
- ``judge_tokens_qa``: the judge call's prompt + completion tokens;
- ``model_tokens_qa``: all of the above, every token a model processed for the question (context
  tokens of an offline reader are not among them); ``*_cached_tokens_qa``: the prompt tokens served from the
  provider's prompt cache, a part of the prompt tokens (shown separately, priced at the cache rate).

Amortized: a conversation's build cost is divided by the number of questions of that conversation
in the dataset (the memory is built once for all of them), and each question carries its share; a
full run's shares add up to the full build cost (a subset run's do not: ``run.json`` ``cost``
holds the run's build totals).

Dollars: litellm's bundled price map (``litellm.model_cost``, read offline with
``LITELLM_LOCAL_MODEL_COST_MAP=True``): input, output and cache-read prices per token. A user price
table (YAML mapping or CSV; USD per million tokens) overrides it. A model served from a local
endpoint (``models.api_base`` on this machine), the offline embedders (tfidf-lsa, minilm) and a model the map
does not know cost 0, and `PriceTable.price` says which of these applied (``source``); an ``api_base`` on another
machine (a hosted API behind its own address) is priced by its model name like the provider's own.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from memlab.index.embedders import embedder_model
from memlab.index.hybrid import index_text
from memlab.llm import count_tokens, is_local
from memlab.memory.entry import MemoryEntry, UserKey

#: Summary columns renamed so that each says what it counts (old run folders are read with the new names).
RENAMED = {"tokens_qa": "answer_tokens_qa", "embed_tokens_qa": "embedding_tokens_qa",
           "total_tokens_qa": "model_tokens_qa"}
#: Results of applied ops that wrote a memory text (and so embedded it).
WRITES = ("added", "updated", "superseded", "update->add", "update->add (append-only)")
#: Reconcile tiers that ran a search for the proposed text.
SEARCHED = ("skip", "update", "keep", "search-failed")
_KEY = UserKey("cost", "cost")


class PriceTableError(ValueError):
    """A user price table is malformed (the message names the file, row and field)."""


@dataclass(frozen=True)
class Price:
    input: float = 0.0
    output: float = 0.0
    cached_input: float = 0.0
    """USD per token; ``cached_input`` is the price of a prompt token served from the provider's cache."""
    source: str = "none"
    """Where the price came from: ``litellm``, ``user table``, ``local (...)``, ``unknown (...)``, ``none``."""

    def cost(self, prompt: float, completion: float = 0.0, cached: float = 0.0) -> float:
        cached = min(cached, prompt)
        return (prompt - cached) * self.input + cached * self.cached_input + completion * self.output


class PriceTable:
    """Prices per model: the user's table first, then litellm's bundled map; local and unknown cost 0."""

    def __init__(self, overrides: Mapping[str, Price] | None = None):
        self.overrides = dict(overrides or {})

    @classmethod
    def of(cls, prices: str | Path | None) -> PriceTable:
        """A run's prices: the user's table (``cost.prices``) when one is named, else litellm's price map alone."""
        return cls.from_file(prices) if prices else cls()

    @classmethod
    def from_file(cls, path: str | Path) -> PriceTable:
        """YAML ``{model: {input: , output: , cached_input: }}`` or CSV ``model,input,output,cached_input``;
        USD per million tokens; ``cached_input`` defaults to ``input``."""
        p = Path(path)
        if not p.is_file():
            raise PriceTableError(f"{p}: no such price table")
        if p.suffix.lower() == ".csv":
            with open(p, newline="", encoding="utf-8") as f:
                rows = list(csv.DictReader(f))
            items = {}
            for i, r in enumerate(rows, start=2):
                if not (r.get("model") or "").strip():
                    raise PriceTableError(f"{p}: line {i}: column 'model' is empty; expected a model name")
                items[r["model"].strip()] = {k: r.get(k) for k in ("input", "output", "cached_input")}
        else:
            try:
                items = yaml.safe_load(p.read_text(encoding="utf-8"))
            except yaml.YAMLError as e:
                raise PriceTableError(f"{p}: not valid YAML ({e})") from e
            if not isinstance(items, dict):
                raise PriceTableError(f"{p}: expected a mapping of model name -> prices, got {type(items).__name__}")
        out = {}
        for model, d in items.items():
            if not isinstance(d, dict):
                raise PriceTableError(f"{p}: {model}: expected input/output/cached_input, got {d!r}")
            vals = {}
            for k in ("input", "output", "cached_input"):
                v = d.get(k)
                if v in (None, "") and k != "input":
                    continue
                try:
                    vals[k] = float(v)
                except (TypeError, ValueError):
                    raise PriceTableError(f"{p}: {model}: {k} = {v!r}; expected USD per million tokens") from None
                if vals[k] < 0:
                    raise PriceTableError(f"{p}: {model}: {k} = {v!r}; expected a price >= 0")
            inp = vals["input"] / 1e6
            out[str(model)] = Price(inp, vals.get("output", 0.0) / 1e6,
                                    vals.get("cached_input", vals["input"]) / 1e6, "user table")
        return cls(out)

    def price(self, model: str | None, api_base: str | None = None) -> Price:
        if not model:
            return Price(source="none")
        try:  # an embedder spec: its model, or None for one that runs here
            name = embedder_model(model)
        except ValueError:  # a chat model's name
            name = model
        if name in self.overrides:
            return self.overrides[name]
        if name is None:
            return Price(source=f"local ({model} runs here)")
        if api_base and is_local(api_base):
            return Price(source=f"local (api_base {api_base})")
        from memlab.llm import import_litellm  # only when a hosted model is priced (the import takes seconds)

        table = import_litellm().model_cost
        info = table.get(name) or table.get(name.split("/", 1)[-1]) or {}
        if "input_cost_per_token" not in info:
            return Price(source=f"unknown ({name} is not in litellm's price map: priced 0)")
        inp = float(info.get("input_cost_per_token") or 0.0)
        cached = info.get("cache_read_input_token_cost")
        return Price(inp, float(info.get("output_cost_per_token") or 0.0),
                     inp if cached is None else float(cached), "litellm")


# ------------------------------------------------------------------------------- build accounting
def _index_tokens(op: Mapping[str, Any], date_in_text: bool) -> int:
    from datetime import datetime

    et = op.get("event_time")
    if isinstance(et, str):
        et = datetime.fromisoformat(et)
    e = MemoryEntry(id="x", key=_KEY, text=op.get("text") or "", event_time=et, topics=tuple(op.get("topics") or ()))
    return count_tokens(index_text(e, date_in_text))


def build_usage(conversation: str, results: Iterable[Any], date_in_text: bool = True) -> dict[str, Any]:
    """One conversation's memory-building usage from its extraction jobs (`memlab.extract.worker.JobResult`)."""
    row = {"conversation": conversation, "extract_calls": 0, "extract_prompt_tokens": 0,
           "extract_completion_tokens": 0, "extract_cached_tokens": 0, "extract_estimated": False,
           "embed_tokens": 0, "embed_texts": 0}
    for res in results:
        u = getattr(res, "usage", None)
        if u is not None and hasattr(u, "prompt_tokens"):
            row["extract_calls"] += 1
            row["extract_prompt_tokens"] += int(u.prompt_tokens)
            row["extract_completion_tokens"] += int(u.completion_tokens)
            row["extract_cached_tokens"] += int(u.cached_tokens)
            row["extract_estimated"] = row["extract_estimated"] or bool(u.estimated)
        if getattr(res, "lookup_query", ""):
            row["embed_tokens"] += count_tokens(res.lookup_query)
            row["embed_texts"] += 1
        for a in getattr(res, "applied", []):
            op = a.op.to_dict()
            if a.decision.tier in SEARCHED:
                row["embed_tokens"] += count_tokens(op.get("text") or "")
                row["embed_texts"] += 1
            if a.result in WRITES:
                row["embed_tokens"] += _index_tokens(op, date_in_text)
                row["embed_texts"] += 1
    return row


def add_build(previous: Mapping[str, Any] | None, row: Mapping[str, Any]) -> dict[str, Any]:
    """Two build-usage rows of one conversation summed (an extraction resumed after a failure spent both)."""
    if not previous:
        return dict(row)
    out = {**previous, **{c: previous.get(c, 0) + row.get(c, 0) for c in BUILD_COLS}}
    out["extract_estimated"] = bool(previous.get("extract_estimated")) or bool(row.get("extract_estimated"))
    return out


def index_usage(texts_by_conversation: Mapping[str, list[str]]) -> list[dict[str, Any]]:
    """Build rows for an arm that indexes texts itself (e.g. the session-recall turn index)."""
    return [{"conversation": c, "embed_tokens": sum(count_tokens(t) for t in ts), "embed_texts": len(ts)}
            for c, ts in texts_by_conversation.items()]


BUILD_COLS = ("extract_calls", "extract_prompt_tokens", "extract_completion_tokens", "extract_cached_tokens",
              "embed_tokens", "embed_texts")


def amortize(pred: pd.DataFrame, build: pd.DataFrame, questions_per_conversation: Mapping[str, int],
             expect_build: bool = False) -> pd.DataFrame:
    """Per question, its conversation's build usage divided by that conversation's question count.

    ``expect_build``: the arm built a memory, so a conversation without a build record has an
    *unknown* build cost (NaN: e.g. an extraction cache written before build costs were logged),
    never a silent 0."""
    out = pred.copy()
    sums = build.groupby("conversation")[[c for c in BUILD_COLS if c in build]].sum() if len(build) else None
    by_conv = sums.to_dict("index") if sums is not None else {}  # one lookup per question, not a .loc per cell
    for c in BUILD_COLS:
        share = []
        for conv in out.conversation_id:
            n = questions_per_conversation.get(conv, 0)
            row = by_conv.get(conv)
            if row is None and expect_build:
                share.append(float("nan"))
                continue
            v = float(row[c]) if row is not None and c in row else 0.0
            share.append(v / n if n else 0.0)
        out[c] = share
    return out


def unknown_build(pred: pd.DataFrame) -> list[str]:
    """Conversations whose build cost is unknown (see `amortize`)."""
    if "embed_tokens" not in pred:
        return []
    return sorted(set(pred.loc[pred["embed_tokens"].isna(), "conversation_id"]))


@dataclass(frozen=True)
class Models:
    """Which model did what (None: no model; the offline parts) and where it was served."""

    answer: str | None = None
    extract: str | None = None
    embed: str | None = None
    judge: str | None = None
    api_base: str | None = None
    api_bases: Mapping[str, str | None] | None = None
    """Per role (answer, extract, embed, judge), where it differs from ``api_base``."""

    def base(self, role: str) -> str | None:
        return (self.api_bases or {}).get(role, self.api_base)


def add_dollars(pred: pd.DataFrame, models: Models, table: PriceTable | None = None
                ) -> tuple[pd.DataFrame, dict[str, str]]:
    """Per-question USD columns (answer, extract, embed, judge, total) and where each price came from."""
    table = table or PriceTable()
    prices = {role: table.price(getattr(models, role), models.base(role))
              for role in ("answer", "extract", "embed", "judge")}
    out = pred.copy()

    def col(name: str) -> pd.Series:
        return out[name].astype(float) if name in out else pd.Series(0.0, index=out.index)  # NaN stays unknown

    out["answer_usd"] = [prices["answer"].cost(p, c, k) for p, c, k in
                         zip(col("prompt_tokens"), col("completion_tokens"), col("cached_tokens"))]
    out["extract_usd"] = [prices["extract"].cost(p, c, k) for p, c, k in
                          zip(col("extract_prompt_tokens"), col("extract_completion_tokens"),
                              col("extract_cached_tokens"))]
    out["embed_usd"] = [prices["embed"].cost(t) for t in col("embed_tokens")]
    out["judge_usd"] = [prices["judge"].cost(p, c, k) for p, c, k in
                        zip(col("judge_prompt_tokens"), col("judge_completion_tokens"), col("judge_cached_tokens"))]
    out["total_usd"] = out[["answer_usd", "extract_usd", "embed_usd", "judge_usd"]].sum(axis=1, skipna=False)
    return out, {role: p.source for role, p in prices.items()}


def cost_columns(g: pd.DataFrame) -> dict[str, float]:
    """The summary's cost columns for one group of questions (means per question)."""
    n = max(len(g), 1)

    def s(name: str) -> float:  # NaN when any question's value is unknown (never summed as 0)
        return float(g[name].sum(skipna=False)) if name in g else 0.0

    answer = s("prompt_tokens") + s("completion_tokens")
    extract = s("extract_prompt_tokens") + s("extract_completion_tokens")
    embed = s("embed_tokens")
    judge = s("judge_prompt_tokens") + s("judge_completion_tokens")
    return {
        "answer_tokens_qa": answer / n, "extract_tokens_qa": extract / n,
        "extract_cached_tokens_qa": s("extract_cached_tokens") / n, "embedding_tokens_qa": embed / n,
        "judge_tokens_qa": judge / n, "judge_cached_tokens_qa": s("judge_cached_tokens") / n,
        "build_tokens_qa": (extract + embed) / n, "model_tokens_qa": (answer + extract + embed + judge) / n,
        "answer_usd_qa": s("answer_usd") / n, "build_usd_qa": (s("extract_usd") + s("embed_usd")) / n,
        "judge_usd_qa": s("judge_usd") / n, "total_usd_qa": s("total_usd") / n,
    }
