"""Building a run's components from its config, through the registries (or taking the user's own).

BEIR-style: ``run_experiment(cfg, extractor=MyExtractor(), answerer=MyAnswerer())`` uses the given
objects instead of the configured names; everything else (caching, traces, scoring) is the same.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memlab.answer import ANSWERERS, JUDGES, Answerer
from memlab.eval.profiles import ProfileJudge
from memlab.extract.extractors import EXTRACTORS, Extractor
from memlab.run.clients import Clients
from memlab.run.config import ExperimentConfig


def build_extractor(cfg: ExperimentConfig, clients: Clients) -> Extractor:
    return EXTRACTORS.get(cfg.extraction.extractor).from_config(cfg.extraction, clients.for_role)


def build_answerer(cfg: ExperimentConfig, clients: Clients) -> Answerer:
    arm = ANSWERERS.get(cfg.answer.arm).from_config(cfg.answer, clients.for_role)
    if hasattr(arm, "use_index"):  # an arm with its own turn index (session-recall): the run's index settings
        ep = clients.endpoint("embedder")
        emb = {"api_base": ep["api_base"], "api_key": ep["api_key"], "timeout": ep["timeout"]} \
            if cfg.index.embedder.startswith("litellm:") else {}
        params = cfg.index.service_params()
        del params["append_citing"]  # its index holds the turns only: nothing cites them
        arm.use_index(**params, turn_style=cfg.extraction.turn_style, embedder_params=emb,
                      embedding_cache=str(Path(clients.cache_path).parent / "embeddings.sqlite"))
    return arm


def build_judge(cfg: ExperimentConfig, clients: Clients) -> Any | None:
    if not cfg.judge.model:
        return None
    if cfg.judge.kind == "llm":  # the scoring profile's judge (locomo: the same request as JUDGES["llm"])
        return ProfileJudge(clients.for_role("judge"), cfg.scoring.profile, cfg.judge.prompt,
                            repeats=cfg.judge.repeats, temperature=cfg.judge.temperature)
    return JUDGES.get(cfg.judge.kind).from_config(cfg.judge, clients.for_role)


def component_label(obj: Any) -> str:
    """How a user-supplied component is named in run.json and the extraction cache key."""
    cache_id = getattr(obj, "cache_id", None)
    return cache_id() if callable(cache_id) else f"{type(obj).__module__}.{type(obj).__qualname__}"
