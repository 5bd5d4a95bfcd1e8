"""Which questions a run answers: the config's conversations, categories and per-conversation limit."""

from __future__ import annotations

from memlab.data import Conversation, LoCoMo, Question
from memlab.run.config import ConfigError, ExperimentConfig


def select_questions(cfg: ExperimentConfig, data: LoCoMo) -> list[tuple[Conversation, Question]]:
    """(conversation, question) pairs in file order; an unknown conversation id is a config error."""
    d = cfg.dataset
    known = {c.sample_id for c in data}
    if d.conversations:
        bad = [c for c in d.conversations if c not in known]
        if bad:
            raise ConfigError(f"dataset.conversations: unknown {bad}; known: {sorted(known)}")
    out = []
    for conv in data:
        if d.conversations and conv.sample_id not in d.conversations:
            continue
        qs = [q for q in conv.questions if not d.categories or q.category in d.categories]
        if d.question_limit is not None:
            qs = qs[: d.question_limit]
        out.extend((conv, q) for q in qs)
    if not out:
        raise ConfigError(f"the config selects no question (conversations {d.conversations}, categories "
                          f"{d.categories}, question_limit {d.question_limit})")
    return out
