"""Scoring profiles: the same predictions scored the way each published LoCoMo harness scores them.

A profile (`memlab.eval.harnesses`: ``locomo``, the default, ``mem0``, ``trpc-agent-go``, ``longmemeval``,
``longmemeval-official``; the table there says how each tokenises and scores) is chosen by name (`get_profile`)
and applied to a run's predictions (`apply_scoring`, `score_predictions`) on top of its errata.

A label mapping is always applied to category *numbers* (as stored in the dataset), never to
another profile's labels; `check_categories` guards it (LoCoMo-10 has 282/321/96/841/446
questions in categories 1-5). Verdicts are read strictly, by one rule per profile (`ScoringProfile.judge_score`,
the only verdict rule, built from `memlab.eval.verdicts`; `ProfileJudge` is the registered ``llm`` judge): an
unreadable verdict is a ``judge_error``, never a score and never cached.

Where a benchmark's own script reads verdicts another way (LongMemEval's counts any reply containing "yes"), the
profile names both rules (`ScoringProfile.judge_rules`), the run records every judge reply (``judge_replies``)
and `judge_rule_columns` gives J under each rule (``j_strict``, ``j_official``) beside the profile's own ``j``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from typing import Annotated, Any

import pandas as pd

from memlab.answer.base import JUDGES, Judge
from memlab.data.locomo import Question
from memlab.eval import scoring
from memlab.eval.errata import INVALID, Errata, apply_errata
from memlab.eval.harnesses import (
    LOCOMO10_CATEGORY_COUNTS,
    LONGMEMEVAL_CATEGORY_BOUNDS,
    LocomoProfile,
    LongMemEvalOfficialProfile,
    LongMemEvalProfile,
    Mem0Profile,
    ScoringProfile,
    TrpcAgentGoProfile,
)
from memlab.eval.summary import score_frame
from memlab.eval.verdicts import parse_yes_no
from memlab.llm import BadReply, ModelClient, Usage
from memlab.params import PromptName, Range, Trust

__all__ = ["LOCOMO10_CATEGORY_COUNTS", "LONGMEMEVAL_CATEGORY_BOUNDS", "PROFILES", "LocomoProfile",
           "LongMemEvalOfficialProfile", "LongMemEvalProfile", "Mem0Profile", "ProfileError", "ProfileJudge",
           "ScoringProfile", "TrpcAgentGoProfile", "apply_scoring", "check_categories", "get_profile",
           "judge_rule_columns", "parse_yes_no", "RULE_J", "rule_verdict", "score_predictions"]


class ProfileError(ValueError):
    """An unknown profile, or a category column a label mapping cannot be applied to."""


PROFILES: dict[str, type[ScoringProfile]] = {p.name: p for p in (LocomoProfile, Mem0Profile, TrpcAgentGoProfile,
                                                                 LongMemEvalProfile, LongMemEvalOfficialProfile)}


def get_profile(name: str | ScoringProfile) -> ScoringProfile:
    if isinstance(name, ScoringProfile):
        return name
    if name not in PROFILES:
        raise ProfileError(f"scoring profile {name!r}: unknown; available: {', '.join(PROFILES)}")
    return PROFILES[name]()


def check_categories(categories: pd.Series, reference: Mapping[int, int] = LOCOMO10_CATEGORY_COUNTS,
                     full: bool | None = None) -> None:
    """Refuse to map labels onto numbers that are not LoCoMo's category numbers.

    The column must hold integers 1-5 (numbers, never label strings). On the full dataset (``full``,
    or by default when there are as many questions as ``reference`` counts) the per-category counts
    must equal ``reference``; on a subset every count must be at most the reference's.
    """
    vals = list(categories)
    bad = [v for v in vals if isinstance(v, str) or isinstance(v, bool) or not float(v).is_integer()]
    if bad:
        raise ProfileError(f"category column holds {bad[:3]!r}: a label mapping applies to category numbers "
                           f"1-5 only, never to labels")
    counts = Counter(int(v) for v in vals)
    unknown = sorted(set(counts) - set(reference))
    if unknown:
        raise ProfileError(f"category numbers {unknown} are not categories {sorted(reference)} of the profile's "
                           f"dataset")
    if full is None:
        full = len(vals) == sum(reference.values())
    if full:
        if dict(counts) != dict(reference):
            raise ProfileError(f"category counts {dict(sorted(counts.items()))} differ from LoCoMo-10's "
                               f"{dict(reference)}: the categories are numbered differently, refusing to label them")
    else:
        over = {c: n for c, n in counts.items() if n > reference[c]}
        if over:
            name = "LoCoMo-10's" if dict(reference) == LOCOMO10_CATEGORY_COUNTS else "the published"
            raise ProfileError(f"category counts {over} exceed {name} {dict(reference)}")


def apply_scoring(scored: pd.DataFrame, profile: str | ScoringProfile = "locomo", errata: Errata | None = None
                  ) -> pd.DataFrame:
    """A frame already scored with the official metric, under ``profile`` and ``errata``.

    Corrected gold answers replace the old ones (kept in ``answer_original``); F1 / BLEU-1 / EM are
    recomputed where the answer changed or the profile is not ``locomo``. Adds ``scored`` (False
    for errata-invalid questions, a profile's excluded categories and errored questions, whose
    scores are NaN) and ``profile``. With ``locomo`` and no errata every score is left as it was.
    """
    prof = get_profile(profile)
    check_categories(scored["category"], prof.category_counts)
    out = apply_errata(scored, errata)
    cats = [int(c) for c in out["category"]]
    errored = out["error"].notna().tolist() if "error" in out.columns else [False] * len(out)
    redo = [prof.name != "locomo" or e == "corrected" for e in out["errata"]]
    if any(redo):
        preds = out["prediction"].fillna("").astype(str).tolist()
        answers = [None if (a is None or (isinstance(a, float) and math.isnan(a))) else str(a) for a in out["answer"]]
        for col, fn in (("f1", prof.f1), ("bleu1", prof.bleu1), ("em", scoring.exact_match)):
            out[col] = [fn(p, a, c) if r and prof.scored(c) else v
                        for p, a, c, r, v in zip(preds, answers, cats, redo, out[col])]
    out["scored"] = [e != INVALID and prof.scored(c) and not bad for e, c, bad in zip(out["errata"], cats, errored)]
    for m in ("f1", "bleu1", "em", "j"):
        if m in out.columns:
            out.loc[~out["scored"], m] = math.nan
    out["profile"] = prof.name
    return out


#: The J columns `judge_rule_columns` adds (one per verdict rule a profile may name).
RULE_J = ("j_strict", "j_official")


def rule_verdict(profile: str | ScoringProfile, rule: str, replies: Any, repeats: int = 1) -> float:
    """A question's J under one of the profile's verdict rules, from its recorded judge replies: the mean over the
    ``repeats`` replies; NaN when the judge did not answer every repeat (a failed call) or a reply is unreadable
    under that rule (the strict rule's judge error)."""
    fn = get_profile(profile).judge_rules[rule]
    texts = list(replies) if isinstance(replies, (list, tuple)) or hasattr(replies, "tolist") else []
    if len(texts) != repeats:
        return math.nan
    try:
        return float(sum(fn(str(t)) for t in texts) / repeats)
    except ValueError:
        return math.nan


def judge_rule_columns(scored: pd.DataFrame, profile: str | ScoringProfile, repeats: int = 1) -> pd.DataFrame:
    """``j_<rule>`` per question for each verdict rule of the profile (LongMemEval: ``j_strict``,
    ``j_official``), read from the recorded ``judge_replies`` of an `apply_scoring` frame; questions that are not
    scored or errored are NaN, as ``j`` is. The frame unchanged for a profile with one rule or a run without
    recorded replies."""
    prof = get_profile(profile)
    if not prof.judge_rules or "judge_replies" not in scored.columns:
        return scored
    out = scored.copy()
    ok = out["scored"].astype(bool) if "scored" in out.columns else pd.Series(True, index=out.index)
    if "error" in out.columns:
        ok &= out["error"].isna()
    for rule in prof.judge_rules:
        out[f"j_{rule}"] = [rule_verdict(prof, rule, r, repeats) if good else math.nan
                            for r, good in zip(out["judge_replies"], ok)]
    return out


def score_predictions(predictions: pd.DataFrame, profile: str | ScoringProfile = "locomo",
                      errata: Errata | None = None) -> pd.DataFrame:
    """Unscored predictions (prediction, answer, category ...) scored under ``profile`` and ``errata``."""
    return apply_scoring(score_frame(apply_errata(predictions, errata).drop(columns=["errata"])), profile, errata)


@JUDGES.register("llm")
class ProfileJudge(Judge):
    """The LLM judge (``judge.name: llm``) as the run's scoring profile defines it: prompt, gold shown,
    and the profile's one verdict rule (`ScoringProfile.judge_score`). An unreadable verdict raises
    `memlab.llm.BadReply` (the question's ``judge_error``) and is never cached, so a rerun asks again.
    """

    name = "llm"
    fixed_params = {"profile": "scoring.profile"}  # the run's scoring profile, whose verdict rule it applies

    def __init__(self, client: ModelClient, profile: str | ScoringProfile = "locomo",
                 prompt: Annotated[str | None, PromptName("judge"), Trust.file] = None,
                 errata: Errata | None = None, repeats: Annotated[int, Range(1, None)] = 1,
                 temperature: Annotated[float | None, Range(0, None)] = None):
        if repeats < 1:
            raise ValueError(f"judge repeats: expected an integer >= 1, got {repeats!r}")
        self.client = client
        self.repeats = repeats
        self.temperature = temperature
        """Sent with every judge request when set (the client's default otherwise, 0)."""
        self.profile = get_profile(profile)
        self.prompt = prompt if (prompt and self.profile.name == "locomo") else self.profile.judge_prompt
        self.errata = errata
        """Corrected gold answers are what the judge sees; errata-invalid questions are not judged."""

    def messages(self, question: str, answer: str | None, category: int, prediction: str
                 ) -> list[dict[str, Any]] | None:
        gold = self.profile.judge_gold(answer, category)
        if gold is None:
            return None
        return self.profile.judge_messages(question, gold, prediction,
                                           self.profile.judge_prompt_for(category, self.prompt))

    def judge(self, question: Question, prediction: str, repeat: int = 0) -> tuple[float | None, Usage, bool]:
        """One verdict (None: not judged); repeat ``r`` > 0 is cached under its own key (N repeats, N samples)."""
        score, usage, cached, _ = self._verdict(question, prediction, repeat)
        return score, usage, cached

    def _verdict(self, question: Question, prediction: str, repeat: int) -> tuple[float | None, Usage, bool, str]:
        answer = question.answer
        if self.errata is not None and question.qid in self.errata.entries:
            answer = self.errata.entries[question.qid]
            if answer is None:
                return None, Usage(), False, ""
        msgs = self.messages(question.question, answer, question.category, prediction)
        if msgs is None:
            return None, Usage(), False, ""
        score, comp = self.ask(msgs, repeat)
        return score, comp.usage, comp.from_cache, comp.text

    def ask(self, msgs: list[dict[str, Any]], repeat: int = 0) -> tuple[float, Any]:
        """One verdict on a judge request and its completion; an unreadable reply raises `memlab.llm.BadReply`
        before it reaches the response cache (a cached one is dropped and asked again)."""
        params: dict[str, Any] = {} if self.temperature is None else {"temperature": self.temperature}
        if self.client.structured_output == "json_schema":  # a reply held to what the profile reads
            params["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "verdict", "schema": self.profile.verdict_schema}}
        comp = self.client.complete(msgs, cache_tag=f"judge-repeat-{repeat}" if repeat else None,
                                    check=lambda c: self.profile.judge_score(c.text), **params)
        return self.profile.judge_score(comp.text), comp

    def judge_repeats(self, question: Question, prediction: str) -> tuple[list[float] | None, Usage]:
        """``repeats`` verdicts (J of the question = their mean; None: not judged) and their summed usage."""
        verdicts, usage, _ = self.judge_recorded(question, prediction)
        return verdicts, usage

    def judge_recorded(self, question: Question, prediction: str) -> tuple[list[float] | None, Usage, list[str]]:
        """`judge_repeats` and each repeat's reply text. A reply this profile cannot read raises `BadReply` with
        ``replies``: the texts so far, that one last (a run keeps them: another rule may read it)."""
        verdicts: list[float] = []
        replies: list[str] = []
        usage = Usage()
        for r in range(self.repeats):
            try:
                v, u, _, text = self._verdict(question, prediction, r)
            except BadReply as e:
                e.replies = [*replies, *([e.reply] if e.reply is not None else [])]
                raise
            if v is None:
                return None, usage, []
            verdicts.append(v)
            replies.append(text)
            usage = usage + u
        return verdicts, usage, replies
