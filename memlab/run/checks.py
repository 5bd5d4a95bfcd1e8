"""Knobs that cannot change a run's answers: said out loud (run.json ``notes`` and a warning), not a flat line."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence

from memlab.answer import ANSWERERS
from memlab.answer.extractive import ExtractiveAnswerer
from memlab.answer.reader_weights import WEIGHTS
from memlab.params import SEP, param_specs, resolved_params
from memlab.run.config import AnswerConfig, ExperimentConfig, RetrievalConfig


def inert_knobs(cfg: ExperimentConfig, recall_ks: Sequence[int] = (), warn: bool = True) -> list[str]:
    """Notes on settings this config's arm ignores and on metrics it cannot measure (each also warned)."""
    notes: list[str] = []
    a, r = cfg.answer, cfg.retrieval
    base_r, base_a = RetrievalConfig(), AnswerConfig()
    arm = ANSWERERS.get(a.name)  # what it reads is declared on the class (`memlab.answer.Answerer`)
    if not arm.uses_retrieval:
        changed = [f"retrieval.{k}" for k in ("top_k", "hybrid", "rrf_k", "dedupe", "kind_fallback",
                                               "participant_boost", "preload", "context_tokens")
                   if getattr(r, k) != getattr(base_r, k)]
        if changed:  # said when a setting the arm ignores was moved off its default (an ablation over it is flat)
            notes.append(f"the {a.name} arm does not search memory: retrieval settings do not change its "
                         f"answers (set here: {', '.join(changed)})")
    elif r.preload != 0 and not arm.uses_preload:
        notes.append(f"retrieval.preload is not used by the {a.name} arm (it reads the retrieved top-k only)")
    unread = [f"answer.{f.name}" for f in dataclasses.fields(a) if f.name not in ("name", "params")
              and f.name not in arm.answer_settings and getattr(a, f.name) != getattr(base_a, f.name)]
    if unread:
        notes.append(f"{', '.join(unread)} {'is' if len(unread) == 1 else 'are'} not read by the {a.name} arm "
                     f"(it reads: {', '.join(f'answer.{k}' for k in arm.answer_settings) or 'no answer.* field'})")
    own = resolved_params(arm, a.params)
    part = next((f"{n}{SEP}" for n, s in param_specs(arm).items() if s.nested is ExtractiveAnswerer), "")
    if own.get(f"{part}scorer") == "learned":  # the extractive reader's, or an arm's offline reader's
        hand = [f"answer.params.{part}{k}" for k in WEIGHTS if own.get(f"{part}{k}") is not None]
        if hand:
            notes.append(f"{', '.join(hand)} {'is' if len(hand) == 1 else 'are'} not read by the learned scorer "
                         f"(answer.params.{part}scorer: learned); set it to weights to score with them")
    above = [k for k in recall_ks if k > r.top_k]
    if above and arm.uses_retrieval:
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
