"""Scoring profiles: the same predictions scored the way each published LoCoMo harness scores them.

Published LoCoMo numbers differ in the scorer as much as in the system. A profile fixes every
choice a harness makes; one class per harness, written from its published definition:

=============== ============================ ============================ ============================
                ``locomo`` (default)         ``mem0``                     ``trpc-agent-go``
=============== ============================ ============================ ============================
tokens          commas dropped, lowercase,   lowercase; ``. , ! ?`` become lowercase; every non-word
                ASCII punctuation removed,   spaces; split on white space character (ASCII ``\\w``)
                a/an/the/and removed,        (no stemming, no stop words) becomes a space; split; a
                Porter-stemmed                                            fixed stop-word list removed
F1              multiset; category 1 split   **set** of tokens            multiset; both empty = 1
                on commas (mean of best F1
                per gold part); category 3
                gold cut at ``;``
BLEU-1          clipped unigram precision    nltk ``sentence_bleu`` with  clipped unigram precision x
                x brevity penalty on the     weights (1,0,0,0), smoothing brevity penalty on the
                normalised tokens            method1, on word tokens      profile's tokens
category 5      1 if the prediction says     not scored (excluded from    scored like the others
                "not mentioned" / "no        every mean)                  against "The information is
                information available"                                    not available." (its gold)
judge           memlab's CORRECT/WRONG       JSON ``label`` CORRECT       JSON ``correct`` (a boolean)
                prompt (``judge.prompt``):   -> 1, WRONG -> 0             and ``confidence``: a
                one plain verdict word                                    correct answer scores its
                                                                          confidence
labels 1..4     multi-hop, temporal,         single-hop, temporal,        single-hop, multi-hop,
                open-domain, single-hop      multi-hop, open-domain       temporal, open-domain
=============== ============================ ============================ ============================

A label mapping is always applied to category *numbers* (as stored in the dataset), never to
another profile's labels; `check_categories` guards it (LoCoMo-10 has 282/321/96/841/446
questions in categories 1-5). The mem0 BLEU tokenises words with nltk's Treebank word tokenizer
after splitting sentences at ``. ! ?`` plus white space (nltk's ``word_tokenize`` needs the punkt
model, which is not shipped offline); answers are short, so this matches it on LoCoMo's answers.
Where a harness quietly scores a failed judge call as 0 (trpc-agent-go), memlab leaves J empty and
counts the failure instead. Verdicts are read strictly, by one rule per profile (`ScoringProfile.judge_score`,
the only verdict rule; `ProfileJudge` is the registered ``llm`` judge): a JSON label where the prompt asks
for one, else one word-bounded CORRECT or WRONG; a negated or hedged verdict ("NOT CORRECT", "partially
correct"), both words, neither, or an unknown label is unreadable — a ``judge_error``, never a score and
never cached. (trpc-agent-go's harness scores an unreadable reply 0.5 when it says "correct" or "true";
memlab does not.)
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import pandas as pd

from memlab.answer.base import ABSTAIN, JUDGES, Judge
from memlab.data.locomo import CATEGORY_LABELS, Question
from memlab.data.longmemeval import (
    ABSTENTION,
    LONGMEMEVAL_LABELS,
    PUBLISHED_ABSTENTION,
    PUBLISHED_TYPE_COUNTS,
    TYPE_CATEGORY,
)
from memlab.eval import scoring
from memlab.eval.errata import INVALID, Errata, apply_errata
from memlab.eval.summary import score_frame
from memlab.llm import Usage
from memlab.prompts import load_prompt, render

#: Questions per category number on the full LoCoMo-10 (the guard's reference).
LOCOMO10_CATEGORY_COUNTS: dict[int, int] = {1: 282, 2: 321, 3: 96, 4: 841, 5: 446}
#: Upper bounds per LongMemEval category number (a published file's questions of each type; abstention
#: questions are counted in their type there, so a category's count is at most its type's). Their sum
#: (530) is never a file's size, so the guard always checks bounds, never exact counts.
LONGMEMEVAL_CATEGORY_BOUNDS: dict[int, int] = {
    **{TYPE_CATEGORY[t]: n for t, n in PUBLISHED_TYPE_COUNTS.items()}, ABSTENTION: PUBLISHED_ABSTENTION}


class ProfileError(ValueError):
    """An unknown profile, or a category column a label mapping cannot be applied to."""


class ScoringProfile:
    """How one harness turns (prediction, gold, category) into F1, BLEU-1 and a judge score."""

    name: ClassVar[str] = ""
    labels: ClassVar[dict[int, str]] = {}
    judge_prompt: ClassVar[str] = "default"
    excluded_categories: ClassVar[tuple[int, ...]] = ()
    source: ClassVar[str] = ""
    dataset: ClassVar[str] = "locomo"
    """The benchmark whose category numbers ``labels`` names (`memlab.data.dataset_name`)."""
    category_counts: ClassVar[Mapping[int, int]] = LOCOMO10_CATEGORY_COUNTS
    """What `check_categories` guards the category column with."""

    def f1(self, prediction: str, answer: str | None, category: int) -> float:
        raise NotImplementedError

    def bleu1(self, prediction: str, answer: str | None, category: int) -> float:
        raise NotImplementedError

    def judge_gold(self, answer: str | None, category: int) -> str | None:
        """The gold answer the judge is shown (None: the harness does not judge this category)."""
        if category in self.excluded_categories:
            return None
        return str(answer) if answer is not None else ABSTAIN

    def judge_score(self, text: str) -> float:
        """The J score of one judge reply (raises ValueError when the reply cannot be read)."""
        raise NotImplementedError

    def judge_prompt_for(self, category: int, prompt: str | None = None) -> str:
        """The judge prompt a category is judged with (one prompt for all, unless the harness has several)."""
        return prompt or self.judge_prompt

    def judge_messages(self, question: str, gold: str, prediction: str, prompt: str | None = None
                       ) -> list[dict[str, Any]]:
        text = render(load_prompt("judge", prompt or self.judge_prompt), question=question, gold=gold,
                      prediction=prediction)
        return [{"role": "user", "content": text}]

    def scored(self, category: int) -> bool:
        return category not in self.excluded_categories

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


# ----------------------------------------------------------------------------- verdict rules
_VERDICT = re.compile(r"\b(CORRECT|WRONG|INCORRECT)\b")
_WORD = re.compile(r"[A-Z']+")
#: Words that, among the three before a verdict word, negate or hedge it ("NOT CORRECT", "PARTLY CORRECT").
_QUALIFIERS = frozenset("""NOT NO NEVER NOR NEITHER HARDLY BARELY PARTIALLY PARTLY MOSTLY SOMEWHAT LARGELY NEARLY
ALMOST MAYBE POSSIBLY PROBABLY ARGUABLY HALF SEMI""".split())
VERDICTS = {"CORRECT": 1.0, "WRONG": 0.0, "INCORRECT": 0.0}


def verdict_word(text: str) -> float:
    """1.0 / 0.0 for a reply that gives one plain verdict word, CORRECT or WRONG (INCORRECT), word-bounded.

    Raises ValueError when it gives neither, both, or a verdict negated or hedged by one of the three words
    before it ("The generated answer is NOT CORRECT.", "isn't correct", "partially correct")."""
    up = (text or "").upper().replace("\u2019", "'")
    found = set()
    for m in _VERDICT.finditer(up):
        before = _WORD.findall(up[:m.start()])[-3:]
        if any(w in _QUALIFIERS or w.endswith("N'T") for w in before):
            raise ValueError(f"judge reply {text[:80]!r} negates or hedges its verdict "
                             f"({' '.join([*before, m.group(1)])!r}); expected one plain CORRECT or WRONG")
        found.add(VERDICTS[m.group(1)])
    if len(found) != 1:
        raise ValueError(f"judge reply {text[:80]!r} is not one verdict (CORRECT or WRONG)")
    return found.pop()


def json_object(text: str, what: str) -> dict[str, Any]:
    """The JSON object a judge reply carries (code fences and a sentence around it allowed); ValueError if none."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        raise ValueError(f"{what} judge reply has no JSON object: {text[:120]!r}")
    try:
        obj = json.loads(text[start:end + 1])
    except json.JSONDecodeError as e:
        raise ValueError(f"{what} judge reply's JSON does not parse ({e.msg}): {text[:120]!r}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{what} judge reply's JSON is not an object: {text[:120]!r}")
    return obj


def verdict_label(obj: dict[str, Any], what: str) -> float:
    """The ``label`` of a JSON verdict: exactly CORRECT or WRONG (any case); anything else is ValueError."""
    label = obj.get("label")
    v = label.strip().upper() if isinstance(label, str) else None
    if v not in ("CORRECT", "WRONG"):
        raise ValueError(f"{what} judge reply's label is {label!r}; expected \"CORRECT\" or \"WRONG\"")
    return VERDICTS[v]


# ------------------------------------------------------------------------------------ locomo

class LocomoProfile(ScoringProfile):
    """The official LoCoMo metric (`memlab.eval.scoring`), memlab's default; J from ``judge.prompt``."""

    name = "locomo"
    labels = dict(CATEGORY_LABELS)
    judge_prompt = "default"
    source = "snap-research/locomo task_eval/evaluation.py"

    def f1(self, prediction: str, answer: str | None, category: int) -> float:
        return scoring.score_answer(prediction, answer, category)

    def bleu1(self, prediction: str, answer: str | None, category: int) -> float:
        return scoring.bleu1(prediction, answer, category)

    def judge_score(self, text: str) -> float:
        """memlab's verdict rule: a JSON ``label`` when the reply is a JSON object with one (a prompt file
        that asks for JSON), else one plain word-bounded CORRECT / WRONG (INCORRECT) (`verdict_word`)."""
        if text.strip().lstrip("`").removeprefix("json").strip().startswith("{"):
            return verdict_label(json_object(text, "locomo"), "locomo")
        return verdict_word(text)


# -------------------------------------------------------------------------------------- mem0
_MEM0_SPLIT = re.compile(r"[.,!?]")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def mem0_tokens(text: str) -> list[str]:
    """mem0's tokens: lowercase, the four marks ``. , ! ?`` turned into spaces, split on white space."""
    return _MEM0_SPLIT.sub(" ", str(text).lower()).split()


def _word_tokens(text: str) -> list[str]:
    from nltk.tokenize import NLTKWordTokenizer

    tok = NLTKWordTokenizer()
    return [w for s in _SENTENCE_END.split(text.strip()) if s for w in tok.tokenize(s)]


class Mem0Profile(ScoringProfile):
    """mem0's evaluation (``evaluation/metrics/utils.py``, ``llm_judge.py``, ``evals.py``)."""

    name = "mem0"
    labels = {1: "single-hop", 2: "temporal", 3: "multi-hop", 4: "open-domain", 5: "adversarial"}
    judge_prompt = "mem0"
    excluded_categories = (5,)
    source = "mem0ai/mem0 evaluation/metrics (before the move to memory-benchmarks)"

    def f1(self, prediction: str, answer: str | None, category: int) -> float:
        pred, gold = str(prediction or "").strip(), str(answer or "").strip()
        if not pred or not gold:
            return 0.0
        p, g = set(mem0_tokens(pred)), set(mem0_tokens(gold))
        if not p or not g:
            return 0.0
        common = len(p & g)
        if common == 0:
            return 0.0
        precision, recall = common / len(p), common / len(g)
        return 2 * precision * recall / (precision + recall)

    def bleu1(self, prediction: str, answer: str | None, category: int) -> float:
        from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

        hyp = _word_tokens(str(prediction or "").lower())
        ref = _word_tokens(str(answer or "").lower())
        if not hyp or not ref:
            return 0.0
        return float(sentence_bleu([ref], hyp, weights=(1, 0, 0, 0),
                                   smoothing_function=SmoothingFunction().method1))

    def judge_score(self, text: str) -> float:
        """mem0's prompt asks for JSON: its ``label``, exactly CORRECT or WRONG (mem0 scored any other label 0)."""
        return verdict_label(json_object(text, "mem0"), "mem0")


# ----------------------------------------------------------------------------- trpc-agent-go
TRPC_STOP_WORDS = frozenset("""
a an the is are was were be been being have has had do does did will would could should may might must
shall i you he she it we they me him her us them my your his its our their this that these those and or
but if because as until while of at by for with about against between into through during before after
above below to from up down in out on off over under again further then once
""".split())
_NON_WORD = re.compile(r"[^\w\s]", re.ASCII)
TRPC_ADVERSARIAL_GOLD = "The information is not available."


def trpc_tokens(text: str) -> list[str]:
    """tRPC-Agent-Go's tokens: lowercase, non-word characters (ASCII) to spaces, split, stop words out."""
    return [w for w in _NON_WORD.sub(" ", str(text).lower()).split() if w not in TRPC_STOP_WORDS]


class TrpcAgentGoProfile(ScoringProfile):
    """tRPC-Agent-Go's memory benchmark (``benchmark/memory/.../evaluation/metrics/metrics.go``)."""

    name = "trpc-agent-go"
    labels = {1: "single-hop", 2: "multi-hop", 3: "temporal", 4: "open-domain", 5: "adversarial"}
    judge_prompt = "trpc-agent-go"
    source = "trpc-group/trpc-agent-go benchmark/memory (REPORT.md and metrics.go)"

    @staticmethod
    def gold(answer: str | None, category: int) -> str:
        """Category 5 questions carry no answer: the harness scores them against a fixed refusal."""
        if answer is None or str(answer) == "":
            return TRPC_ADVERSARIAL_GOLD if category == 5 else ""
        return str(answer)

    def f1(self, prediction: str, answer: str | None, category: int) -> float:
        p, g = trpc_tokens(prediction or ""), trpc_tokens(self.gold(answer, category))
        if not p or not g:
            return 1.0 if not p and not g else 0.0
        common = sum((Counter(p) & Counter(g)).values())
        if common == 0:
            return 0.0
        precision, recall = common / len(p), common / len(g)
        return 2 * precision * recall / (precision + recall)

    def bleu1(self, prediction: str, answer: str | None, category: int) -> float:
        p, g = trpc_tokens(prediction or ""), trpc_tokens(self.gold(answer, category))
        if not p:
            return 1.0 if not g else 0.0
        matches = sum((Counter(p) & Counter(g)).values())
        bp = 1.0 if len(p) >= len(g) else math.exp(1 - len(g) / len(p))
        return bp * matches / len(p)

    def judge_gold(self, answer: str | None, category: int) -> str | None:
        return self.gold(answer, category)

    def judge_score(self, text: str) -> float:
        """The prompt asks for JSON: ``correct`` must be a boolean and ``confidence`` (absent: 0, as the Go
        harness's zero value) a number; the harness's fallback for an unreadable reply (0.5 when it says
        "correct" or "true", also for "not correct") is not followed: unreadable is a ValueError."""
        obj = json_object(text, "trpc-agent-go")
        correct, confidence = obj.get("correct"), obj.get("confidence", 0.0)
        if not isinstance(correct, bool):
            raise ValueError(f"trpc-agent-go judge reply's 'correct' is {correct!r}; expected true or false")
        if confidence is None:
            confidence = 0.0
        if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not math.isfinite(confidence):
            raise ValueError(f"trpc-agent-go judge reply's 'confidence' is {confidence!r}; expected a number")
        return min(abs(float(confidence)), 1.0) if correct else 0.0


# ------------------------------------------------------------------------------- longmemeval
_YES_NO = re.compile(r"[\s\"'`*.!]*(yes|no)[\s\"'`*.!]*", re.IGNORECASE)


def parse_yes_no(text: str) -> bool:
    """A LongMemEval judge verdict read strictly: the reply is ``yes`` or ``no`` (any case, with quotes,
    stars or a full stop around it) and nothing else; anything else is a ValueError, so an unreadable
    reply is a judge error, never a verdict. (The official script counts any reply containing "yes".)"""
    m = _YES_NO.fullmatch(text or "")
    if m is None:
        raise ValueError(f"judge reply {str(text)[:80]!r} is not one verdict (yes or no)")
    return m.group(1).lower() == "yes"


class LongMemEvalProfile(ScoringProfile):
    """LongMemEval's QA evaluation (``src/evaluation/evaluate_qa.py``): J (accuracy) is the official metric.

    Each question type has its own judge prompt (``memlab/prompts/judge/longmemeval-*.md``): temporal
    reasoning forgives off-by-one day counts, knowledge update accepts an answer that also names the old
    value, preference questions are judged against a rubric, abstention questions (category 5) by whether
    the response declines. F1 / BLEU-1 / EM are memlab's offline stand-ins, **not the official metric**:
    token F1 on LoCoMo's normalised tokens (no multi-hop comma split, no ``;`` cut) and, for abstention,
    LoCoMo's abstention-phrase rule.
    """

    name = "longmemeval"
    labels = dict(LONGMEMEVAL_LABELS)
    judge_prompt = "longmemeval-default"
    source = "xiaowu0162/LongMemEval src/evaluation/evaluate_qa.py"
    dataset = "longmemeval"
    category_counts = LONGMEMEVAL_CATEGORY_BOUNDS
    official_metric = "j"
    note = "F1, BLEU-1 and EM are not the official LongMemEval metric (that is J, the judge's accuracy)"
    PROMPTS: ClassVar[dict[int, str]] = {3: "longmemeval-preference", 5: "longmemeval-abstention",
                                         6: "longmemeval-knowledge-update", 7: "longmemeval-temporal-reasoning"}

    def f1(self, prediction: str, answer: str | None, category: int) -> float:
        if category == ABSTENTION:
            return float(scoring.is_abstention(str(prediction or "")))
        return scoring.token_f1(str(prediction or ""), str(answer or ""))

    def bleu1(self, prediction: str, answer: str | None, category: int) -> float:
        return scoring.bleu1(prediction, answer, ABSTENTION if category == ABSTENTION else 2)  # 2: no ';' cut

    def judge_prompt_for(self, category: int, prompt: str | None = None) -> str:
        return self.PROMPTS.get(int(category), self.judge_prompt)

    def judge_score(self, text: str) -> float:
        return 1.0 if parse_yes_no(text) else 0.0


# --------------------------------------------------------------------------------- registry
PROFILES: dict[str, type[ScoringProfile]] = {p.name: p for p in (LocomoProfile, Mem0Profile, TrpcAgentGoProfile,
                                                                 LongMemEvalProfile)}


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


def score_predictions(predictions: pd.DataFrame, profile: str | ScoringProfile = "locomo",
                      errata: Errata | None = None) -> pd.DataFrame:
    """Unscored predictions (prediction, answer, category ...) scored under ``profile`` and ``errata``."""
    return apply_scoring(score_frame(apply_errata(predictions, errata).drop(columns=["errata"])), profile, errata)


@JUDGES.register("llm")
class ProfileJudge(Judge):
    """The LLM judge (``judge.kind: llm``) as the run's scoring profile defines it: prompt, gold shown,
    and the profile's one verdict rule (`ScoringProfile.judge_score`). An unreadable verdict raises
    `memlab.llm.BadReply` (the question's ``judge_error``) and is never cached, so a rerun asks again.
    """

    @classmethod
    def from_config(cls, section: Any, client_for: Callable[[str], Any], profile: str | ScoringProfile = "locomo"
                    ) -> ProfileJudge:
        return cls(client_for("judge"), profile, section.prompt, repeats=getattr(section, "repeats", 1),
                   temperature=getattr(section, "temperature", None))

    def __init__(self, client: Any, profile: str | ScoringProfile = "locomo", prompt: str | None = None,
                 errata: Errata | None = None, repeats: int = 1, temperature: float | None = None):
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
        answer = question.answer
        if self.errata is not None and question.qid in self.errata.entries:
            answer = self.errata.entries[question.qid]
            if answer is None:
                return None, Usage(), False
        msgs = self.messages(question.question, answer, question.category, prediction)
        if msgs is None:
            return None, Usage(), False
        score, comp = self.ask(msgs, repeat)
        return score, comp.usage, comp.from_cache

    def ask(self, msgs: list[dict[str, Any]], repeat: int = 0) -> tuple[float, Any]:
        """One verdict on a judge request and its completion; an unreadable reply raises `memlab.llm.BadReply`
        before it reaches the response cache (a cached one is dropped and asked again)."""
        params = {} if self.temperature is None else {"temperature": self.temperature}
        comp = self.client.complete(msgs, cache_tag=f"judge-repeat-{repeat}" if repeat else None,
                                    check=lambda c: self.profile.judge_score(c.text), **params)
        return self.profile.judge_score(comp.text), comp

    def judge_repeats(self, question: Question, prediction: str) -> tuple[list[float] | None, Usage]:
        """``repeats`` verdicts (J of the question = their mean; None: not judged) and their summed usage."""
        verdicts: list[float] = []
        usage = Usage()
        for r in range(self.repeats):
            v, u, _ = self.judge(question, prediction, repeat=r)
            if v is None:
                return None, usage
            verdicts.append(v)
            usage = usage + u
        return verdicts, usage
