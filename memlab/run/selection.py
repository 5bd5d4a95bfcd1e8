"""Which data and questions a run answers: the dataset (LoCoMo or LongMemEval, told by its fields), its
scoring profile, then the config's conversations, categories and per-conversation limit."""

from __future__ import annotations

import warnings

from memlab.data import Conversation, LoCoMo, Question, dataset_name, load_dataset
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


def load_run_data(cfg: ExperimentConfig) -> tuple[ExperimentConfig, LoCoMo, list[str]]:
    """The run's dataset (LoCoMo or LongMemEval, told by its fields), its config with the dataset's scoring
    profile, and notes for run.json (the profile change; a profile's caveat on its metrics), each warned."""
    data = load_dataset(cfg.dataset.path)
    cfg, changed = profile_for(cfg, data)
    from memlab.eval.profiles import get_profile

    notes = [n for n in (changed, getattr(get_profile(cfg.scoring.profile), "note", None)) if n]
    for n in notes:
        warnings.warn(n, stacklevel=2)
    return cfg, data, notes


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
