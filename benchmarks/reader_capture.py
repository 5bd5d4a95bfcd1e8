"""Step 1 of ``benchmarks/fit_reader.py``: retrieve once, each question's context at every k kept in a pickle."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

from memlab.answer.base import ABSTAIN, Answer, AnswerContext, Answerer, retrieve, retrieve_citing
from memlab.data.locomo import Question


class _Capture(Answerer):
    """Stores each question's retrieved context at every k (answers nothing: abstains)."""

    name = "capture"

    def __init__(self, ks: list[int], citing: bool = False):
        self.ks = ks
        self.citing = citing
        self.store: list[dict[str, Any]] = []

    def answer(self, question: Question, ctx: AnswerContext) -> Answer:
        per_k = {}
        for k in self.ks:
            if self.citing:  # the reader's context as it reads it
                per_k[k] = retrieve_citing(ctx, question.question, max_results=k)[0]
            else:
                res, _ = retrieve(ctx, question.question, max_results=k)
                per_k[k] = [(h.rank, h.entry) for h in res.hits]
        self.store.append({"qid": question.qid, "conversation_id": question.conversation_id,
                           "category": question.category, "question": question.question, "answer": question.answer,
                           "speakers": tuple(ctx.conversation.speakers), "contexts": per_k})
        return Answer(prediction=ABSTAIN)


def capture_tag(overrides: dict[str, Any] | None, config: str) -> tuple[Any, str]:
    """The capture's config (one answering process: forked workers, `memlab.run.forked`, would fill their own
    copies of the store) and its cache tag: the overrides, and ``citing`` where its reader reads the notes citing
    each turn (``answer.params.context_citing``, set by the config or an override)."""
    from memlab.run import ExperimentConfig

    cfg = ExperimentConfig.from_yaml(config).with_overrides({**(overrides or {}), "run.threads": 1})
    tag = "-".join(f"{k}={v}" for k, v in sorted((overrides or {}).items())).replace("/", "_")
    citing = bool(cfg.answer.params.get("context_citing", False)) and "context_citing" not in tag
    return cfg, "-".join(t for t in (tag, "citing" if citing else "") if t)


def capture(ks: list[int], cache: Path, overrides: dict[str, Any] | None = None,
            config: str = "offline") -> list[dict[str, Any]]:
    """Each question's context at every k under ``config`` (``overrides``: config keys, e.g. the dataset);
    cached in ``cache`` by the config, the k's and the tag (`capture_tag`)."""
    from memlab.run import run_experiment

    cfg, tag = capture_tag(overrides, config)
    name = "" if config == "offline" else f"{config}-"
    path = cache / f"contexts-{name}k{'-'.join(map(str, ks))}{'-' + tag if tag else ''}.pkl"
    if path.is_file():
        with open(path, "rb") as f:
            return pickle.load(f)
    cap = _Capture(ks, bool(cfg.answer.params.get("context_citing", False)))
    run_experiment(cfg, results=cache / "runs", progress=False, answerer=cap)
    if not cap.store:
        raise RuntimeError(f"capture: the run answered no question into the capture store ({cfg.name})")
    cache.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        pickle.dump(cap.store, f)
    return cap.store
