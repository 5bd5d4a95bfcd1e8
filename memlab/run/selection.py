"""Which data and questions a run answers: the dataset (LoCoMo or LongMemEval, told by its fields), its
scoring profile, then the config's conversations, categories and per-conversation limit."""

from __future__ import annotations

import warnings

from memlab.data import Conversation, LoCoMo, Question, dataset_name
from memlab.run.config import ConfigError, ExperimentConfig

#: The scoring profile a dataset gets when the config keeps the default profile (``locomo``).
DATASET_PROFILES = {"locomo": "locomo", "longmemeval": "longmemeval"}


def profile_for(cfg: ExperimentConfig, data: LoCoMo) -> tuple[ExperimentConfig, str | None]:
    """``cfg`` with a scoring profile made for ``data`` (plus a note when it changed).

    Profiles label and guard one benchmark's category numbers (`ScoringProfile.dataset`): a LongMemEval
    file with the default ``locomo`` profile is scored with ``longmemeval``; any other mismatch is an error.
    """
    from memlab.eval.profiles import get_profile

    name = dataset_name(data)
    prof = get_profile(cfg.scoring.profile)
    if prof.dataset == name:
        return cfg, None
    if prof.name == "locomo":
        note = (f"dataset {data.report.path} is {name}: scoring.profile set to {DATASET_PROFILES[name]!r} "
                f"(the locomo profile labels and guards LoCoMo's category numbers)")
        return cfg.with_overrides({"scoring.profile": DATASET_PROFILES[name]}), note
    raise ConfigError(f"scoring.profile = {prof.name!r} scores {prof.dataset} files, but {data.report.path} is "
                      f"{name}: use scoring.profile={DATASET_PROFILES[name]}")


def run_profile(cfg: ExperimentConfig, data: LoCoMo) -> tuple[ExperimentConfig, list[str]]:
    """`profile_for`, and the notes for run.json (the profile change; a profile's caveat on its metrics), each
    warned: what every executor applies to a loaded dataset."""
    cfg, changed = profile_for(cfg, data)
    from memlab.eval.profiles import get_profile

    notes = [n for n in (changed, getattr(get_profile(cfg.scoring.profile), "note", None)) if n]
    for n in notes:
        warnings.warn(n, stacklevel=3)
    return cfg, notes


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
        if d.per_category is not None:
            qs = per_category(qs, d.per_category, d.sample_seed)
        if d.question_limit is not None:
            qs = qs[: d.question_limit]
        out.extend((conv, q) for q in qs)
    if not out:
        raise ConfigError(f"the config selects no question (conversations {d.conversations}, categories "
                          f"{d.categories}, per_category {d.per_category}, question_limit {d.question_limit})")
    return out


def per_category(questions: list[Question], n: int, seed: int | None = None) -> list[Question]:
    """At most ``n`` questions of each category, in file order: the first ``n``, or (``seed``) a seeded draw,
    each category drawn with its own generator so one category's size never moves another's sample."""
    import numpy as np

    keep: set[str] = set()
    for cat in sorted({q.category for q in questions}):
        group = [q for q in questions if q.category == cat]
        if seed is not None and len(group) > n:
            rng = np.random.default_rng([seed, cat])
            group = [group[i] for i in sorted(rng.choice(len(group), size=n, replace=False))]
        keep.update(q.qid for q in group[:n])
    return [q for q in questions if q.qid in keep]
