"""Answering: the offline extractive reader, model-backed arms over litellm and preload (the LLM judge is
`memlab.eval.profiles.ProfileJudge`, registered in `JUDGES` as ``llm``).

Every arm is registered in `ANSWERERS` under its ``answer.name`` name; a new arm is one new module
with a decorated class, imported here.
"""

from memlab.answer.base import (
    ABSTAIN,
    ANSWERERS,
    JUDGES,
    Answer,
    AnswerContext,
    Answerer,
    Judge,
    QueryTrace,
    preload,
    retrieve,
)
from memlab.answer.extractive import ExtractiveAnswerer
from memlab.answer.llm_arms import LongContextAnswerer, OptimizedAnswerer, OriginalAnswerer, memory_tools
from memlab.answer.session_recall import SessionRecallAnswerer

__all__ = [
    "ABSTAIN", "ANSWERERS", "JUDGES", "Answer", "AnswerContext", "Answerer", "ExtractiveAnswerer", "Judge",
    "LongContextAnswerer", "OptimizedAnswerer", "OriginalAnswerer", "QueryTrace", "SessionRecallAnswerer",
    "memory_tools", "preload", "retrieve",
]
