"""An example judge in one file, with a setting: the judge model rates the prediction from 0 to 10, and a rating
of at least ``pass_mark`` is correct.

Importing this module registers it as ``judge.kind: example-rating``; ``judge.params: {pass_mark: 8}`` sets its
setting. ``client`` is the judge role's model client (``judge.model``), given by the run.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from memlab.answer import JUDGES, Judge
from memlab.data import Question
from memlab.llm import Usage
from memlab.params import Range

PROMPT = ("Rate from 0 to 10 how well the prediction answers the question, given the gold answer. Reply with the "
          "number only.\nQuestion: {question}\nGold: {gold}\nPrediction: {prediction}")


def rating(text: str) -> int:
    """The rating in a reply (ValueError when there is none: a judge error, never cached)."""
    m = re.fullmatch(r"\s*(\d{1,2})\s*\.?\s*", text)
    if m is None or int(m.group(1)) > 10:
        raise ValueError(f"not a rating from 0 to 10: {text[:40]!r}")
    return int(m.group(1))


@JUDGES.register("example-rating")
class RatingJudge(Judge):
    name = "example-rating"

    def __init__(self, client: Any, pass_mark: Annotated[int, Range(0, 10)] = 5):
        self.client = client
        self.pass_mark = pass_mark

    def judge(self, question: Question, prediction: str) -> tuple[float | None, Usage, bool]:
        text = PROMPT.format(question=question.question, gold=question.answer, prediction=prediction)
        comp = self.client.complete([{"role": "user", "content": text}], check=lambda c: rating(c.text))
        return float(rating(comp.text) >= self.pass_mark), comp.usage, comp.from_cache
