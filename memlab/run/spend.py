"""A run's spend cap (``run.max_calls``, ``run.max_usd``) and its record in run.json (``spend``).

Every run counts what it sends (`memlab.llm.spend.SpendCap`, installed for the run's duration), capped or not, so
run.json's ``spend`` holds the calls and dollars of all its sessions and a resume starts from them. With a cap, a
request that could pass it is not sent: the run stops through its interrupt path (`SpendCapReached`), marked
``stopped`` with the reason, every finished question and extraction cursor kept, nothing scored; ``memlab run
--resume RUN --set run.max_calls=N`` (or ``run.max_usd``; these two keys need no ``--force-config``: they decide
no result) goes on from there.
"""

from __future__ import annotations

import sys
from typing import Any

from memlab.llm.spend import SpendCap
from memlab.run.config import ConfigError, ExperimentConfig
from memlab.run.config_models import ROLES
from memlab.run.records import RunStatus

#: The config keys a resume may change without ``--force-config`` (they decide no result, only when it stops).
SPEND_KEYS = ("run.max_calls", "run.max_usd")


def priced_models(cfg: ExperimentConfig) -> list[tuple[str, str, str | None]]:
    """(role, model, api_base) of every model the run may send requests to (a memory system's own included)."""
    from memlab.run.clients import role_model

    out = []
    for role in ROLES:
        model = role_model(cfg, role)
        if model and (role == "embedder" or cfg.role_in_use(role)):
            out.append((role, model, cfg.models.resolve(role)["api_base"]))
    params = cfg.system.params or {}
    sys_model = params.get("model") or cfg.extraction.model if cfg.system.name != "memlab" else None
    if sys_model and params.get("infer"):  # mem0 asks the extractor's endpoint itself, by the model's bare name
        out.append(("extractor (mem0)", str(sys_model).removeprefix("openai/"),
                    cfg.models.resolve("extractor")["api_base"]))
    return out


def spend_cap(cfg: ExperimentConfig, prev: dict[str, Any]) -> SpendCap:
    """The run's cap, counting on from what its earlier sessions spent (``prev``: the resumed run.json). With
    ``run.max_usd``, a model without a known price is refused here, before any work."""
    from memlab.eval.cost import PriceTable

    table = PriceTable.of(cfg.cost.prices)
    if cfg.run.max_usd is not None:
        sources = [(role, model, table.price(model, base).source) for role, model, base in priced_models(cfg)]
        unknown = [f"{role} {model} ({src.removeprefix('unknown (').removesuffix(')').split(': priced')[0]})"
                   for role, model, src in sources if src.startswith("unknown")]
        if unknown:
            raise ConfigError(f"run.max_usd = {cfg.run.max_usd:g}: no price is known for {', '.join(unknown)}; "
                              f"give their prices in a table (cost.prices: YAML or CSV, USD per million tokens)")
    before = prev.get("spend") or {}
    usd = before.get("usd", 0.0) if before else 0.0
    return SpendCap(cfg.run.max_calls, cfg.run.max_usd, table.price, calls=int(before.get("calls") or 0),
                    usd=None if usd is None else float(usd))


def counted_spend(cfg: ExperimentConfig, prev: dict[str, Any], models: dict[str, Any]) -> dict[str, Any]:
    """run.json's ``spend`` from a session's model totals (`Clients.totals`, summed over Ray workers: the Ray
    executor counts what its workers sent, it cannot cap them), added to the earlier sessions'."""
    from memlab.eval.cost import PriceTable

    table = PriceTable.of(cfg.cost.prices)
    before = prev.get("spend") or {}
    usd: float | None = float(before.get("usd") or 0.0) if before.get("usd", 0.0) is not None else None
    for role, r in (models.get("by_role") or {}).items():
        price = table.price(r.get("model"), cfg.models.resolve(role)["api_base"] if role in ROLES else None)
        cost = None if price.source.startswith("unknown") else price.cost(
            r.get("prompt_tokens", 0), r.get("completion_tokens", 0), r.get("cached_tokens", 0))
        usd = None if usd is None or cost is None else usd + cost
    return {"calls": int(before.get("calls") or 0) + int(models.get("model_calls") or 0),
            "usd": None if usd is None else round(usd, 8), "max_calls": None, "max_usd": None, "stopped": None}


def record_stop(info: dict[str, Any], reason: str, resume_cmd: str) -> None:
    """The cap refused a request: the run is ``stopped`` (every finished question kept), and says how to go on."""
    info["status"] = RunStatus.STOPPED.value
    info["stopped"] = reason
    info["resume"] = resume_cmd
    key = "run.max_usd" if "max_usd" in reason else "run.max_calls"
    print(f"\nmemlab: stopped: {reason}; every finished question is kept, nothing is scored. Go on with a raised "
          f"cap:\n  {resume_cmd} --set {key}=...", file=sys.stderr)


def spend_overrides(overrides: dict[str, Any] | list[str] | None) -> bool:
    """Whether a resume's ``--set`` overrides change only the spend cap (allowed without ``--force-config``)."""
    from memlab.run.config import parse_sets

    if not overrides:
        return False
    keys = parse_sets(overrides) if isinstance(overrides, list) else overrides
    return all(k in SPEND_KEYS for k in keys)
