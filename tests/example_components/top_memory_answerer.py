"""An example answer arm in one file: answers with the top retrieved memory's text, verbatim.

Importing this module registers it as ``answer.arm: example-top-memory``.
"""

from __future__ import annotations

from memlab.answer import ABSTAIN, ANSWERERS, Answer, AnswerContext, Answerer, retrieve
from memlab.data import Question


@ANSWERERS.register("example-top-memory")
class TopMemoryAnswerer(Answerer):
    name = "example-top-memory"

    def answer(self, question: Question, ctx: AnswerContext) -> Answer:
        res, trace = retrieve(ctx, question.question)
        text = res.entries[0].text if res.entries else ABSTAIN
        return Answer(prediction=text, context=res.entries[:1], queries=[trace], rule="top memory")
