"""Rescore a finished run under another scoring profile, without model calls (``memlab rescore``).

F1 and BLEU-1 are recomputed from the stored predictions. J is read from the response cache the
run wrote (``results/.cache/responses.sqlite``): with the ``locomo`` profile the judge request is
the one the run sent, so every verdict is there; another profile's judge prompt was usually never
sent, and then J is left empty and the miss counted, unless ``allow_model_calls`` lets the judge
model be called. The result is written next to the run's files as ``summary-<profile>.csv``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from memlab.answer import JUDGES
from memlab.atomic import write_table
from memlab.eval import category_summary
from memlab.eval.errata import Errata, errata_columns, errata_counts, load_errata
from memlab.eval.profiles import PROFILES, ProfileError, ProfileJudge, ScoringProfile, apply_scoring, get_profile
from memlab.llm import BadReply, ModelClient
from memlab.run.answering import read_log
from memlab.run.clients import Clients
from memlab.run.results import Run, load_run, score_records
from memlab.run.trust import check_trust


class CacheMissError(RuntimeError):
    """A judge verdict is not in the response cache and model calls are not allowed."""


class _CacheOnlyClient(ModelClient):
    """A `ModelClient` that answers from the response cache only."""

    def _call(self, payload: dict[str, Any], messages: list[dict[str, Any]]) -> Any:
        raise CacheMissError(f"{self.model}: request not in the response cache {self.cache_path}")


@dataclass
class Rescored:
    profile: str
    scores: pd.DataFrame
    """One row per question: the profile's f1, bleu1, j and ``scored``."""
    summary: pd.DataFrame
    info: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None


def _judge_client(run: Run, allow_model_calls: bool) -> ModelClient | None:
    cfg = run.config
    if not cfg.judge.model:
        return None
    cache = run.run_dir.parent / ".cache" / "responses.sqlite"
    ep = Clients(cfg, cache).endpoint("judge")  # the run's judge endpoint (models.judge over models)
    cls = ModelClient if allow_model_calls else _CacheOnlyClient
    return cls(cfg.judge.model, cache_path=cache, **ep)


def rescore(run: Run | str | Path, profile: str = "locomo", allow_model_calls: bool = False,
            errata: Errata | str | Path | None = None, write: bool = True, trust_run_config: bool = False,
            what: str = "rescore") -> Rescored:
    """Score a finished run under ``profile``; J from the response cache (see the module doc). The run folder's
    errata file (and, with ``allow_model_calls``, its judge endpoint, key variable and prompt) is used only when
    this user started the run with it, or ``trust_run_config`` (`memlab.run.trust.check_trust`)."""
    r = run if isinstance(run, Run) else load_run(run)
    prof = get_profile(profile)
    check_profile_applies(r, prof)
    own_errata = errata is None and bool(r.config.scoring.errata)
    check_trust(r.run_dir, r.config, {}, trust_run_config, what, used=lambda key: (
        key == "scoring.errata" and own_errata) or (allow_model_calls and key.startswith(("models.judge.", "judge."))))
    pred = score_records(read_log(r.run_dir))  # the log keeps exact strings (the judge request must match)
    if own_errata:
        errata = r.config.scoring.errata
    e = errata if (errata is None or isinstance(errata, Errata)) else load_errata(errata)
    scores = apply_scoring(pred, prof, e)
    info: dict[str, Any] = {"profile": prof.name, "questions": len(scores), "scored": int(scores["scored"].sum()),
                            **errata_counts(scores), "judge": None}
    client = _judge_client(r, allow_model_calls)
    metrics = ["f1", "bleu1", "em"]
    if client is not None:
        kind = r.config.judge.name
        if not issubclass(JUDGES.get(kind), ProfileJudge):
            raise ValueError(f"{r.run_dir}: rescore re-reads the llm judge's verdicts under another profile; this "
                             f"run's judge is judge.name = {kind!r}")
        judge = ProfileJudge.from_config(r.config.judge, lambda role: client, profile=prof)  # the run's settings
        j, misses, failures = [], 0, 0
        for row in scores.to_dict("records"):
            if not row["scored"]:
                j.append(math.nan)
                continue
            answer = None if row["answer"] is None or (isinstance(row["answer"], float) and math.isnan(row["answer"])) \
                else str(row["answer"])
            p = row["prediction"]
            msgs = judge.messages(str(row["question"]), answer, int(row["category"]),
                                  "" if p is None or (isinstance(p, float) and math.isnan(p)) else str(p))
            if msgs is None:
                j.append(math.nan)
                continue
            try:
                j.append(judge.ask(msgs)[0])
            except CacheMissError:
                misses += 1
                j.append(math.nan)
            except BadReply:
                failures += 1
                j.append(math.nan)
        scores["j"] = j
        metrics.append("j")
        info["judge"] = {"model": r.config.judge.model, "prompt": judge.prompt, "cache_misses": misses,
                         "unreadable": failures, "model_calls": client.calls, "from_cache": client.cache_hits}
    summary = category_summary(scores[scores["scored"]], metrics=metrics, labels=prof.labels)
    if prof.excluded_categories:  # "overall 1-5" would silently be the 1-4 figure
        summary = summary.drop(index=["overall 1-5"])
    if e is not None:
        summary = summary.join(errata_columns(scores, summary.index))
    out = Rescored(profile=prof.name, scores=scores, summary=summary, info=info)
    if write:
        out.path = r.run_dir / f"summary-{prof.name}.csv"
        write_table(out.path, summary)
    return out


def explain(res: Rescored) -> str:
    """One line on where J came from (printed by ``memlab rescore``)."""
    j = res.info.get("judge")
    if j is None:
        return "J: none (the run had no judge model)"
    if j["cache_misses"]:
        return (f"J: {j['cache_misses']} of {res.info['scored']} verdicts of the {res.profile} judge prompt are not "
                f"in the response cache, left empty (rerun with --allow-model-calls to ask {j['model']})")
    return f"J: {j['from_cache']} verdicts from the response cache, {j['model_calls']} model calls"


def check_profile_applies(run: Run, prof: ScoringProfile) -> None:
    """Refuse a profile made for another dataset format (`ScoringProfile.dataset`) than the run's: its labels and
    guards are another benchmark's category numbers (LongMemEval's 2 is not LoCoMo's multi-hop)."""
    fmt = run_format(run)
    if prof.dataset != fmt:
        raise ProfileError(f"{run.run_dir}: scoring profile {prof.name!r} scores {prof.dataset} runs; this run is "
                           f"{fmt} (profiles for it: {', '.join(profiles_for(fmt))})")


def run_format(run: Run) -> str:
    """The dataset format a run answered (run.json; an older run's: its scoring profile's)."""
    return str(run.info.get("dataset_format") or get_profile(run.config.scoring.profile).dataset)


def profiles_for(fmt: str) -> list[str]:
    """The scoring profiles made for a dataset format."""
    return [n for n, p in PROFILES.items() if p.dataset == fmt]


def profile_table(run: Run | str | Path, profiles: Sequence[str] | None = None, allow_model_calls: bool = False,
                  trust_run_config: bool = False) -> pd.DataFrame:
    """One run under several profiles side by side (default: every profile made for its dataset format): rows are
    category numbers and the overall groups, columns (profile, label / n / f1 / bleu1 / j). Labels differ by
    profile; numbers are the dataset's."""
    r = run if isinstance(run, Run) else load_run(run)
    profiles = profiles_for(run_format(r)) if profiles is None else list(profiles)
    frames = {}
    for p in profiles:
        res = rescore(r, p, allow_model_calls=allow_model_calls, write=False, trust_run_config=trust_run_config,
                      what="report")
        cols = [c for c in ("label", "n", "f1", "bleu1", "j") if c in res.summary.columns]
        frames[p] = res.summary[cols]
    out = pd.concat(frames, axis=1)
    for p in profiles:  # a profile that skips a category leaves its n empty, not a float
        out[(p, "n")] = out[(p, "n")].astype("Int64")
    return out
