"""An example answer arm in one file, with a setting: answers with the retrieved memory at ``rank``, verbatim.

Importing this module registers it as ``answer.arm: example-top-memory``; ``answer.params: {rank: 2}`` sets
its setting.
"""

from __future__ import annotations

from typing import Annotated

from memlab.answer import ABSTAIN, ANSWERERS, Answer, AnswerContext, Answerer, retrieve
from memlab.data import Question
from memlab.params import Range


@ANSWERERS.register("example-top-memory")
class TopMemoryAnswerer(Answerer):
    name = "example-top-memory"

    def __init__(self, rank: Annotated[int, Range(1, 100)] = 1):
        self.rank = rank

    def answer(self, question: Question, ctx: AnswerContext) -> Answer:
        res, trace = retrieve(ctx, question.question)
        picked = res.entries[self.rank - 1:self.rank]
        text = picked[0].text if picked else ABSTAIN
        return Answer(prediction=text, context=picked, queries=[trace], rule=f"memory at rank {self.rank}")
