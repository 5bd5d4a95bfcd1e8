"""Answering: the offline extractive reader, model-backed arms over litellm, preload and the judge.

Every arm is registered in `ANSWERERS` under its ``answer.arm`` name; a new arm is one new module
with a decorated class, imported here.
"""

from memlab.answer.base import (
    ABSTAIN,
    ANSWERERS,
    JUDGES,
    Answer,
    AnswerContext,
    Answerer,
    QueryTrace,
    preload,
    retrieve,
)
from memlab.answer.extractive import ExtractiveAnswerer
from memlab.answer.llm_arms import Judge, LongContextAnswerer, OptimizedAnswerer, OriginalAnswerer, memory_tools

__all__ = [
    "ABSTAIN", "ANSWERERS", "JUDGES", "Answer", "AnswerContext", "Answerer", "ExtractiveAnswerer", "Judge",
    "LongContextAnswerer", "OptimizedAnswerer", "OriginalAnswerer", "QueryTrace", "memory_tools", "preload",
    "retrieve",
]
