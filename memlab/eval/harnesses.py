"""Scoring profiles, one class per published LoCoMo harness, written from its published definition.

Published LoCoMo numbers differ in the scorer as much as in the system. A profile fixes every
choice a harness makes:

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

The mem0 BLEU tokenises words with nltk's Treebank word tokenizer after splitting sentences at ``. ! ?`` plus
white space (nltk's ``word_tokenize`` needs the punkt model, which is not shipped offline); answers are short,
so this matches it on LoCoMo's answers. Where a harness quietly scores a failed judge call as 0
(trpc-agent-go), memlab leaves J empty and counts the failure instead; verdicts are read by `memlab.eval.verdicts`
(trpc-agent-go's harness scores an unreadable reply 0.5 when it says "correct" or "true"; memlab does not).
`memlab.eval.profiles` chooses a profile by name and applies it to a run's predictions.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping
from typing import Any, ClassVar

from memlab.answer.base import ABSTAIN
from memlab.data.locomo import CATEGORY_LABELS
from memlab.data.longmemeval import (
    ABSTENTION,
    LONGMEMEVAL_LABELS,
    PUBLISHED_ABSTENTION,
    PUBLISHED_TYPE_COUNTS,
    TYPE_CATEGORY,
)
from memlab.eval import scoring
from memlab.eval.verdicts import json_object, official_yes, parse_yes_no, verdict_label, verdict_word
from memlab.prompts import load_prompt, render

#: Questions per category number on the full LoCoMo-10 (the guard's reference).
LOCOMO10_CATEGORY_COUNTS: dict[int, int] = {1: 282, 2: 321, 3: 96, 4: 841, 5: 446}
#: Upper bounds per LongMemEval category number (a published file's questions of each type; abstention
#: questions are counted in their type there, so a category's count is at most its type's). Their sum
#: (530) is never a file's size, so the guard always checks bounds, never exact counts.
LONGMEMEVAL_CATEGORY_BOUNDS: dict[int, int] = {
    **{TYPE_CATEGORY[t]: n for t, n in PUBLISHED_TYPE_COUNTS.items()}, ABSTENTION: PUBLISHED_ABSTENTION}


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
    verdict_schema: ClassVar[dict[str, Any]] = {
        "type": "object", "properties": {"label": {"type": "string", "enum": ["CORRECT", "WRONG"]}},
        "required": ["label"]}
    """The JSON schema a judge reply is held to on an endpoint that constrains replies (``structured_output:
    json_schema``): every reply it admits is one `judge_score` reads."""

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

    #: Where a benchmark's published script reads verdicts differently from memlab's rule, each rule by name
    #: (``strict``, ``official``): the J of one reply under it (ValueError: unreadable under that rule). A run
    #: records its judge's replies and reports J under every rule (`memlab.eval.profiles.judge_rule_columns`).
    judge_rules: ClassVar[dict[str, Any]] = {}
    judge_rule: ClassVar[str | None] = None
    """Which of `judge_rules` this profile's `judge_score` is."""

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

    def cache_id(self) -> str:
        """The harness's name: what a judge's `cache_id` records of the profile it applies."""
        return self.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


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

    verdict_schema: ClassVar[dict[str, Any]] = {
        "type": "object", "properties": {"reason": {"type": "string", "maxLength": 300},
                                         "label": {"type": "string", "enum": ["CORRECT", "WRONG"]}},
        "required": ["reason", "label"]}

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

    verdict_schema: ClassVar[dict[str, Any]] = {
        "type": "object", "properties": {"correct": {"type": "boolean"}, "confidence": {"type": "number"}},
        "required": ["correct", "confidence"]}

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
    #: The reply is the bare word: a JSON string, ``"yes"`` or ``"no"`` with its quotes (`parse_yes_no` reads it).
    verdict_schema: ClassVar[dict[str, Any]] = {"type": "string", "enum": ["yes", "no"]}
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

    judge_rules: ClassVar[dict[str, Any]] = {"strict": lambda text: 1.0 if parse_yes_no(text) else 0.0,
                                             "official": lambda text: 1.0 if official_yes(text) else 0.0}
    judge_rule: ClassVar[str | None] = "strict"

    def judge_score(self, text: str) -> float:
        return self.judge_rules[self.judge_rule](text)


class LongMemEvalOfficialProfile(LongMemEvalProfile):
    """LongMemEval scored exactly as its official script decides a verdict (``official_yes``): any judge reply that
    contains "yes" is correct, every other reply wrong, none unreadable. Prompts, categories and the other
    metrics are `LongMemEvalProfile`'s. The default ``longmemeval`` profile is stricter (the reply must be yes or
    no and nothing else; anything else is a judge error): a run under either records the replies and reports J
    under both rules where they differ (``j_strict``, ``j_official``)."""

    name = "longmemeval-official"
    judge_rule = "official"
