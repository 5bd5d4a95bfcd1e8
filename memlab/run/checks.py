"""Knobs that cannot change a run's answers: said out loud (run.json ``notes`` and a warning), not a flat line."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

from memlab.answer.reader_weights import WEIGHTS
from memlab.run.config import AnswerConfig, ExperimentConfig, RetrievalConfig


def inert_knobs(cfg: ExperimentConfig, recall_ks: Sequence[int] = (), warn: bool = True) -> list[str]:
    """Notes on settings this config's arm ignores and on metrics it cannot measure (each also warned)."""
    notes: list[str] = []
    a, r = cfg.answer, cfg.retrieval
    base_r, base_a = RetrievalConfig(), AnswerConfig()
    if a.arm == "long-context":
        changed = [f"retrieval.{k}" for k in ("top_k", "hybrid", "rrf_k", "dedupe", "kind_fallback",
                                               "participant_boost", "preload")
                   if getattr(r, k) != getattr(base_r, k)]
        if changed:  # said when a setting the arm ignores was moved off its default (an ablation over it is flat)
            notes.append("the long-context arm reads the whole transcript: retrieval settings do not change its "
                         f"answers (set here: {', '.join(changed)})")
    if a.arm != "extractive":
        # the reader weights also steer session-recall's offline read
        knobs = ("span", "abstain") + (() if a.arm == "session-recall" else tuple(WEIGHTS))
        changed = [f"answer.{k}" for k in knobs if getattr(a, k) != getattr(base_a, k)]
        if changed:
            notes.append(f"{', '.join(changed)} only apply to the extractive arm, not {a.arm!r}")
    else:
        if r.preload != 0:
            notes.append("retrieval.preload is not used by the extractive arm (it reads the retrieved top-k only)")
        if a.model or a.prompt:
            notes.append("answer.model / answer.prompt are not used by the extractive arm (no model)")
    above = [k for k in recall_ks if k > r.top_k]
    if above and a.arm != "long-context":
        notes.append(f"recall@{'/'.join(map(str, above))} not reported: above retrieval.top_k = {r.top_k} "
                     "(nothing past the top-k is retrieved, so it would repeat recall@top_k)")
    if cfg.judge.model and cfg.judge.repeats > 1 and cfg.judge.temperature == 0:
        notes.append(f"judge.repeats = {cfg.judge.repeats} at judge.temperature = 0: repeats only measure the "
                     "server's nondeterminism (raise the temperature to sample the judge)")
    if warn:
        for n in notes:
            if not n.startswith("recall@"):  # a metric left out is recorded, not warned every run
                warnings.warn(f"{cfg.name}: {n}", stacklevel=2)
    return notes
