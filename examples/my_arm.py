"""Your own answer arm, in one file: answer with the retrieved sentence that shares the most words with the
question, or abstain when none shares ``min_overlap`` words.

An arm gets the question and an `AnswerContext` (the memory service, the user key, the run's search options)
and returns an `Answer`: the prediction plus what it read (``context``, which recall and attribution score) and
its searches (``queries``, the retrieval trace). Registered under a name, it is ``answer.name`` in a config and
its settings are ``answer.params``. Run it from the repository root:

    python examples/my_arm.py

It runs offline, in seconds, on the tiny LoCoMo-format file beside it (``examples/data/tiny_locomo.json``).
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Annotated

from memlab.answer import ABSTAIN, ANSWERERS, Answer, AnswerContext, Answerer, retrieve
from memlab.data import Question
from memlab.index.text import analyze
from memlab.params import Range
from memlab.run import ExperimentConfig, run_experiment

DATA = Path(__file__).resolve().parent / "data" / "tiny_locomo.json"


# --8<-- [start:arm]
@ANSWERERS.register("my-best-sentence")
class BestSentence(Answerer):
    """The retrieved sentence with the most question words (stemmed, stop words out); ABSTAIN below the bar."""

    name = "my-best-sentence"

    def __init__(self, min_overlap: Annotated[int, Range(1, 20)] = 2):
        self.min_overlap = min_overlap

    def answer(self, question: Question, ctx: AnswerContext) -> Answer:
        res, trace = retrieve(ctx, question.question)  # one search with the run's options (retrieval.top_k ...)
        asked = set(analyze(question.question))
        best, best_overlap = ABSTAIN, 0
        for entry in res.entries:  # best rank first: a tie keeps the higher-ranked memory
            for sentence in re.split(r"(?<=[.!?])\s+", entry.text):
                overlap = len(asked & set(analyze(sentence)))
                if overlap > best_overlap:
                    best, best_overlap = sentence, overlap
        if best_overlap < self.min_overlap:
            best = ABSTAIN
        return Answer(prediction=best, context=list(res.entries), queries=[trace],
                      rule=f"best sentence, {best_overlap} shared word(s)")

# --8<-- [end:arm]

def main() -> None:
    cfg = ExperimentConfig.from_dict({
        "name": "my-arm", "dataset": {"path": str(DATA)}, "extraction": {"name": "turns"},
        "retrieval": {"top_k": 5}, "answer": {"name": "my-best-sentence", "params": {"min_overlap": 2}},
    })
    with tempfile.TemporaryDirectory() as results:
        run = run_experiment(cfg, results=results, progress=False)
        row = run.summary.loc["overall 1-5"]
        print(f"{cfg.answer.name} (min_overlap 2, top-5): F1 {row['f1']:.3f} [{row['f1_lo']:.3f}, "
              f"{row['f1_hi']:.3f}], n {int(row['n'])}")
        first = run.predictions.iloc[0]
        print(f"  {first['qid']}: {first['question']!r} -> {first['prediction']!r}")


if __name__ == "__main__":
    main()
