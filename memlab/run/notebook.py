"""Helpers the notebooks share, so each notebook stays a few calls into the package."""

from __future__ import annotations

from typing import Any

from memlab.run.config import ExperimentConfig


def subset(cfg: ExperimentConfig | str, conversations: list[str] | None = None, question_limit: int | None = None,
           answer_model: str | None = None, api_base: str | None = None, **overrides: Any) -> ExperimentConfig:
    """A config restricted to some conversations / questions, optionally answered by a real model.

    ``cfg`` is a config or a name under ``configs/``. ``None`` leaves a setting as the config has it, except
    ``conversations`` and ``question_limit`` (None = all). With ``answer_model`` (any litellm model name) the
    arm becomes ``original`` with that model; ``api_base`` points model names at a local OpenAI-compatible
    server. Further dotted-key ``overrides`` (``{"retrieval.top_k": 20}``) may be given as keywords with
    ``__`` for the dots (``retrieval__top_k=20``).
    """
    base = cfg if isinstance(cfg, ExperimentConfig) else ExperimentConfig.from_yaml(cfg)
    over: dict[str, Any] = {"dataset.conversations": conversations, "dataset.question_limit": question_limit}
    if api_base is not None:
        over["models.api_base"] = api_base
    if answer_model:
        over.update({"answer.name": "original", "answer.model": answer_model})
    over.update({k.replace("__", "."): v for k, v in overrides.items()})
    return base.with_overrides(over)
