"""Answering: the offline extractive reader, model-backed arms over litellm, preload and the judge."""

from memlab.answer.base import ABSTAIN, Answer, AnswerContext, Answerer, QueryTrace, preload, retrieve
from memlab.answer.extractive import ExtractiveAnswerer
from memlab.answer.llm_arms import Judge, LongContextAnswerer, OptimizedAnswerer, OriginalAnswerer, memory_tools
from memlab.answer.session_recall import SessionRecallAnswerer

ARMS = ("extractive", "long-context", "original", "optimized", "session-recall")

__all__ = [
    "ABSTAIN", "ARMS", "Answer", "AnswerContext", "Answerer", "ExtractiveAnswerer", "Judge", "LongContextAnswerer",
    "OptimizedAnswerer", "OriginalAnswerer", "QueryTrace", "SessionRecallAnswerer", "memory_tools", "preload",
    "retrieve",
]
