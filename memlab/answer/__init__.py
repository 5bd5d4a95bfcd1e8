"""Answering: the offline extractive reader, model-backed arms over litellm, preload and the judge."""

from memlab.answer.base import ABSTAIN, Answer, AnswerContext, Answerer, QueryTrace, preload, retrieve
from memlab.answer.extractive import ExtractiveAnswerer
from memlab.answer.llm_arms import Judge, LongContextAnswerer, OptimizedAnswerer, OriginalAnswerer, memory_tools

ARMS = ("extractive", "long-context", "original", "optimized")

__all__ = [
    "ABSTAIN", "ARMS", "Answer", "AnswerContext", "Answerer", "ExtractiveAnswerer", "Judge", "LongContextAnswerer",
    "OptimizedAnswerer", "OriginalAnswerer", "QueryTrace", "memory_tools", "preload", "retrieve",
]
